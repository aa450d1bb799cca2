"""Benchmark library: the quality comparison, framework overhead, concurrency, compile cost, scorer cost and
emotion accuracy measurements behind ``python -m trace_dspy.bench`` (see :mod:`trace_dspy.cli.bench`)."""

from __future__ import annotations

import platform
import statistics
import threading
import time
from collections import defaultdict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import dspy
from dspy.utils.callback import BaseCallback

from trace_dspy.core.console import progress, with_dspy_context
from trace_dspy.core.tables import markdown_table
from trace_dspy.optimize.metric import COST_KEYS, DETAIL_KEYS, PAIRED_KEYS, SUMMARY_KEYS
from trace_dspy.workflows.settings import Settings

BENCH_EXPERIMENT = "trace-dspy-bench"
BASE_SYSTEMS = ("single_cot", "trace_paper", "trace")
SYSTEM_DESCRIPTIONS = {
    "single_cot": "one ChainOfThought call: dialogue -> emotion, reply",
    "trace_paper": "TRACE stages with paraphrased paper-agent instructions, uncompiled",
    "trace": "TraceProgram, uncompiled",
}
# Per-example values that get paired-bootstrap intervals against the baseline: the summary's PAIRED_KEYS, where
# an accuracy is, per example, whether the label was right.
_PER_EXAMPLE = {"emotion_acc": "emotion_correct", "group_acc": "group_correct"}
PAIRED_METRICS = tuple(_PER_EXAMPLE.get(k, k) for k in PAIRED_KEYS)
# The scores table; the cost table shows COST_KEYS.
SCORE_KEYS = tuple(k for k in SUMMARY_KEYS if k not in DETAIL_KEYS and k not in COST_KEYS)


# ----------------------------------------------------------------------------- systems

class SingleCallProgram(dspy.Module):
    """The single-call baseline: dialogue -> (reasoning, emotion, reply) in one LM call."""

    def __init__(self):
        super().__init__()
        from trace_dspy.signatures.baselines import SingleCallEmpathy

        self.respond = dspy.ChainOfThought(SingleCallEmpathy)

    def forward(self, dialogue) -> dspy.Prediction:
        from trace_dspy.core.dialogue import normalize_dialogue
        from trace_dspy.core.labels import ekman_group
        from trace_dspy.lm.adapters import choose_adapter

        text = normalize_dialogue(dialogue)
        adapter = choose_adapter("auto", dspy.settings.lm)  # the compact adapter on grammar-constrained LMs
        with dspy.context(adapter=adapter) if adapter is not None else nullcontext():
            out = self.respond(dialogue=text)
        return dspy.Prediction(dialogue=text, emotion=out.emotion, emotion_group=ekman_group(out.emotion),
                               response=out.response, reasoning=out.reasoning)


def paper_program(config, *, retriever=None, stage_lms=None):
    """TraceProgram with instructions restating the published agents' prompts (uncompiled)."""
    from trace_dspy.program.pipeline import TraceProgram
    from trace_dspy.signatures.baselines import (
        PAPER_INSTRUCTIONS,
        PAPER_REASONING_STAGES,
    )

    config = replace(config, reasoning=tuple(dict.fromkeys((*config.reasoning, *PAPER_REASONING_STAGES))))
    program = TraceProgram(config, stage_lms=stage_lms, retriever=retriever)
    for stage, text in PAPER_INSTRUCTIONS.items():
        predictor = getattr(program, stage, None)
        if predictor is not None:
            predictor.signature = predictor.signature.with_instructions(text)
    return program


@dataclass
class System:
    name: str
    description: str
    program: dspy.Module
    compile_seconds: float | None = None
    compile_lm_calls: int | None = None


def without_cache(lm_config):
    """The same models with DSPy's response cache off, so every call is really made and timed."""
    from trace_dspy.lm.specs import LMConfig

    off = lambda spec: None if spec is None else replace(spec, cache=False)
    return LMConfig(default=off(lm_config.default), stages={k: off(v) for k, v in lm_config.stages.items()},
                    judge=off(lm_config.judge), prompt=off(lm_config.prompt))


