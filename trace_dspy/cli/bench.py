"""Benchmarks: what the compiled program buys, what it costs, and the performance budget.

    python -m trace_dspy.bench                  # the quality bench (same as `bench quality`)
    python -m trace_dspy.bench quality --limit 200 --optimizers labeled,bootstrap
    python -m trace_dspy.bench overhead         # framework time per stage, zero-latency fake LM
    python -m trace_dspy.bench concurrency      # throughput by thread count, 200 ms loopback server
    python -m trace_dspy.bench embedded         # the embedded model against raw llama.cpp
    python -m trace_dspy.bench compile          # default compile, cold and then warm cache

Every sub-command prints a markdown table, writes ``<name>.md`` and
``<name>.json`` (numbers only, no dataset text) to ``--output-dir`` and logs an
MLflow run to the ``trace-dspy-bench`` experiment. The quality bench compares,
on one seeded EmpatheticDialogues test subset and one LM:

- ``single_cot``: one ChainOfThought call from dialogue to emotion and reply;
- ``trace_paper``: the staged program with instructions that restate the
  published agents' prompts, uncompiled;
- ``trace``: this project's TraceProgram, uncompiled;
- ``compiled_<optimizer>``: TraceProgram compiled on the train split by each
  optimizer given with ``--optimizers``; and any ``--artifact`` references.

Each system gets the evaluation suite, paired-bootstrap 95% intervals of its
per-example differences against the first system, and its cost per dialogue
(LM calls, prompt and completion tokens, seconds). The same functions are the
library API: ``run_quality``, ``measure_overhead``, ``measure_concurrency``,
``measure_compile``.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import tempfile
from pathlib import Path
from typing import Any

from trace_dspy.bench.suite import (
    BASE_SYSTEMS,
    BENCH_EXPERIMENT,
    CLOCKS,
    _flat_numbers,
    _machine,
    build_systems,
    compile_markdown,
    concurrency_markdown,
    emotion_markdown,
    log_quality_to_mlflow,
    measure_compile,
    measure_concurrency,
    measure_emotion,
    measure_overhead,
    measure_scorer,
    overhead_markdown,
    quality_charts,
    run_quality,
    scorer_markdown,
    without_cache,
)
from trace_dspy.cli.common import fail, failure_rate, output_dir
from trace_dspy.core.console import progress
from trace_dspy.core.jsonl import atomic_write_json
from trace_dspy.store.tracking import logged_or_warned
from trace_dspy.workflows.settings import Settings

SUBCOMMANDS = ("quality", "overhead", "concurrency", "embedded", "compile", "scorer", "emotion", "prior", "scale")


def _int_list(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError("expected integers >= 1")
    return values


def _k_list(text: str) -> list[int]:
    from trace_dspy.core.config import MAX_PRIOR_K

    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 0 or max(values) > MAX_PRIOR_K:
        raise argparse.ArgumentTypeError(f"expected integers from 0 to {MAX_PRIOR_K}")
    return values


def _names(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def build_parser() -> argparse.ArgumentParser:
    from trace_dspy.cli.common import add_data_args, add_model_args, add_situations_arg, add_tracking_args

    parser = argparse.ArgumentParser(prog="python -m trace_dspy.bench", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", metavar="{" + ",".join(SUBCOMMANDS) + "}")
    for name, help_text in (("quality", "compare systems on the same ED test subset (the default)"),
                            ("overhead", "framework time per stage call with a zero-latency fake LM"),
                            ("concurrency", "throughput by thread count against a loopback fake server"),
                            ("embedded", "the embedded model against raw llama.cpp (bench_local)"),
                            ("compile", "wall time and LM calls of the default compile, cold then warm cache"),
                            ("scorer", "milliseconds per example of the empathy metric, embeddings cold then cached"),
                            ("emotion", "emotion accuracy: majority, the fitted prior, the stage with and without it"),
                            ("prior", "the emotion prior's variants and the shipped prior on dev and all test items"),
                            ("scale", "the plain batch against Spark local mode, same items, latency-bound fake LM")):
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == "embedded":
            continue  # its flags belong to trace_dspy.bench.local
        p.add_argument("--output-dir", type=output_dir, help="where tables and JSON go (default runs/bench)")
        p.add_argument("-v", "--verbose", action="store_true")
        add_data_args(p)
        if name in ("quality", "compile", "emotion"):
            add_model_args(p)
        add_tracking_args(p)
        p.set_defaults(experiment=BENCH_EXPERIMENT)
        if name == "quality":
            p.add_argument("--limit", type=int, default=200, help="test samples, seeded (default 200)")
            p.add_argument("--view", choices=("trace", "cem"), default="trace")
            p.add_argument("--systems", type=_names, default=list(BASE_SYSTEMS),
                           help=f"uncompiled systems, the first is the baseline (default {','.join(BASE_SYSTEMS)})")
            p.add_argument("--optimizers", type=_names, default=["labeled", "bootstrap"],
                           help="compile TraceProgram with each (default labeled,bootstrap; '' for none)")
            p.add_argument("--artifact", action="append", default=[], metavar="REF",
                           help="also compare a compiled artifact (repeatable)")
            p.add_argument("--train", type=int, default=16, help="train examples for the optimizers")
            p.add_argument("--dev", type=int, default=16, help="dev examples for the optimizers")
            p.add_argument("--threads", type=int, default=1,
                           help="evaluation threads (default 1, so that seconds per dialogue are not shared)")
            p.add_argument("--max-failure-rate", type=failure_rate, default=0.5)
            p.add_argument("--fresh", action="store_true", help="ignore rows of an earlier run")
        elif name == "overhead":
            p.add_argument("--dialogues", type=int, default=100)
            p.add_argument("--warmup", type=int, default=3)
            p.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                           help="wall time, or the thread's CPU time (steadier on a shared machine)")
            p.add_argument("--trace", action="store_true",
                           help="record each dialogue as an MLflow trace, as evaluate does (a temporary store)")
        elif name == "concurrency":
            p.add_argument("--latency", type=float, default=0.2, help="server latency per call, seconds")
            p.add_argument("--levels", type=_int_list, default=[1, 2, 4, 8, 16, 32], help="thread counts")
            p.add_argument("--per-thread", type=int, default=4, help="dialogues per thread at each level")
        elif name == "emotion":
            p.add_argument("--limit", type=int, default=300, help="seeded test items for the stage (default 300)")
            p.add_argument("--k", type=_k_list, default=[0, 2, 3], help="candidate counts; 0 = the LM alone")
            p.add_argument("--prior", choices=("fitted", "shipped"), default="fitted",
                           help="fitted: fit one on the source's training side, as compile does (default); "
                                "shipped: the prior packaged with trace-dspy, as seed-set programs use")
            add_situations_arg(p)
        elif name == "prior":
            add_situations_arg(p)
        elif name == "scorer":
            p.add_argument("--limit", type=int, default=500, help="ED test items (default 500)")
        elif name == "scale":
            p.add_argument("--items", type=int, default=200, help="test dialogues, seeded (default 200)")
            p.add_argument("--latency", type=float, default=0.2, help="fake server latency per call, seconds")
            p.add_argument("--threads", type=_int_list, default=[1, 2], help="plain batch thread counts")
            p.add_argument("--master", default="local[2]", help="Spark master (default local[2])")
            p.add_argument("--partitions", type=int, default=None, help="Spark partitions (default: parallelism)")
            p.add_argument("--task-threads", type=_int_list, default=[1],
                           help="rows each Spark task answers at once, one Spark run per value (default 1)")
        elif name == "compile":
            p.add_argument("--optimizer", default=None, help="default: the compile command's default")
            p.add_argument("--train", type=int, default=16)
            p.add_argument("--dev", type=int, default=16)
    return parser


def _finish(args, argv, name: str, result: dict[str, Any], table: str) -> int:
    out_dir = args.output_dir or Path("runs/bench")
    out_dir.mkdir(parents=True, exist_ok=True)
    record = {"command": "python -m trace_dspy.bench " + shlex.join(argv), "machine": _machine(), "result": result}
    atomic_write_json(out_dir / f"{name}.json", record)
    (out_dir / f"{name}.md").write_text(f"`{record['command']}`\n\n{table}\n", encoding="utf-8")
    print(table)
    print(f"\n{name}.md and {name}.json in {out_dir}")
    if not args.no_mlflow and name != "quality":
        with logged_or_warned(out_dir):
            import mlflow

            from trace_dspy.store.tracking import mlflow_run

            with mlflow_run(tracking_uri=args.tracking_uri, experiment=args.experiment, run_name=f"bench {name}",
                            tags={"trace_dspy.kind": f"bench-{name}"}):
                mlflow.log_metrics(_flat_numbers(result))
                mlflow.log_artifact(str(out_dir / f"{name}.json"))
    return 0


def _examples_and_program(args, settings: Settings, limit: int):
    """Seeded test examples and the uncompiled program, retrieving from the same source's pool."""
    from trace_dspy.data.sources import load_test, resolve_source
    from trace_dspy.program.pipeline import TraceProgram
    from trace_dspy.workflows.loading import default_retriever

    source = resolve_source(settings.data_source(args.data), seed=args.seed)
    retriever = default_retriever(settings.program, source, seed=args.seed)
    return load_test(source, limit=limit, seed=args.seed), TraceProgram(settings.program, retriever=retriever)


