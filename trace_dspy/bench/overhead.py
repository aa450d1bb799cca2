"""The overhead bench: framework time per stage call and per dialogue, with a zero-latency fake LM."""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import dspy
from dspy.utils.callback import BaseCallback

from trace_dspy.bench.records import ms_stats
from trace_dspy.core.console import progress
from trace_dspy.core.tables import markdown_table

# Overhead clocks: wall time, or the calling thread's CPU time, which other
# processes on a shared machine barely disturb.
CLOCKS = {"wall": time.perf_counter, "cpu": time.thread_time}


class TimedEngine:
    """Wraps an engine and adds the seconds spent inside it to a per-thread total."""

    def __init__(self, inner, clock=time.perf_counter):
        self.inner = inner
        self.clock = clock
        self._local = threading.local()

    def elapsed(self) -> float:
        return getattr(self._local, "total", 0.0)

    def complete(self, request):
        started = self.clock()
        try:
            return self.inner.complete(request)
        finally:
            self._local.total = self.elapsed() + self.clock() - started

    def close(self) -> None:
        self.inner.close()


class _StageTimer(BaseCallback):
    """A DSPy callback: time of each stage predictor call, less the engine's time inside it."""

    def __init__(self, names: dict[int, str], engine: TimedEngine):
        super().__init__()
        self.names, self.engine = names, engine
        self.open: dict[str, tuple[str, float, float]] = {}
        self.samples: dict[str, list[float]] = defaultdict(list)

    def on_module_start(self, call_id, instance, inputs):
        name = self.names.get(id(instance))
        if name is not None:
            self.open[call_id] = (name, self.engine.clock(), self.engine.elapsed())

    def on_module_end(self, call_id, outputs, exception=None):
        entry = self.open.pop(call_id, None)
        if entry is not None:
            name, started, engine_before = entry
            spent = self.engine.clock() - started
            self.samples[name].append(spent - (self.engine.elapsed() - engine_before))



def measure_overhead(examples: Sequence[dspy.Example], program, *, warmup: int = 3,
                     clock: str = "wall", trace: bool = False) -> dict[str, Any]:
    """Time spent outside the LM, per stage call and per dialogue, with a zero-latency fake LM.

    ``clock`` is "wall" (elapsed time) or "cpu" (the thread's CPU time). ``trace`` records every
    dialogue as an MLflow trace (stage and LM spans) in a temporary sqlite store, as ``evaluate`` does.
    """
    if trace:
        return _measure_traced(examples, program, warmup=warmup, clock=clock)
    if not examples:
        raise ValueError("no examples")
    if clock not in CLOCKS:
        raise ValueError(f"clock must be one of {', '.join(CLOCKS)}")
    tick = CLOCKS[clock]
    timer, per_dialogue, lm_seconds = _time_dialogues(examples, program, warmup=warmup, tick=tick)
    stage_samples = [v for values in timer.samples.values() for v in values]
    result = {
        "clock": clock,
        "tracing": False,
        "dialogues": len(examples),
        "stage_calls": len(stage_samples),
        "per_stage": {name: ms_stats(values) for name, values in timer.samples.items()},
        "per_stage_call": ms_stats(stage_samples),
        "per_dialogue": ms_stats(per_dialogue),
        "fake_lm_ms_per_call": 1000 * lm_seconds / max(1, len(stage_samples)),
    }
    retriever = getattr(program, "retriever", None)
    if retriever is not None and program.config.retrieval.enabled:
        searches = []
        for ex in examples:
            started = tick()
            # each dialogue filters on its own (gold) emotion group, as the program does with the predicted one
            retriever.search(ex.dialogue, emotion=str(ex.get("emotion") or ""), k=program.config.retrieval.k)
            searches.append(tick() - started)
        result["retrieval"] = {**ms_stats(searches), "pool_items": len(retriever.items)}
    return result


def _measure_traced(examples, program, *, warmup: int, clock: str) -> dict[str, Any]:
    """``measure_overhead`` with every dialogue recorded as an MLflow trace in a temporary store."""
    import tempfile

    from trace_dspy.core import spans
    from trace_dspy.store.tracking import prepare_tracing
    from trace_dspy.store.traces import flush_traces, tracing

    with tempfile.TemporaryDirectory(prefix="trace-overhead-") as tmp:
        prepare_tracing(f"sqlite:///{tmp}/mlflow.db", "overhead")
        with tracing(), dspy.context(callbacks=[spans.lm_span_callback()]):
            result = measure_overhead(examples, program, warmup=warmup, clock=clock)
        flush_traces()
    return {**result, "tracing": True}


def _time_dialogues(examples, program, *, warmup: int, tick) -> tuple[_StageTimer, list[float], float]:
    """Run the program on every example with a zero-latency fake LM, after ``warmup`` untimed ones.

    Returns the stage timer, each dialogue's seconds outside the LM, and the seconds inside it.
    """
    from trace_dspy.testing.fakes import ScriptedEngine

    engine = TimedEngine(ScriptedEngine(), clock=tick)
    lm = dspy.LM("fake/zero-latency", engine=engine, cache=False)
    timer = _StageTimer({id(p): n for n, p in program.named_predictors()}, engine)
    with dspy.context(lm=lm, callbacks=[*dspy.settings.callbacks, timer]):
        for ex in list(examples)[:warmup]:
            program(dialogue=ex.dialogue)
        timer.samples.clear()
        per_dialogue, lm_seconds = [], 0.0
        for ex in progress(examples, desc="overhead"):
            engine_before = engine.elapsed()
            started = tick()
            program(dialogue=ex.dialogue)
            spent = tick() - started
            lm_time = engine.elapsed() - engine_before
            lm_seconds += lm_time
            per_dialogue.append(spent - lm_time)
    return timer, per_dialogue, lm_seconds


def overhead_markdown(result: dict[str, Any]) -> str:
    rows = [*(("stage " + k, v) for k, v in result["per_stage"].items()),
            ("any stage call", result["per_stage_call"]), ("whole dialogue", result["per_dialogue"])]
    if "retrieval" in result:
        rows.append((f"retrieval search ({result['retrieval']['pool_items']} items)", result["retrieval"]))
    return markdown_table(["where", "calls", "mean ms", "median ms", "p95 ms"],
                          [[name, v["calls"], f"{v['mean_ms']:.2f}", f"{v['median_ms']:.2f}", f"{v['p95_ms']:.2f}"]
                           for name, v in rows])