def count_lm_calls(fn, *args, **kwargs) -> tuple[Any, int]:
    """Run ``fn`` and count the LM calls that reached a model (cache hits excluded), threads included."""
    from dspy.utils.usage_tracker import track_usage

    from trace_dspy.workflows.evaluation import usage_totals

    with track_usage() as tracker:
        result = fn(*args, **kwargs)
    return result, usage_totals(tracker)["lm_calls"]


def build_systems(names: Sequence[str], optimizers: Sequence[str], artifacts: Sequence[str], *, settings: Settings,
                  lms, retriever, train=(), dev=(), metric=None, optimizer_settings: dict | None = None,
                  log=print, prior=None) -> list[System]:
    """The systems to compare, all on the LMs of ``lms``; compiled ones are compiled here.

    Every staged system gets the same emotion ``prior`` (the default
    program's, fitted on the pool), so that they differ only in what the bench
    compares. Compiling optimizers that score candidates do it on ``dev``.
    """
    from trace_dspy.optimize.optimizers import OptimizerConfig, compile_program
    from trace_dspy.program.pipeline import TraceProgram

    systems: list[System] = []
    stage_lms = lms.stage_lms()
    for name in names:
        if name == "single_cot":
            program = SingleCallProgram()
        elif name == "trace_paper":
            program = paper_program(settings.program, retriever=retriever, stage_lms=stage_lms)
        elif name == "trace":
            program = TraceProgram(settings.program, stage_lms=stage_lms, retriever=retriever, emotion_prior=prior)
        else:
            raise ValueError(f"unknown system {name!r}; choose from {', '.join(BASE_SYSTEMS)}")
        if name == "trace_paper":
            program.emotion_prior = prior
        systems.append(System(name, SYSTEM_DESCRIPTIONS[name], program))
    for opt in optimizers:
        cfg = OptimizerConfig.from_dict({**(optimizer_settings or {}), "name": opt})
        student = TraceProgram(settings.program, stage_lms=stage_lms, retriever=retriever, emotion_prior=prior)
        log(f"compiling with {opt} on {len(train)} train examples")
        started = time.perf_counter()
        with dspy.context(lm=lms.default):
            compiled, calls = count_lm_calls(compile_program, cfg, student, metric, train, dev,
                                             prompt_lm=lms.role("prompt"), log=log)
        systems.append(System(f"compiled_{opt}", f"TraceProgram compiled with {opt} ({len(train)} train)",
                              compiled, time.perf_counter() - started, calls))
    for ref in artifacts:
        from trace_dspy.workflows.loading import load_for_run

        loaded = load_for_run(ref, Settings())
        program = loaded.program
        if hasattr(program, "set_stage_lms"):  # same LM for every system
            program.set_stage_lms(stage_lms)
        systems.append(System(f"artifact:{ref}", f"compiled artifact {ref}", program))
    names_seen = [s.name for s in systems]
    if len(set(names_seen)) != len(names_seen):
        raise ValueError(f"duplicate systems: {names_seen}")
    if not systems:
        raise ValueError("no systems to compare")
    return systems


# ----------------------------------------------------------------------------- quality

def per_example(row: dict[str, Any]) -> dict[str, float]:
    """The per-example values that paired intervals are computed on (failed rows count 0)."""
    from trace_dspy.core.labels import ekman_group
    from trace_dspy.optimize.scorers import rouge_l, token_f1

    pred = row.get("prediction") or {}
    comps = row.get("components") or {}
    gold, guess = row.get("gold_emotion"), pred.get("emotion")
    reply, ref = pred.get("response") or "", row.get("gold_response") or ""
    failed = "error" in row

    def comp(name: str) -> float:
        value = comps.get(name)
        return 0.0 if failed or value is None else float(value)

    return {
        "empathy": float(row.get("score", 0.0)),
        "empathy_learned": comp("empathy"),
        "strategy_fit": comp("strategy_fit"),
        "emotion_correct": float(not failed and guess is not None and guess == gold),
        "group_correct": float(not failed and guess is not None and ekman_group(guess) == ekman_group(gold)),
        "emotion": comp("emotion"),
        "rules": comp("rules"),
        "similarity": comp("similarity"),
        "relevance": comp("relevance"),
        "token_f1": token_f1(ref, reply) if ref and not failed else 0.0,
        "rouge_l": rouge_l(ref, reply) if ref and not failed else 0.0,
    }