def main(argv: list[str] | None = None) -> int:
    from trace_dspy.cli.common import settings_from_args, setup_logging
    from trace_dspy.core.config import ConfigError
    from trace_dspy.data.situations import resolve_situations
    from trace_dspy.data.sources import DataError

    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0].startswith("-") and argv[0] not in ("-h", "--help"):
        argv = ["quality", *argv]
    if argv[0] == "embedded":
        from trace_dspy.bench import local as bench_local

        return bench_local.main(argv[1:], prog="python -m trace_dspy.bench embedded")
    args = build_parser().parse_args(argv)
    setup_logging(args.verbose)
    if not hasattr(args, "lm"):  # sub-commands that always use fake LMs
        for key in ("config", "lm", "api_base", "api_key_env", "analysis_lm", "response_lm", "judge_lm",
                    "prompt_lm"):
            setattr(args, key, None)
    try:
        settings = settings_from_args(args)
        if args.command == "quality":
            return _quality(args, argv, settings)
        if args.command == "overhead":
            if args.dialogues < 1:
                return fail("--dialogues must be at least 1")
            examples, program = _examples_and_program(args, settings, args.dialogues)
            result = measure_overhead(examples, program, warmup=args.warmup, clock=args.clock, trace=args.trace)
            name = f"overhead-{args.clock}" + ("-traced" if args.trace else "")
            return _finish(args, argv, name, result, overhead_markdown(result))
        if args.command == "concurrency":
            if args.latency < 0 or args.per_thread < 1:
                return fail("--latency must be >= 0 and --per-thread >= 1")
            examples, program = _examples_and_program(args, settings, 64)
            result = measure_concurrency(examples, program, levels=args.levels, latency=args.latency,
                                         per_thread=args.per_thread)
            return _finish(args, argv, "concurrency", result, concurrency_markdown(result))
        if args.command == "compile":
            return _compile(args, argv, settings)
        if args.command == "emotion":
            if args.limit < 1:
                return fail("--limit must be at least 1")
            from trace_dspy.data.sources import resolve_source
            from trace_dspy.lm.specs import LMSet

            source = resolve_source(settings.data_source(args.data), seed=args.seed)
            lms = LMSet(settings.lm)
            lm = lms.stage_lms().get("recognize_emotion") or lms.default
            situations = resolve_situations(args.situations)
            with progress(desc="emotion stage", total=args.limit * len(args.k)) as bar:
                result = measure_emotion(source, lm, limit=args.limit, ks=args.k, seed=args.seed,
                                         on_item=lambda *_: bar.update(1), prior_kind=args.prior,
                                         situations=situations)
            return _finish(args, argv, "emotion", result, emotion_markdown(result))
        if args.command == "prior":
            from trace_dspy.bench.prior_variants import measure_prior_variants, prior_variants_markdown
            from trace_dspy.data.sources import resolve_source

            source = resolve_source(settings.data_source(args.data), seed=args.seed)
            result = measure_prior_variants(source, resolve_situations(args.situations), seed=args.seed,
                                            on_variant=lambda r: print(f"{r['name']}: dev {r['dev']['accuracy']:.3f}, "
                                                                       f"test {r['test']['accuracy']:.3f}",
                                                                       file=sys.stderr))
            return _finish(args, argv, "prior", result, prior_variants_markdown(result))
        if args.command == "scale":
            if args.items < 1 or args.latency < 0 or min(args.threads + args.task_threads) < 1:
                return fail("--items, --threads and --task-threads must be at least 1, and --latency >= 0")
            from trace_dspy.bench.scale import measure_scale, project, scale_markdown
            from trace_dspy.data.sources import load_test, resolve_source

            source = resolve_source(settings.data_source(args.data), seed=args.seed)
            dialogues = [e.dialogue for e in load_test(source, limit=args.items, seed=args.seed)]
            result = measure_scale(dialogues, latency=args.latency, threads=args.threads, master=args.master,
                                   partitions=args.partitions, task_threads=args.task_threads)
            result["projection"] = project(result)
            return _finish(args, argv, "scale", result, scale_markdown(result))
        if args.command == "scorer":
            if args.limit < 1:
                return fail("--limit must be at least 1")
            from trace_dspy.data.sources import load_test, resolve_source
            from trace_dspy.workflows.evaluation import build_metric

            source = resolve_source(settings.data_source(args.data), seed=args.seed)
            metric = build_metric(settings)
            if metric.scorer is None:
                return fail("the scorer bench needs the learned scorer (the 'embed' extra)")
            result = measure_scorer(load_test(source, limit=args.limit, seed=args.seed), metric)
            return _finish(args, argv, "scorer", result, scorer_markdown(result))
    except (ConfigError, DataError, FileNotFoundError, ValueError, ImportError) as exc:
        return fail(str(exc))
    except KeyboardInterrupt:
        print("\ninterrupted; finished quality rows are kept and a rerun resumes them", file=sys.stderr)
        return 130
    return fail(f"unknown command {args.command!r}")


