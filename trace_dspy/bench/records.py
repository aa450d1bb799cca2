"""What every benchmark shares: LM call counts, millisecond statistics, and the record's numbers and machine."""

from __future__ import annotations

import platform
import statistics
from collections.abc import Sequence
from typing import Any

import dspy

BENCH_EXPERIMENT = "trace-dspy-bench"


def count_lm_calls(fn, *args, **kwargs) -> tuple[Any, int]:
    """Run ``fn`` and count the LM calls that reached a model (cache hits excluded), threads included."""
    from dspy.utils.usage_tracker import track_usage

    from trace_dspy.workflows.evaluation import usage_totals

    with track_usage() as tracker:
        result = fn(*args, **kwargs)
    return result, usage_totals(tracker)["lm_calls"]


def ms_stats(values: Sequence[float]) -> dict[str, float]:
    """Mean, median and 95th percentile in milliseconds of ``values`` (seconds), and their count."""
    ordered = sorted(values)
    return {"mean_ms": 1000 * statistics.fmean(ordered), "median_ms": 1000 * statistics.median(ordered),
            "p95_ms": 1000 * ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))], "calls": len(ordered)}



def flat_numbers(data, prefix: str = "") -> dict[str, float]:
    """Every number in a nested result as one flat ``{"a/b/c": value}`` dict (MLflow metric names)."""
    out = {}
    items = data.items() if isinstance(data, dict) else enumerate(data)
    for key, value in items:
        if isinstance(data, list) and isinstance(value, dict) and "threads" in value:
            key = f"threads_{value['threads']}"
        name = f"{prefix}{key}"
        if isinstance(value, (dict, list)):
            out.update(flat_numbers(value, name + "/"))
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out[name.replace(" ", "_")] = float(value)
    return out



def machine() -> dict[str, Any]:
    """The interpreter, platform, CPU count and DSPy version a record was measured on."""
    import os

    return {"python": platform.python_version(), "platform": platform.platform(), "cpus": os.cpu_count(),
            "dspy": dspy.__version__}