@dataclass
class QualityReport:
    systems: list[str]
    descriptions: dict[str, str]
    summaries: dict[str, dict[str, Any]]
    paired: dict[str, dict[str, tuple[float, float, float]]]  # system -> metric -> (diff, low, high)
    score_ci: dict[str, tuple[float, float, float]]  # system -> empathy (mean, low, high)
    compile: dict[str, dict[str, Any]]
    run: dict[str, Any] = field(default_factory=dict)

    @property
    def baseline(self) -> str:
        return self.systems[0]

    def to_dict(self) -> dict[str, Any]:
        return {"run": self.run, "systems": self.systems, "baseline": self.baseline, "descriptions": self.descriptions,
                "summaries": {k: {m: v for m, v in s.items() if m != "distributions"} for k, s in self.summaries.items()},
                "paired_vs_baseline": {k: {m: list(v) for m, v in d.items()} for k, d in self.paired.items()},
                "empathy_ci": {k: list(v) for k, v in self.score_ci.items()}, "compile": self.compile}

    def markdown(self) -> str:
        def cell(value):
            return "-" if value is None else f"{value:.4f}" if isinstance(value, float) else str(value)

        names = self.systems
        scores = markdown_table(["metric", *names], [
            [k, *(cell(self.summaries[n].get(k)) for n in names)]
            for k in SCORE_KEYS if any(k in self.summaries[n] for n in names)])
        others = names[1:]
        paired = markdown_table(["metric", *others], [
            [metric, *("{:+.4f} [{:+.4f}, {:+.4f}]".format(*self.paired[n][metric]) for n in others)]
            for metric in PAIRED_METRICS])
        cost = markdown_table(["metric", *names], [
            [k.replace("_per_dialogue", ""), *(cell(self.summaries[n].get(k)) for n in names)] for k in COST_KEYS])
        compiled = [f"- `{n}`: compiled in {c['seconds']:.0f} s with {c['lm_calls']} LM calls"
                    for n, c in self.compile.items()]
        systems = [f"- `{n}`: {self.descriptions[n]}" for n in names]
        parts = ["Systems:", *systems, "", "Scores (per system):", "", scores, "",
                 f"Paired difference against `{self.baseline}`, mean [95% bootstrap CI]:", "", paired, "",
                 "Cost per dialogue (LM calls that reached the model, tokens, wall seconds):", "", cost]
        if compiled:
            parts += ["", "Compile cost:", "", *compiled]
        return "\n".join(parts)


def program_fingerprint(program) -> str | None:
    """A TraceProgram's prompts, demos, config and runtime parts as one string; None for other programs."""
    import json

    from trace_dspy.program.pipeline import TraceProgram

    if not isinstance(program, TraceProgram):
        return None
    parts = {"state": program.dump_state(), "config": program.config.to_dict(),
             "retriever": getattr(program.retriever, "fingerprint", None),
             "prior": id(program.emotion_prior) if program.emotion_prior is not None else None,
             "openers": program.reply_openers, "plans": program.reply_plans,
             "lms": sorted((stage, id(lm)) for stage, lm in program.stage_lms.items())}
    return json.dumps(parts, sort_keys=True, default=str)


