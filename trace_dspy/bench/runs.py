"""The benchmark runs behind ``python -m trace_dspy.bench``: each resolves its data and program, measures,
and returns a :class:`BenchRun`; :func:`save_run` writes its record and logs it to MLflow.

Every run's record is ``<name>.json`` (numbers only, no dataset text) and ``<name>.md`` (the command and
the table) in the output folder.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trace_dspy.bench.compile_cost import compile_markdown, measure_compile
from trace_dspy.bench.concurrency import concurrency_markdown, measure_concurrency
from trace_dspy.bench.emotion import emotion_markdown, measure_emotion
from trace_dspy.bench.overhead import measure_overhead, overhead_markdown
from trace_dspy.bench.records import BENCH_EXPERIMENT, flat_numbers, machine
from trace_dspy.bench.scorer import measure_scorer, scorer_markdown
from trace_dspy.core.console import heartbeat, progress, say
from trace_dspy.core.jsonl import atomic_write_json
from trace_dspy.core.pricing import DEFAULT_INPUT_PRICE, DEFAULT_OUTPUT_PRICE, Pricing
from trace_dspy.workflows.settings import Settings

DEFAULT_OUTPUT = Path("runs/bench")


@dataclass
class BenchRun:
    """A finished benchmark: its record's name, its numbers and its markdown table."""

    name: str
    result: dict[str, Any]
    table: str
    out_dir: Path | None = None  # where its record is, once saved
    charts: list[Path] = field(default_factory=list)
    mlflow_run_id: str | None = None


@dataclass
class Where:
    """Where a benchmark reads its data and writes its record: the data source, the seed, the output
    folder (None: runs/bench), the command line, and the MLflow store (``mlflow`` False: none)."""

    settings: Settings
    data: str | None = None
    seed: int = 0
    output_dir: Path | None = None
    command: str = "python -m trace_dspy.bench"
    mlflow: bool = True
    tracking_uri: str | None = None
    experiment: str = BENCH_EXPERIMENT

    @property
    def out_dir(self) -> Path:
        return self.output_dir or DEFAULT_OUTPUT

    def source(self):
        from trace_dspy.data.sources import resolve_source

        return resolve_source(self.settings.data_source(self.data), seed=self.seed)


def save_run(where: Where, run: BenchRun, *, log: bool = True) -> Path:
    """Write ``<name>.json`` and ``<name>.md`` to the output folder and, when ``log``, one MLflow run with the
    record's numbers; returns the folder."""
    from trace_dspy.store.tracking import log_record_run, logged_or_warned

    out_dir = where.out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    record = {"command": where.command, "machine": machine(), "result": run.result}
    atomic_write_json(out_dir / f"{run.name}.json", record)
    # file-audit: writes the bench's record table beside its JSON record
    (out_dir / f"{run.name}.md").write_text(f"`{record['command']}`\n\n{run.table}\n", encoding="utf-8")
    if log and where.mlflow:
        with logged_or_warned(out_dir):
            log_record_run(out_dir / f"{run.name}.json", flat_numbers(run.result), tracking_uri=where.tracking_uri,
                           experiment=where.experiment, run_name=f"bench {run.name}", kind=f"bench-{run.name}")
    return out_dir


def examples_and_program(where: Where, limit: int):
    """Seeded test examples and the uncompiled program, retrieving from the same source's pool."""
    from trace_dspy.data.sources import load_test
    from trace_dspy.program.pipeline import TraceProgram
    from trace_dspy.workflows.loading import default_retriever

    source = where.source()
    retriever = default_retriever(where.settings.program, source, seed=where.seed)
    return load_test(source, limit=limit, seed=where.seed), TraceProgram(where.settings.program, retriever=retriever)


def run_overhead(where: Where, *, dialogues: int, warmup: int, clock: str, trace: bool) -> BenchRun:
    examples, program = examples_and_program(where, dialogues)
    result = measure_overhead(examples, program, warmup=warmup, clock=clock, trace=trace)
    return BenchRun(f"overhead-{clock}" + ("-traced" if trace else ""), result, overhead_markdown(result))


def run_concurrency(where: Where, *, levels: Sequence[int], latency: float, per_thread: int) -> BenchRun:
    examples, program = examples_and_program(where, 64)
    result = measure_concurrency(examples, program, levels=levels, latency=latency, per_thread=per_thread)
    return BenchRun("concurrency", result, concurrency_markdown(result))