def _quality(args, argv, settings: Settings) -> int:
    from trace_dspy.data.sources import load_splits, load_test, resolve_source
    from trace_dspy.lm.specs import LMSet
    from trace_dspy.optimize.optimizers import OPTIMIZERS
    from trace_dspy.workflows.evaluation import FailureRateExceeded, build_metric
    from trace_dspy.workflows.loading import default_prior, default_retriever

    if args.limit < 1:
        return fail("--limit must be at least 1")
    unknown = [s for s in args.systems if s not in BASE_SYSTEMS] + [o for o in args.optimizers if o not in OPTIMIZERS]
    if unknown:
        return fail(f"unknown system or optimizer: {', '.join(unknown)}; systems: {', '.join(BASE_SYSTEMS)}; "
                    f"optimizers: {', '.join(OPTIMIZERS)}")
    source = resolve_source(settings.data_source(args.data), seed=args.seed)
    examples = load_test(source, view=args.view, limit=args.limit, seed=args.seed)
    lm_config = without_cache(settings.lm)
    lms = LMSet(lm_config)
    metric = build_metric(settings, lms)
    retriever = default_retriever(settings.program, source, seed=args.seed)
    # Loaded for every run, not only when compiling: the metric is then the same whichever systems a run
    # compares, so two runs' tables can stand side by side. The train replies are what compiled systems'
    # demos show; a reply that copies one scores 0.
    splits = load_splits(source, seed=args.seed, train_size=args.train, dev_size=args.dev)
    metric.add_copy_sources(e.response for e in splits.train)
    out_dir = args.output_dir or Path("runs/bench")
    rows_dir = out_dir / "quality_rows"
    if args.fresh and rows_dir.exists():
        for path in rows_dir.glob("*.jsonl"):
            path.unlink()
    run = {"data": source.describe(), "view": args.view, "limit": len(examples), "seed": args.seed,
           "lm": lm_config.to_dict(), "program": settings.program.to_dict(), "train": args.train, "dev": args.dev}
    print(f"bench: {len(examples)} {args.view} test examples ({source.kind}: {source.location}); "
          f"rows in {rows_dir}", file=sys.stderr)
    systems = build_systems(args.systems, args.optimizers, args.artifact, settings=settings, lms=lms,
                            retriever=retriever, train=splits.train, dev=splits.dev, metric=metric,
                            optimizer_settings=settings.raw.get("optimizer"),
                            log=lambda m: print(m, file=sys.stderr),
                            prior=default_prior(settings.program, source, seed=args.seed))
    try:
        report = run_quality(systems, examples, metric, lm=lms.default, threads=args.threads, rows_dir=rows_dir,
                             max_failure_rate=args.max_failure_rate, seed=args.seed, run=run)
    except FailureRateExceeded as exc:
        return fail(str(exc), code=1)
    charts = quality_charts(report, out_dir)
    table = report.markdown()
    code = _finish(args, argv, "quality", report.to_dict(), table)
    print("charts: " + ", ".join(str(c) for c in charts))
    if not args.no_mlflow:
        with logged_or_warned(out_dir):
            run_id = log_quality_to_mlflow(report, [*charts, out_dir / "quality.md", out_dir / "quality.json"],
                                           tracking_uri=args.tracking_uri, experiment=args.experiment,
                                           params=run)
            print(f"mlflow run {run_id} (experiment {args.experiment})")
    return code


def _compile(args, argv, settings: Settings) -> int:
    from trace_dspy.optimize.optimizers import DEFAULT_OPTIMIZER
    from trace_dspy.workflows.compile import CompileConfig

    optimizer = settings.optimizer(name=args.optimizer or DEFAULT_OPTIMIZER)
    with tempfile.TemporaryDirectory(prefix="trace-bench-compile-") as tmp:
        def make_config(run: str) -> CompileConfig:
            return CompileConfig(settings=settings, optimizer=optimizer, data=settings.data_source(args.data),
                                 train=args.train, dev=args.dev, seed=args.seed, name=f"bench-{run}",
                                 artifacts_dir=str(Path(tmp) / "artifacts"), mlflow=False,
                                 command="python -m trace_dspy.bench " + shlex.join(argv))

        result = measure_compile(make_config, cache_dir=Path(tmp) / "cache")
    result = {**result, "optimizer": optimizer.settings(), "train": args.train, "dev": args.dev}
    table = compile_markdown({k: v for k, v in result.items() if k in ("cold", "warm")})
    return _finish(args, argv, "compile", result, table)


if __name__ == "__main__":
    sys.exit(main())