def run_quality(systems: Sequence[System], examples: Sequence[dspy.Example], metric, *, lm=None, threads: int = 1,
                rows_dir: str | Path | None = None, max_failure_rate: float | None = 0.5, seed: int = 0,
                run: dict[str, Any] | None = None) -> QualityReport:
    """Evaluate every system on the same examples; intervals are against ``systems[0]``."""
    from trace_dspy.optimize.scorers import paired_bootstrap_ci
    from trace_dspy.workflows.evaluation import evaluate_program

    if not examples:
        raise ValueError("no examples to benchmark on")
    summaries, values = {}, {}
    evaluated: dict[str, str] = {}  # program fingerprint -> the system evaluated with it
    for system in systems:
        key = program_fingerprint(system.program)
        if key is not None and key in evaluated:
            # The same program on the same LMs (e.g. ``select`` kept the uncompiled candidate): one evaluation.
            twin = evaluated[key]
            summaries[system.name] = {**summaries[twin], "same_program_as": twin}
            values[system.name] = values[twin]
            continue
        if key is not None:
            evaluated[key] = system.name
        path = Path(rows_dir) / f"{system.name.replace(':', '_').replace('/', '_')}.jsonl" if rows_dir else None
        result = evaluate_program(system.program, examples, metric, lm=lm, threads=threads, results_path=path,
                                  max_failure_rate=max_failure_rate, desc=system.name)
        summaries[system.name] = result.summary
        values[system.name] = [per_example(r) for r in result.rows]
    base = systems[0].name
    paired, score_ci = {}, {}
    for system in systems:
        mine = values[system.name]
        paired[system.name] = {
            m: paired_bootstrap_ci([v[m] for v in mine], [v[m] for v in values[base]], seed=seed)
            for m in PAIRED_METRICS}
        scores = [v["empathy"] for v in mine]
        score_ci[system.name] = paired_bootstrap_ci(scores, [0.0] * len(scores), seed=seed)
    compile_costs = {s.name: {"seconds": s.compile_seconds, "lm_calls": s.compile_lm_calls}
                     for s in systems if s.compile_seconds is not None}
    return QualityReport([s.name for s in systems], {s.name: s.description for s in systems}, summaries, paired,
                         score_ci, compile_costs, dict(run or {}))