def run_emotion(where: Where, *, limit: int, k: Sequence[int], prior: str, situations: str | None) -> BenchRun:
    from trace_dspy.data.situations import resolve_situations
    from trace_dspy.lm.specs import LMSet

    source = where.source()
    lms = LMSet(where.settings.lm)
    lm = lms.stage_lms().get("recognize_emotion") or lms.default
    resolved = resolve_situations(situations)
    with progress(desc="emotion stage", total=limit * len(k)) as bar:
        result = measure_emotion(source, lm, limit=limit, ks=k, seed=where.seed, on_item=lambda *_: bar.update(1),
                                 prior_kind=prior, situations=resolved)
    return BenchRun("emotion", result, emotion_markdown(result))


def run_prior(where: Where, *, situations: str | None) -> BenchRun:
    from trace_dspy.bench.prior_variants import (
        measure_prior_variants,
        prior_variants_markdown,
    )
    from trace_dspy.data.situations import resolve_situations

    def said(row: dict[str, Any]) -> None:
        say(f"{row['name']}: dev {row['dev']['accuracy']:.3f}, test {row['test']['accuracy']:.3f}")

    result = measure_prior_variants(where.source(), resolve_situations(situations), seed=where.seed, on_variant=said)
    return BenchRun("prior", result, prior_variants_markdown(result))


def run_scale(where: Where, *, items: int, latency: float, threads: Sequence[int], master: str,
              partitions: int | None, task_threads: Sequence[int]) -> BenchRun:
    from trace_dspy.bench.scale import measure_scale, project, scale_markdown
    from trace_dspy.data.sources import load_test

    dialogues = [e.dialogue for e in load_test(where.source(), limit=items, seed=where.seed)]
    result = measure_scale(dialogues, latency=latency, threads=threads, master=master, partitions=partitions,
                           task_threads=task_threads)
    result["projection"] = project(result)
    return BenchRun("scale", result, scale_markdown(result))


def run_scorer(where: Where, *, limit: int) -> BenchRun:
    from trace_dspy.data.sources import load_test
    from trace_dspy.workflows.evaluation import build_metric

    source = where.source()
    metric = build_metric(where.settings)
    if metric.scorer is None:
        raise ValueError("the scorer bench needs the learned scorer (the 'embed' extra)")
    result = measure_scorer(load_test(source, limit=limit, seed=where.seed), metric)
    return BenchRun("scorer", result, scorer_markdown(result))


def run_compile_bench(where: Where, *, optimizer: str | None, train: int, dev: int) -> BenchRun:
    from trace_dspy.core.config import DataConfig
    from trace_dspy.optimize.optimizers import DEFAULT_OPTIMIZER, OptimizerConfig
    from trace_dspy.workflows.compiling import CompileConfig

    settings = where.settings
    config = OptimizerConfig.from_dict({**(settings.raw.get("optimizer") or {}),
                                        "name": optimizer or DEFAULT_OPTIMIZER})
    with tempfile.TemporaryDirectory(prefix="trace-bench-compile-") as tmp:
        def make_config(run: str) -> CompileConfig:
            return CompileConfig(settings=settings, optimizer=config,
                                 data=DataConfig(source=settings.data_source(where.data), train=train, dev=dev),
                                 seed=where.seed, name=f"bench-{run}",
                                 artifacts_dir=str(Path(tmp) / "artifacts"), mlflow=False, command=where.command)

        result = measure_compile(make_config, cache_dir=Path(tmp) / "cache")
    result = {**result, "optimizer": config.settings(), "train": train, "dev": dev}
    return BenchRun("compile", result, compile_markdown({k: v for k, v in result.items() if k in ("cold", "warm")}))


def run_latency(where: Where, *, phases: Sequence[str], repeats: int, competing: Sequence[int],
                messages: Path | None, message: str, cold_cache: bool, program: str | None, config: str | None,
                run_timeout: float, max_load: float, force: bool) -> BenchRun:
    """The latency bench; its record is rewritten after every run, so that a bench that stops keeps its numbers."""
    from trace_dspy.bench.latency import (
        LatencyOptions,
        latency_markdown,
        measure_latency,
    )

    options = LatencyOptions(phases=phases, repeats=repeats, competing=competing, messages=messages,
                             message=message, cold_cache=cold_cache, program=program, config=config,
                             data=where.data, timeout=run_timeout, max_load=max_load, force=force)

    def saved(result: dict[str, Any]) -> None:
        save_run(where, BenchRun("latency", result, latency_markdown(result)), log=False)

    result = measure_latency(options, on_update=saved)
    return BenchRun("latency", result, latency_markdown(result))


