"""Evaluate a program on EmpatheticDialogues and log the run to MLflow.

    python -m trace_dspy.evaluate --program default --split test --limit 100
    python -m trace_dspy.evaluate --program artifacts/trace-dspy/v0001 --view cem --limit 500
    python -m trace_dspy.evaluate --program default --stage emotion --limit 0

Prints a table, writes per-example rows (``examples.jsonl``) and a summary
(``summary.json``) to ``--output-dir``, and logs an MLflow run. Rerunning the
same command resumes an interrupted run from its rows; ``--fresh`` starts over.
``--stage emotion`` runs only the emotion prior and ``recognize_emotion``
(trace_dspy.workflows.emotion_eval): label and group accuracy, the prior's
top-3, macro-F1, and ``confusion.png`` beside the rows.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import dspy

from trace_dspy.cli.common import (
    add_run_args,
    command_line,
    command_parser,
    fail,
    failure_rate,
    output_dir,
    pricing_from_args,
    settings_from_args,
    setup_logging,
)
from trace_dspy.core.pricing import COST_KEY, DIALOGUES
from trace_dspy.core.config import ConfigError
from trace_dspy.core.console import out, say
from trace_dspy.data.sources import DataError, load_splits, load_test, resolve_source
from trace_dspy.store.tracking import not_logged_count
from trace_dspy.workflows.ablation import run_ablation
from trace_dspy.workflows.evaluation import (
    ABLATIONS,
    TABLE_KEYS,
    FailureRateExceeded,
    build_metric,
    demo_replies,
    format_table,
)
from trace_dspy.workflows.evaluation_runs import (
    Evaluated,
    EvaluationInterrupted,
    RunOptions,
    compare_dir,
    compare_programs,
    evaluate_programs,
    run_key,
    tracing_or_off,
)
from trace_dspy.workflows.preflight import (
    PreflightError,
    check_output_folder,
    check_run_settings,
)

LOAD_ERRORS = (ConfigError, DataError, FileNotFoundError, RuntimeError, ImportError, ValueError)


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    parser = command_parser("evaluate", __doc__, prog)
    parser.add_argument("--program", action="append", default=None,
                        help="'default' (uncompiled, the default), an artifact folder, a program.json, or an artifact "
                             "reference; give it twice or more to compare programs on the same items (paired "
                             "bootstrap CIs against the first, one MLflow evaluation run each)")
    parser.add_argument("--no-trace", action="store_true",
                        help="do not record one MLflow trace per dialogue (on by default; off with --no-mlflow)")
    parser.add_argument("--stage", choices=("full", "emotion"), default="full",
                        help="full: every stage, every reply scored (the default); emotion: only the emotion prior "
                             "and recognize_emotion against the gold labels (accuracy, Ekman group accuracy, the "
                             "prior's top-3, macro-F1, a per-label table and confusion.png); --limit 0 = all items")
    parser.add_argument("--split", choices=("test", "dev"), default="test")
    parser.add_argument("--view", choices=("trace", "cem"), default="trace", help="test view (default trace)")
    parser.add_argument("--limit", type=int, default=100, help="number of examples, seeded sample (default 100)")
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--max-failure-rate", type=failure_rate, default=0.5,
                        help="stop when more than this share of examples fails (default 0.5)")
    parser.add_argument("--output-dir", type=output_dir, help="where rows and summary go (default runs/evaluate/<run key>)")
    parser.add_argument("--fresh", action="store_true", help="ignore rows of an earlier run of the same command")
    parser.add_argument("--ablation", nargs="?", const=",".join(ABLATIONS), metavar="NAMES",
                        help="evaluate named variants of the program on the same examples, with paired "
                             f"bootstrap CIs against 'full' (default: all of {', '.join(ABLATIONS)})")
    add_run_args(parser, pricing=True)
    return parser


def load_examples(args, source) -> list[dspy.Example]:
    if args.split == "test":
        return load_test(source, view=args.view, limit=args.limit, seed=args.seed)
    return load_splits(source, seed=args.seed, dev_size=args.limit).dev


def run_options(args, argv: list[str], *, trace: bool = False) -> RunOptions:
    return RunOptions(split=args.split, seed=args.seed, threads=args.threads, max_failure_rate=args.max_failure_rate,
                      fresh=args.fresh, trace=trace, command=command_line("evaluate", argv),
                      output_dir=args.output_dir, mlflow=not args.no_mlflow, tracking_uri=args.tracking_uri,
                      experiment=args.experiment, pricing=pricing_from_args(args))


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser(prog).parse_args(argv)
    setup_logging(args.verbose)
    try:
        preflight(args)
    except PreflightError as exc:
        return fail(str(exc))
    warned = not_logged_count()
    code = run_emotion_stage(args, argv) if args.stage == "emotion" else _run(args, argv)
    # Results that did not reach MLflow were named in a warning line (with where they are): not a success.
    return 1 if code == 0 and not_logged_count() > warned else code


def preflight(args) -> None:
    """The settings this run reads and the places it writes, checked before anything is loaded or evaluated
    (``PreflightError``)."""
    check_run_settings(args.tracking_uri, tracked=not args.no_mlflow)
    if args.output_dir is not None:
        check_output_folder(args.output_dir, "--output-dir")
    else:
        check_output_folder(Path("runs/compare" if len(args.program or ()) > 1 else "runs/evaluate"),
                            "the output folder")


def _run(args, argv: list[str]) -> int:
    """Evaluate the programs (or the ablation's variants) of a full-stage run; the exit code."""
    programs = args.program or ["default"]
    if args.limit is not None and args.limit < 1:
        return fail("--limit must be at least 1")
    if len(set(programs)) != len(programs):
        return fail("give each --program once")
    if args.ablation and programs != ["default"]:
        return fail("--ablation varies the configured program; use it with --program default")
    try:
        settings, source, examples, loaded, metrics = _load(args, programs)
    except LOAD_ERRORS as exc:
        return fail(str(exc))
    try:
        if args.ablation:
            report = run_ablation(settings, source, examples, metrics["default"], args.ablation.split(","),
                                  view=args.view, options=run_options(args, argv))
            out(report.markdown)
            out(f"rows and ablation.json in {report.out_dir}")
            return 0
        trace = not (args.no_mlflow or args.no_trace) and tracing_or_off(args.tracking_uri, args.experiment)
        base = {"split": args.split, "view": args.view if args.split == "test" else "longest", "limit": len(examples),
                "seed": args.seed, "data": source.fingerprint, "config": settings.to_dict()}
        options = run_options(args, argv, trace=trace)
        done = evaluate_programs(loaded, metrics, source, examples, base, options,
                                 on_done=lambda one: _print_one(one, options.pricing))
    except ConfigError as exc:
        return fail(str(exc))
    except FailureRateExceeded as exc:
        return fail(str(exc), code=1)
    except EvaluationInterrupted as exc:
        say(f"\ninterrupted; finished rows are in {exc.rows_path}. Rerun the same command to resume.")
        return 130
    if len(programs) > 1:
        _print_comparison(args, argv, done, base)
    return 0


def _load(args, programs: list[str]):
    """Settings, data source, examples, and each program with its metric; every program loads before any is
    evaluated, so a bad reference fails in seconds."""
    from trace_dspy.workflows.loading import load_for_run

    settings = settings_from_args(args)
    source = resolve_source(settings.data_source(args.data), seed=args.seed)  # loud notice for the seed set
    examples = load_examples(args, source)
    loaded = {ref: load_for_run(ref, settings, data=source, seed=args.seed) for ref in programs}
    metrics = {}
    for ref, item in loaded.items():
        metrics[ref] = build_metric(settings, item.lms)
        metrics[ref].add_copy_sources(demo_replies(item.program))
    return settings, source, examples, loaded, metrics


def _print_one(done: Evaluated, pricing=None) -> None:
    out(format_table({done.ref: done.summary}, [k for k in TABLE_KEYS if k in done.summary]))
    if pricing is not None and done.summary.get(COST_KEY) is not None:
        out(f"cost on a hosted LM: USD {done.summary[COST_KEY]:.4f} per {DIALOGUES:,} dialogues at "
            f"{pricing.describe()} (the LM calls that reached the model)")
    out(f"similarity: {done.similarity_kind}; rows: {done.rows_path}; summary: {done.out_dir / 'summary.json'}")
    if done.mlflow_run:
        out(f"mlflow evaluation run {done.mlflow_run[1]}")


def _print_comparison(args, argv: list[str], done: dict[str, Evaluated], base: dict) -> None:
    programs = list(done)
    out_dir = compare_dir(programs, base, args.output_dir)
    out(compare_programs(done, base, out_dir, seed=args.seed, command=command_line("evaluate", argv)))
    out(f"compare.json in {out_dir}")
    first = done[programs[0]].mlflow_run
    if first:
        # The UI's dialogue-by-dialogue view of two evaluation runs (MLflow 3's Evaluation runs page).
        experiment, first_id = first
        for ref in programs[1:]:
            if done[ref].mlflow_run:
                out(f"{ref} against {programs[0]} in the MLflow UI: #/experiments/{experiment}/evaluation-runs"
                    f"?selectedRunUuid={done[ref].mlflow_run[1]}&compareToRunUuid={first_id}")


def run_emotion_stage(args, argv: list[str]) -> int:
    """--stage emotion: the emotion part of one program against the gold labels (workflows.emotion_eval)."""
    from trace_dspy.core.jsonl import ForeignFileError
    from trace_dspy.workflows.emotion_eval import (
        HEADLINE_KEYS,
        ROWS_FILE,
        prepare_emotion_eval,
        run_emotion_eval,
    )

    programs = args.program or ["default"]
    if len(programs) > 1 or args.ablation:
        return fail("--stage emotion evaluates one --program, without --ablation")
    if args.limit < 0:
        return fail("--limit must be 0 (every item) or more")
    try:
        settings = settings_from_args(args)
        setup = prepare_emotion_eval(programs[0], settings, data=args.data, split=args.split, view=args.view,
                                     limit=args.limit or None, seed=args.seed)
    except (ConfigError, DataError, FileNotFoundError, RuntimeError, ImportError, ValueError) as exc:
        return fail(str(exc))
    out_dir = args.output_dir or Path("runs/evaluate") / f"{run_key(setup.key())}-emotion"
    say(f"emotion stage of {programs[0]} on {len(setup.items)} {args.split} items ({setup.source.kind}: "
        f"{setup.source.location}); rows in {out_dir / ROWS_FILE}")
    try:
        result = run_emotion_eval(setup, out_dir=out_dir, threads=args.threads, fresh=args.fresh,
                                  command=command_line("evaluate", argv), mlflow=not args.no_mlflow,
                                  tracking_uri=args.tracking_uri, experiment=args.experiment)
    except ForeignFileError as exc:
        return fail(str(exc))
    except KeyboardInterrupt:
        say(f"\ninterrupted; finished rows are in {out_dir / ROWS_FILE}. Rerun the same command to resume.")
        return 130
    summary = result.summary
    out(format_table({programs[0]: summary}, HEADLINE_KEYS))
    out(f"emotion path: {summary['emotion_path']}; lm: {summary['lm']}; {summary['seconds']:.1f} s")
    out(f"rows: {result.rows_path}; summary: {result.summary_path}; confusion matrix: {result.confusion_path}")
    if result.mlflow_run_id:
        out(f"mlflow evaluation run {result.mlflow_run_id}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