def quality_charts(report: QualityReport, out_dir: str | Path) -> list[Path]:
    """Two PNGs: empathy by system (with 95% CIs) and tokens per dialogue against empathy."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    names = report.systems
    means = [report.score_ci[n][0] for n in names]
    lows = [report.score_ci[n][0] - report.score_ci[n][1] for n in names]
    highs = [report.score_ci[n][2] - report.score_ci[n][0] for n in names]
    fig, ax = plt.subplots(figsize=(max(5.0, 1.4 * len(names)), 3.6))
    ax.bar(range(len(names)), means, yerr=[lows, highs], capsize=4, color="#4c72b0")
    ax.set_xticks(range(len(names)), names, rotation=20, ha="right")
    ax.set_ylabel("empathy score (95% CI)")
    ax.set_title(f"Empathy by system (n={report.summaries[names[0]]['n']})")
    fig.tight_layout()
    score_png = out / "bench_score.png"
    fig.savefig(score_png, dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for n in names:
        s = report.summaries[n]
        tokens = s.get("prompt_tokens_per_dialogue", 0) + s.get("completion_tokens_per_dialogue", 0)
        ax.scatter([tokens], [s["empathy"]], s=40)
        ax.annotate(n, (tokens, s["empathy"]), textcoords="offset points", xytext=(5, 4), fontsize=8)
    ax.set_xlabel("tokens per dialogue (prompt + completion)")
    ax.set_ylabel("empathy score")
    ax.set_title("Cost against quality")
    fig.tight_layout()
    cost_png = out / "bench_tokens_vs_score.png"
    fig.savefig(cost_png, dpi=120)
    plt.close(fig)
    return [score_png, cost_png]


def log_quality_to_mlflow(report: QualityReport, files: Sequence[Path], *, tracking_uri=None,
                          experiment: str = BENCH_EXPERIMENT, params: dict | None = None) -> str:
    """One parent run with the table and charts; one nested run per system (compare them in the UI)."""
    import mlflow

    from trace_dspy.store.tracking import log_params, mlflow_run, numeric_metrics

    with mlflow_run(tracking_uri=tracking_uri, experiment=experiment, run_name="bench quality",
                    tags={"trace_dspy.kind": "bench-quality"}) as parent:
        log_params({**(params or {}), "systems": ",".join(report.systems), "baseline": report.baseline})
        for name in report.systems:
            with mlflow_run(tracking_uri=tracking_uri, experiment=experiment, run_name=name, nested=True,
                            tags={"trace_dspy.kind": "bench-system", "trace_dspy.system": name}):
                log_params({"system": name, "description": report.descriptions[name]})
                metrics = numeric_metrics(report.summaries[name], "test")
                for metric, (diff, low, high) in report.paired[name].items():
                    metrics.update({f"vs_baseline/{metric}": diff, f"vs_baseline/{metric}_ci_low": low,
                                    f"vs_baseline/{metric}_ci_high": high})
                if name in report.compile:
                    metrics.update(numeric_metrics(report.compile[name], "compile"))
                mlflow.log_metrics(metrics)
        for path in files:
            mlflow.log_artifact(str(path))
        return parent.info.run_id


# ----------------------------------------------------------------------------- overhead

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


def _ms(values: Sequence[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {"mean_ms": 1000 * statistics.fmean(ordered), "median_ms": 1000 * statistics.median(ordered),
            "p95_ms": 1000 * ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))], "calls": len(ordered)}


def measure_overhead(examples: Sequence[dspy.Example], program, *, warmup: int = 3,
                     clock: str = "wall", trace: bool = False) -> dict[str, Any]:
    """Time spent outside the LM, per stage call and per dialogue, with a zero-latency fake LM.

    ``clock`` is "wall" (elapsed time) or "cpu" (the thread's CPU time). ``trace`` records every
    dialogue as an MLflow trace (stage and LM spans) in a temporary sqlite store, as ``evaluate`` does.
    """
    if trace:
        import tempfile

        from trace_dspy.core import spans
        from trace_dspy.store.tracking import prepare_tracing, tracing

        with tempfile.TemporaryDirectory(prefix="trace-overhead-") as tmp:
            prepare_tracing(f"sqlite:///{tmp}/mlflow.db", "overhead")
            with tracing(), dspy.context(callbacks=[spans.lm_span_callback()]):
                result = measure_overhead(examples, program, warmup=warmup, clock=clock)
            import mlflow

            mlflow.flush_trace_async_logging()
        return {**result, "tracing": True}
    from trace_dspy.testing.fakes import ScriptedEngine

    if not examples:
        raise ValueError("no examples")
    if clock not in CLOCKS:
        raise ValueError(f"clock must be one of {', '.join(CLOCKS)}")
    tick = CLOCKS[clock]
    engine = TimedEngine(ScriptedEngine(), clock=tick)
    lm = dspy.LM("fake/zero-latency", engine=engine, cache=False)
    names = {id(p): n for n, p in program.named_predictors()}
    timer = _StageTimer(names, engine)
    retriever = getattr(program, "retriever", None)
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
    stage_samples = [v for values in timer.samples.values() for v in values]
    result = {
        "clock": clock,
        "tracing": False,
        "dialogues": len(examples),
        "stage_calls": len(stage_samples),
        "per_stage": {name: _ms(values) for name, values in timer.samples.items()},
        "per_stage_call": _ms(stage_samples),
        "per_dialogue": _ms(per_dialogue),
        "fake_lm_ms_per_call": 1000 * lm_seconds / max(1, len(stage_samples)),
    }
    if retriever is not None and program.config.retrieval.enabled:
        searches = []
        for ex in examples:
            started = tick()
            # each dialogue filters on its own (gold) emotion group, as the program does with the predicted one
            retriever.search(ex.dialogue, emotion=str(ex.get("emotion") or ""), k=program.config.retrieval.k)
            searches.append(tick() - started)
        result["retrieval"] = {**_ms(searches), "pool_items": len(retriever.items)}
    return result


def overhead_markdown(result: dict[str, Any]) -> str:
    rows = [*(("stage " + k, v) for k, v in result["per_stage"].items()),
            ("any stage call", result["per_stage_call"]), ("whole dialogue", result["per_dialogue"])]
    if "retrieval" in result:
        rows.append((f"retrieval search ({result['retrieval']['pool_items']} items)", result["retrieval"]))
    return markdown_table(["where", "calls", "mean ms", "median ms", "p95 ms"],
                          [[name, v["calls"], f"{v['mean_ms']:.2f}", f"{v['median_ms']:.2f}", f"{v['p95_ms']:.2f}"]
                           for name, v in rows])


# ----------------------------------------------------------------------------- concurrency

def measure_concurrency(examples: Sequence[dspy.Example], program, *, levels: Sequence[int] = (1, 2, 4, 8, 16, 32),
                        latency: float = 0.2, per_thread: int = 4, min_dialogues: int = 8) -> dict[str, Any]:
    """Dialogues per second at each thread count against a loopback server with a fixed latency."""
    from trace_dspy.testing.server import FakeChatServer

    if not examples or not levels or min(levels) < 1:
        raise ValueError("need examples and thread counts >= 1")
    results = []
    with FakeChatServer(latency=latency) as server:
        lm = dspy.LM("openai/fake", api_base=server.api_base, api_key="unused", cache=False, num_retries=0)
        with dspy.context(lm=lm):
            program(dialogue=examples[0].dialogue)  # warm up the client and its connection pool
            for threads in progress(levels, desc="concurrency"):
                count = max(min_dialogues, per_thread * threads)
                batch = [examples[i % len(examples)] for i in range(count)]
                requests_before = server.requests
                work = with_dspy_context(lambda ex: program(dialogue=ex.dialogue))
                started = time.perf_counter()
                with ThreadPoolExecutor(max_workers=threads) as pool:
                    list(pool.map(work, batch))
                wall = time.perf_counter() - started
                results.append({"threads": threads, "dialogues": count, "seconds": wall,
                                "dialogues_per_second": count / wall,
                                "lm_calls": server.requests - requests_before})
    base = results[0]["dialogues_per_second"]
    for r in results:
        r["speedup"] = r["dialogues_per_second"] / base
    return {"latency_s": latency, "levels": results}


def concurrency_markdown(result: dict[str, Any]) -> str:
    return markdown_table(
        ["threads", "dialogues", "LM calls", "seconds", "dialogues/s", "speedup vs 1"],
        [[r["threads"], r["dialogues"], r["lm_calls"], f"{r['seconds']:.2f}", f"{r['dialogues_per_second']:.2f}",
          f"{r['speedup']:.1f}x"] for r in result["levels"]], align="rrrrrr")


# ----------------------------------------------------------------------------- compile

def measure_compile(make_config, *, cache_dir: str | Path) -> dict[str, Any]:
    """Wall time and LM calls of a compile with an empty DSPy cache, then of the same compile again.

    ``make_config(run)`` returns the CompileConfig of run 'cold' or 'warm'. The
    second run gets a fresh in-memory cache over the same disk cache, as a new
    process would.
    """
    from trace_dspy.workflows.compile import run_compile

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


# ----------------------------------------------------------------------------- CLI











def measure_scorer(examples: Sequence[dspy.Example], metric) -> dict[str, Any]:
    """Per-example cost of ``metric.evaluate`` on the gold replies: a first pass that embeds
    (cold), then a pass with every embedding cached (tokenization redone); wall and thread-CPU clocks."""
    preds = [dspy.Prediction(response=e.response, emotion=e.emotion, strategy="EX", secondary_strategy="ER")
             for e in examples]
    from trace_dspy.optimize import scorers

    passes = {}
    for name in ("cold", "cached"):
        scorers._tokens.cache_clear()  # only the embeddings count as cached, not the tokenization
        wall0, cpu0 = time.perf_counter(), time.thread_time()
        for example, pred in zip(examples, preds):
            metric.evaluate(example, pred)
        passes[name] = {"wall_ms_per_example": 1000 * (time.perf_counter() - wall0) / len(examples),
                        "cpu_ms_per_example": 1000 * (time.thread_time() - cpu0) / len(examples)}
    return {"examples": len(examples), "torch_threads": _torch_threads(), **passes}


def _torch_threads() -> int | None:
    try:
        import torch

        return torch.get_num_threads()
    except ImportError:
        return None


def scorer_markdown(result: dict[str, Any]) -> str:
    table = markdown_table(["pass", "wall ms / example", "thread CPU ms / example"],
                           [[name, f"{result[name]['wall_ms_per_example']:.2f}",
                             f"{result[name]['cpu_ms_per_example']:.2f}"] for name in ("cold", "cached")])
    return f"{result['examples']} ED test items (gold replies), metric.evaluate per example\n\n{table}"


# Published 32-class emotion accuracy on ED test (the anchors of the emotion table).
PUBLISHED_EMOTION = {"CEM (Sabour et al., 2022)": 0.391, "CASE (Zhou et al., 2023)": 0.402,
                     "TRACE with GPT-4o, reported I-ACC": 0.4428}


def measure_emotion(source, lm, *, limit: int = 300, ks: Sequence[int] = (0, 2, 3), seed: int = 0,
                    cost_items: int = 100, on_item=None, prior_kind: str = "fitted",
                    situations=None) -> dict[str, Any]:
    """Emotion accuracy on the TRACE-view test set: the majority label, the fitted prior alone
    on every item, and the stage (``recognize_emotion`` on ``lm``) with the prior's top ``k``
    on ``limit`` seeded items (k = 0: the LM alone); plus the prior's milliseconds per dialogue.

    ``prior_kind``: ``fitted`` fits one on the source's training side (what ``compile`` on that
    source does); ``shipped`` uses the prior packaged with trace-dspy (what programs compiled on
    the seed set use); ``situations`` (a ``data.situations.Situations``) join a fitted prior's training set."""
    import random

    from trace_dspy.core.config import ProgramConfig
    from trace_dspy.core.labels import ekman_group
    from trace_dspy.data.sources import partition_by_conversation, select_view
    from trace_dspy.program.emotion_prior import (
        PriorError,
        accuracy,
        cached_prior,
        default_encoder,
        format_candidates,
        shipped_prior,
    )
    from trace_dspy.program.pipeline import TraceProgram

    if prior_kind == "shipped":
        prior = shipped_prior()
        if prior is None:
            raise PriorError("this installation has no shipped prior")
    elif prior_kind == "fitted":
        prior = cached_prior(source, situations=situations, seed=seed)
    else:
        raise ValueError(f"prior_kind must be 'fitted' or 'shipped', not {prior_kind!r}")
    encode = default_encoder()
    test = select_view(source.test, "trace")
    picked = sorted(random.Random(seed).sample(range(len(test)), min(limit, len(test))))
    items = [test[i] for i in picked]
    # Cost first, while the test texts are not yet in the embedder's cache: one dialogue per call.
    cold = [t for t in test if t not in items][:cost_items]
    cost = measure_prior_cost(prior, cold, encode)
    texts, gold = [prior.text_of(s.dialogue) for s in test], [s.emotion for s in test]
    train = partition_by_conversation(source.pool, 0.2, seed=seed)[0]
    majority = max(sorted({s.emotion for s in train}), key=[s.emotion for s in train].count)
    group_majority = max(sorted({ekman_group(s.emotion) for s in train}),
                         key=[ekman_group(s.emotion) for s in train].count)
    result: dict[str, Any] = {
        "test_items": len(test), "stage_items": len(items), "seed": seed, "prior_kind": prior_kind,
        "prior": prior.describe(),
        "majority": {"label": majority, "accuracy": sum(g == majority for g in gold) / len(gold),
                     "group": group_majority,
                     "group_accuracy": sum(ekman_group(g) == group_majority for g in gold) / len(gold)},
        "prior_all": {**accuracy(prior, texts, gold, encode), "n": len(test)},
        "prior_on_stage_items": accuracy(prior, [prior.text_of(s.dialogue) for s in items],
                                         [s.emotion for s in items], encode),
        **cost, "published": PUBLISHED_EMOTION, "stage": []}
    for k in ks:
        program = TraceProgram(ProgramConfig(prior_k=k), emotion_prior=prior if k else None)
        program.set_stage_lms({"recognize_emotion": lm})
        right = group_right = outside = 0
        start = time.perf_counter()
        for n, sample in enumerate(items, 1):
            state = {"dialogue": sample.dialogue}
            allowed = prior.candidates(sample.dialogue, k, encode) if k else []
            if k:
                state["emotion_candidates"] = format_candidates(allowed)
            label = program._call("recognize_emotion", state).emotion
            right += label == sample.emotion
            group_right += ekman_group(label) == ekman_group(sample.emotion)
            outside += bool(allowed) and label not in {c for c, _ in allowed}
            if on_item:
                on_item(k, n, len(items))
        result["stage"].append({"k": k, "accuracy": right / len(items), "group_accuracy": group_right / len(items),
                                "outside_candidates": outside,
                                "seconds_per_item": (time.perf_counter() - start) / len(items)})
    return result