def run_quality_bench(where: Where, *, limit: int, view: str, systems: Sequence[str], optimizers: Sequence[str],
                      artifact: Sequence[str], train: int, dev: int, threads: int, max_failure_rate: float | None,
                      fresh: bool, price_input: float = DEFAULT_INPUT_PRICE,
                      price_output: float = DEFAULT_OUTPUT_PRICE) -> BenchRun:
    """The quality bench: the systems on one seeded test subset, its record, charts and MLflow runs; each
    system's cost per 1,000 dialogues on a hosted LM at ``price_input`` and ``price_output`` (USD per million
    input and output tokens)."""
    from trace_dspy.bench.quality import (
        log_quality_to_mlflow,
        quality_charts,
        run_quality,
    )
    from trace_dspy.bench.systems import BASE_SYSTEMS, build_systems
    from trace_dspy.optimize.optimizers import OPTIMIZERS
    from trace_dspy.store.tracking import logged_or_warned

    pricing = Pricing(price_input, price_output)  # a bad price stops the bench before any work
    unknown = [s for s in systems if s not in BASE_SYSTEMS] + [o for o in optimizers if o not in OPTIMIZERS]
    if unknown:
        raise ValueError(f"unknown system or optimizer: {', '.join(unknown)}; systems: {', '.join(BASE_SYSTEMS)}; "
                         f"optimizers: {', '.join(OPTIMIZERS)}")
    setup = _quality_setup(where, limit=limit, view=view, train=train, dev=dev)
    rows_dir = where.out_dir / "quality_rows"
    if fresh and rows_dir.exists():
        for path in rows_dir.glob("*.jsonl"):
            path.unlink()
    source, examples = setup["source"], setup["examples"]
    say(f"bench: {len(examples)} {view} test examples ({source.kind}: {source.location}); "
        f"rows in {rows_dir}")
    compared = build_systems(systems, optimizers, artifact, settings=where.settings, lms=setup["lms"],
                             retriever=setup["retriever"], train=setup["train"], dev=setup["dev"],
                             metric=setup["metric"], optimizer_settings=where.settings.raw.get("optimizer"),
                             log=say, prior=setup["prior"])
    report = run_quality(compared, examples, setup["metric"], lm=setup["lms"].default, threads=threads,
                         rows_dir=rows_dir, max_failure_rate=max_failure_rate, seed=where.seed, run=setup["run"],
                         pricing=pricing)
    run = BenchRun("quality", report.to_dict(), report.markdown())
    run.charts = quality_charts(report, where.out_dir)
    run.out_dir = save_run(where, run, log=False)
    if where.mlflow:
        with logged_or_warned(run.out_dir), heartbeat("mlflow") as phase:
            phase.note("logging the bench runs")
            run.mlflow_run_id = log_quality_to_mlflow(
                report, [*run.charts, run.out_dir / "quality.md", run.out_dir / "quality.json"],
                tracking_uri=where.tracking_uri, experiment=where.experiment, params=setup["run"])
    return run


def _quality_setup(where: Where, *, limit: int, view: str, train: int, dev: int) -> dict[str, Any]:
    """The quality bench's test items, LMs (cache off), metric, retriever, prior and train/dev splits."""
    from trace_dspy.bench.systems import without_cache
    from trace_dspy.data.sources import load_splits, load_test
    from trace_dspy.lm.specs import LMSet
    from trace_dspy.workflows.evaluation import build_metric
    from trace_dspy.workflows.loading import default_prior, default_retriever

    settings = where.settings
    source = where.source()
    examples = load_test(source, view=view, limit=limit, seed=where.seed)
    lm_config = without_cache(settings.lm)
    lms = LMSet(lm_config)
    metric = build_metric(settings, lms)
    retriever = default_retriever(settings.program, source, seed=where.seed)
    # Loaded for every run, not only when compiling: the metric is then the same whichever systems a run
    # compares, so two runs' tables can stand side by side. The train replies are what compiled systems'
    # demos show; a reply that copies one scores 0.
    splits = load_splits(source, seed=where.seed, train_size=train, dev_size=dev)
    metric.add_copy_sources(e.response for e in splits.train)
    run = {"data": source.describe(), "view": view, "limit": len(examples), "seed": where.seed,
           "lm": lm_config.to_dict(), "program": settings.program.to_dict(), "train": train, "dev": dev}
    return {"source": source, "examples": examples, "lms": lms, "metric": metric, "retriever": retriever,
            "prior": default_prior(settings.program, source, seed=where.seed), "train": splits.train,
            "dev": splits.dev, "run": run}


RUNS = {"quality": run_quality_bench, "overhead": run_overhead, "concurrency": run_concurrency,
        "compile": run_compile_bench, "scorer": run_scorer, "emotion": run_emotion, "prior": run_prior,
        "scale": run_scale, "latency": run_latency}


def run_bench(name: str, where: Where, **options) -> BenchRun:
    """Run the benchmark ``name`` (a key of RUNS) with its ``options`` and save its record."""
    run = RUNS[name](where, **options)
    if run.out_dir is None:
        run.out_dir = save_run(where, run)
    return run
