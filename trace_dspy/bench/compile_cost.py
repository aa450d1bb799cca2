"""The compile bench: wall time and LM calls of a compile with a cold and then a warm DSPy cache."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import dspy

from trace_dspy.bench.records import count_lm_calls
from trace_dspy.core.tables import markdown_table


def measure_compile(make_config, *, cache_dir: str | Path) -> dict[str, Any]:
    """Wall time and LM calls of a compile with an empty DSPy cache, then of the same compile again.

    ``make_config(run)`` returns the CompileConfig of run 'cold' or 'warm'. The
    second run gets a fresh in-memory cache over the same disk cache, as a new
    process would.
    """
    from trace_dspy.workflows.compiling import run_compile

    previous = dspy.cache
    runs = {}
    try:
        for run in ("cold", "warm"):
            dspy.configure_cache(enable_disk_cache=True, enable_memory_cache=True, disk_cache_dir=str(cache_dir))
            started = time.perf_counter()
            result, calls = count_lm_calls(run_compile, make_config(run))
            runs[run] = {"seconds": time.perf_counter() - started, "lm_calls": calls,
                         "dev_before": result.before["empathy"], "dev_after": result.after["empathy"]}
    finally:
        dspy.cache = previous
    return runs


def compile_markdown(result: dict[str, Any]) -> str:
    return markdown_table(["run", "wall seconds", "LM calls", "dev before", "dev after"],
                          [[f"{name} cache", f"{r['seconds']:.1f}", r["lm_calls"], f"{r['dev_before']:.4f}",
                            f"{r['dev_after']:.4f}"] for name, r in result.items()])