def measure_prior_cost(prior, samples: Sequence, encode) -> dict[str, Any]:
    """The prior's milliseconds per dialogue, each embedding computed afresh, two ways:

    - ``prior_ms_per_dialogue``: the prior on its own (its embedding plus the linear model);
    - ``prior_added_ms_per_dialogue``: what it adds to a program whose reply reward scores a reply
      (Best-of-N, the default): the time of prior + reward minus the reward alone on the same
      dialogue and reply (the sample's gold reply), with the embedder's cache emptied before each.
      A prior of feature version 2 embeds the speaker's words as the reward spells them, so the
      reward finds that embedding cached.
    """
    from trace_dspy.core.dialogue import speaker_text
    from trace_dspy.optimize.empathy import EmpathyScorer
    from trace_dspy.optimize.similarity import get_embedder

    embedder = get_embedder()
    scorer = EmpathyScorer(encode=encode)
    alone, added = [], []

    def forget():
        if embedder is not None:
            embedder._cache.clear()

    for sample in samples:
        speaker, reply = speaker_text(sample.dialogue), sample.response
        forget()
        start = time.perf_counter()
        prior.candidates(sample.dialogue, 3, encode)
        t_prior = time.perf_counter() - start
        start = time.perf_counter()
        scorer.score(speaker, reply)
        t_reward_after_prior = time.perf_counter() - start
        forget()
        start = time.perf_counter()
        scorer.score(speaker, reply)
        t_reward = time.perf_counter() - start
        alone.append(t_prior)
        added.append(t_prior + t_reward_after_prior - t_reward)
    forget()
    return {"prior_ms_per_dialogue": _ms(alone), "prior_added_ms_per_dialogue": _ms(added),
            "prior_feature_version": prior.feature_version}


