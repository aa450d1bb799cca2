"""Benchmark library: one module per benchmark behind ``python -m trace_dspy.bench``, gathered here as one API.

- :mod:`trace_dspy.bench.systems`: the systems the quality bench compares;
- :mod:`trace_dspy.bench.quality`: the quality comparison (``run_quality``);
- :mod:`trace_dspy.bench.overhead`: framework time per stage (``measure_overhead``);
- :mod:`trace_dspy.bench.concurrency`: throughput by thread count (``measure_concurrency``);
- :mod:`trace_dspy.bench.compile_cost`: a compile with a cold and a warm cache (``measure_compile``);
- :mod:`trace_dspy.bench.scorer`: the metric's cost per example (``measure_scorer``);
- :mod:`trace_dspy.bench.emotion`: emotion accuracy and the prior's cost (``measure_emotion``);
- :mod:`trace_dspy.bench.latency`: what a person waits for, start-up included (``measure_latency``);
- :mod:`trace_dspy.bench.records`: what they share (LM call counts, millisecond statistics, record numbers).
"""

from __future__ import annotations

from trace_dspy.bench.compile_cost import compile_markdown, measure_compile
from trace_dspy.bench.concurrency import concurrency_markdown, measure_concurrency
from trace_dspy.bench.emotion import (
    PUBLISHED_EMOTION,
    emotion_markdown,
    measure_emotion,
    measure_prior_cost,
)
from trace_dspy.bench.latency import (
    BusyMachine,
    LatencyOptions,
    latency_markdown,
    measure_latency,
)
from trace_dspy.bench.overhead import (
    CLOCKS,
    TimedEngine,
    measure_overhead,
    overhead_markdown,
)
from trace_dspy.bench.quality import (
    PAIRED_METRICS,
    SCORE_KEYS,
    QualityReport,
    log_quality_to_mlflow,
    per_example,
    program_fingerprint,
    quality_charts,
    run_quality,
)
from trace_dspy.bench.records import (
    BENCH_EXPERIMENT,
    count_lm_calls,
    flat_numbers,
    machine,
    ms_stats,
)
from trace_dspy.bench.scorer import measure_scorer, scorer_markdown
from trace_dspy.bench.systems import (
    BASE_SYSTEMS,
    SYSTEM_DESCRIPTIONS,
    SingleCallProgram,
    System,
    build_systems,
    paper_program,
    without_cache,
)

__all__ = [
    "BASE_SYSTEMS", "BENCH_EXPERIMENT", "CLOCKS", "PAIRED_METRICS", "PUBLISHED_EMOTION", "SCORE_KEYS",
    "SYSTEM_DESCRIPTIONS", "BusyMachine", "LatencyOptions", "QualityReport", "SingleCallProgram", "System",
    "TimedEngine", "build_systems", "compile_markdown", "concurrency_markdown", "count_lm_calls",
    "emotion_markdown", "flat_numbers", "latency_markdown", "log_quality_to_mlflow", "machine", "measure_compile",
    "measure_concurrency", "measure_emotion", "measure_latency", "measure_overhead", "measure_prior_cost",
    "measure_scorer", "ms_stats", "overhead_markdown", "paper_program", "per_example", "program_fingerprint",
    "quality_charts", "run_quality", "scorer_markdown", "without_cache",
]