def emotion_markdown(result: dict[str, Any]) -> str:
    n, m = result["stage_items"], result["test_items"]
    rows = [("majority label (" + result["majority"]["label"] + ")", m, result["majority"]["accuracy"],
             result["majority"]["group_accuracy"])]
    rows.append(("fitted prior alone, top-1", m, result["prior_all"]["accuracy"], result["prior_all"]["group_accuracy"]))
    rows.append(("fitted prior alone, top-1", n, result["prior_on_stage_items"]["accuracy"],
                 result["prior_on_stage_items"]["group_accuracy"]))
    for row in result["stage"]:
        name = "LM alone (prior off)" if row["k"] == 0 else f"prior top-{row['k']} + LM"
        rows.append((name, n, row["accuracy"], row["group_accuracy"]))
    lines = [markdown_table(["system", "items", "32-class accuracy", "6-group accuracy"],
                            [*([a, b, f"{c:.3f}", f"{d:.3f}"] for a, b, c, d in rows),
                             *([f"{name} (published)", "5,255", f"{acc:.3f}", "-"]
                               for name, acc in result["published"].items())])]
    cost = result["prior_ms_per_dialogue"]
    lines += ["", f"Prior cost on its own: {cost['mean_ms']:.1f} ms per dialogue (median {cost['median_ms']:.1f}, "
              f"p95 {cost['p95_ms']:.1f}, {cost['calls']} calls), one dialogue per call, embeddings not cached."]
    added = result.get("prior_added_ms_per_dialogue")
    if added:
        lines += [f"Prior cost added to a program whose reply reward runs: {added['mean_ms']:.1f} ms per dialogue "
                  f"(median {added['median_ms']:.1f}, p95 {added['p95_ms']:.1f})."]
    return "\n".join(lines)




def _flat_numbers(data, prefix: str = "") -> dict[str, float]:
    out = {}
    items = data.items() if isinstance(data, dict) else enumerate(data)
    for key, value in items:
        if isinstance(data, list) and isinstance(value, dict) and "threads" in value:
            key = f"threads_{value['threads']}"
        name = f"{prefix}{key}"
        if isinstance(value, (dict, list)):
            out.update(_flat_numbers(value, name + "/"))
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out[name.replace(" ", "_")] = float(value)
    return out


def _machine() -> dict[str, Any]:
    import os

    return {"python": platform.python_version(), "platform": platform.platform(), "cpus": os.cpu_count(),
            "dspy": dspy.__version__}










