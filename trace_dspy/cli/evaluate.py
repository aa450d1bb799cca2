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
import hashlib
import json
import re
import sys
from pathlib import Path
from typing import Any

import dspy

from trace_dspy.cli.common import (
    Settings,
    add_data_args,
    add_model_args,
    add_tracking_args,
    command_line,
    fail,
    failure_rate,
    output_dir,
    settings_from_args,
    setup_logging,
)
from trace_dspy.core.config import ConfigError
from trace_dspy.core.jsonl import atomic_write_json
from trace_dspy.core.tables import markdown_table
from trace_dspy.data.sources import DataError, load_splits, load_test, resolve_source
from trace_dspy.store.tracking import (
    log_params,
    logged_or_warned,
    mlflow_run,
    numeric_metrics,
)
from trace_dspy.workflows.evaluation import (
    ABLATIONS,
    TABLE_KEYS,
    FailureRateExceeded,
    ablation_configs,
    build_metric,
    demo_replies,
    evaluate_program,
    format_table,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m trace_dspy.evaluate", description=__doc__.split("\n\n")[0])
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
    parser.add_argument("-v", "--verbose", action="store_true")
    add_data_args(parser)
    add_model_args(parser)
    add_tracking_args(parser)
    return parser


def load_examples(args, source) -> list[dspy.Example]:
    if args.split == "test":
        return load_test(source, view=args.view, limit=args.limit, seed=args.seed)
    return load_splits(source, seed=args.seed, dev_size=args.limit).dev


def run_key(parts: dict[str, Any]) -> str:
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", str(parts["program"])).strip("-")[-40:] or "program"
    digest = hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:10]
    return f"{slug}-{parts['split']}-{parts['view']}-n{parts['limit']}-{digest}"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    setup_logging(args.verbose)
    if args.stage == "emotion":
        return run_emotion_stage(args, argv)
    programs = args.program or ["default"]
    if args.limit is not None and args.limit < 1:
        return fail("--limit must be at least 1")
    if len(set(programs)) != len(programs):
        return fail("give each --program once")
    try:
        settings = settings_from_args(args)
        source = resolve_source(settings.data_source(args.data), seed=args.seed)  # loud notice for the seed set
        examples = load_examples(args, source)
        from trace_dspy.workflows.loading import load_for_run

        # Every program loads before any is evaluated, so a bad reference fails in seconds.
        loaded = {ref: load_for_run(ref, settings, data=source, seed=args.seed) for ref in programs}
        metrics = {}
        for ref, item in loaded.items():
            metrics[ref] = build_metric(settings, item.lms)
            metrics[ref].add_copy_sources(demo_replies(item.program))
    except (ConfigError, DataError, FileNotFoundError, RuntimeError, ImportError, ValueError) as exc:
        return fail(str(exc))

    if args.ablation:
        if programs != ["default"]:
            return fail("--ablation varies the configured program; use it with --program default")
        return run_ablation(args, argv, settings, source, examples, metrics["default"])

    trace = not (args.no_mlflow or args.no_trace)
    if trace:
        try:
            from trace_dspy.store.tracking import prepare_tracing

            prepare_tracing(args.tracking_uri, args.experiment)
        except Exception as exc:  # noqa: BLE001 - the store is unusable: evaluate anyway, untraced
            print(f"warning: tracing is off ({type(exc).__name__}: {exc})", file=sys.stderr)
            trace = False
    base = {"split": args.split, "view": args.view if args.split == "test" else "longest", "limit": len(examples),
            "seed": args.seed, "data": source.fingerprint, "config": settings.to_dict()}
    compare_dir = None
    if len(programs) > 1:
        compare_dir = args.output_dir or Path("runs/compare") / run_key({"program": "compare", **base,
                                                                          "programs": programs})
    results, mlflow_runs = {}, {}
    for ref in programs:
        parts = {"program": ref, **base, "metric": metrics[ref].config.to_dict()}
        if compare_dir is not None:
            out_dir = compare_dir / (re.sub(r"[^A-Za-z0-9_.-]+", "-", ref).strip("-")[-40:] or "program")
        else:
            out_dir = args.output_dir or Path("runs/evaluate") / run_key(parts)
        code = _evaluate_one(args, argv, ref, loaded[ref], metrics[ref], source, examples, parts, out_dir, trace,
                             results, mlflow_runs)
        if code:
            return code
    if compare_dir is not None:
        _print_comparison(args, argv, programs, results, base, compare_dir)
        if programs[0] in mlflow_runs:
            # The UI's dialogue-by-dialogue view of two evaluation runs (MLflow 3's Evaluation runs page).
            experiment, first = mlflow_runs[programs[0]]
            for ref in programs[1:]:
                if ref in mlflow_runs:
                    print(f"{ref} against {programs[0]} in the MLflow UI: #/experiments/{experiment}/evaluation-runs"
                          f"?selectedRunUuid={mlflow_runs[ref][1]}&compareToRunUuid={first}")
    return 0


def _evaluate_one(args, argv, ref: str, loaded, metric, source, examples, parts: dict, out_dir: Path, trace: bool,
                  results: dict, mlflow_runs: dict) -> int:
    """Evaluate one program, write its rows and summary, log its evaluation run; 0 or an exit status."""
    out_dir.mkdir(parents=True, exist_ok=True)
    rows_path = out_dir / "examples.jsonl"
    if args.fresh and rows_path.exists():
        rows_path.unlink()
    print(f"evaluating {ref} on {len(examples)} {args.split} examples ({source.kind}: {source.location}); "
          f"rows in {rows_path}", file=sys.stderr)
    try:
        result = evaluate_program(loaded.program, examples, metric, lm=loaded.lms.default, threads=args.threads,
                                  results_path=rows_path, max_failure_rate=args.max_failure_rate, trace=trace,
                                  desc=ref if len(ref) <= 30 else "evaluate")
    except FailureRateExceeded as exc:
        return fail(f"{ref}: {exc}" if args.program and len(args.program) > 1 else str(exc), code=1)
    except KeyboardInterrupt:
        print(f"\ninterrupted; finished rows are in {rows_path}. Rerun the same command to resume.", file=sys.stderr)
        return 130

    summary = {**result.summary, "similarity_kind": metric.similarity_kind}
    record = {"command": command_line("evaluate", argv), "run": parts, "summary": summary,
              "data": source.describe(), "program": loaded.describe()}
    results[ref] = result
    print(format_table({ref: summary}, [k for k in TABLE_KEYS if k in summary]))
    print(f"similarity: {metric.similarity_kind}; rows: {rows_path}; summary: {out_dir / 'summary.json'}")

    if not args.no_mlflow:
        with logged_or_warned(out_dir):
            with mlflow_run(tracking_uri=args.tracking_uri, experiment=args.experiment,
                            run_name=f"evaluate {ref}", tags={"trace_dspy.kind": "evaluate"}) as run:
                import mlflow

                from trace_dspy.store.evaluations import log_evaluation, logged_model_id

                log_params({"program_ref": ref, "split": args.split, "view": parts["view"],
                            "limit": len(examples), "seed": args.seed, "data": source.describe(),
                            "config": parts["config"], "metric": metric.config.to_dict()})
                mlflow.log_metrics(numeric_metrics(summary, args.split))
                dataset = {**source.describe(), "split": args.split, "view": parts["view"], "seed": args.seed}
                record["mlflow"] = {"run_id": run.info.run_id,
                                    "scorer_means": log_evaluation(result.rows, dataset=dataset,
                                                                   model_id=logged_model_id(loaded.manifest))}
                atomic_write_json(out_dir / "summary.json", record)
                mlflow.log_artifacts(str(out_dir), artifact_path="evaluation")
                print(f"mlflow evaluation run {run.info.run_id}")
                mlflow_runs[ref] = (run.info.experiment_id, run.info.run_id)
    atomic_write_json(out_dir / "summary.json", record)
    return 0


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
    print(f"emotion stage of {programs[0]} on {len(setup.items)} {args.split} items ({setup.source.kind}: "
          f"{setup.source.location}); rows in {out_dir / ROWS_FILE}", file=sys.stderr)
    try:
        result = run_emotion_eval(setup, out_dir=out_dir, threads=args.threads, fresh=args.fresh,
                                  command=command_line("evaluate", argv), mlflow=not args.no_mlflow,
                                  tracking_uri=args.tracking_uri, experiment=args.experiment)
    except ForeignFileError as exc:
        return fail(str(exc))
    except KeyboardInterrupt:
        print(f"\ninterrupted; finished rows are in {out_dir / ROWS_FILE}. Rerun the same command to resume.",
              file=sys.stderr)
        return 130
    summary = result.summary
    print(format_table({programs[0]: summary}, HEADLINE_KEYS))
    print(f"emotion path: {summary['emotion_path']}; lm: {summary['lm']}; {summary['seconds']:.1f} s")
    print(f"rows: {result.rows_path}; summary: {result.summary_path}; confusion matrix: {result.confusion_path}")
    if result.mlflow_run_id:
        print(f"mlflow evaluation run {result.mlflow_run_id}")
    return 0


COMPARED = (("empathy", "empathy"), ("empathy_learned", "empathy"), ("strategy_fit", "strategy_fit"),
            ("relevance", "relevance"), ("emotion_acc", "emotion"))


def _print_comparison(args, argv, programs: list[str], results: dict, base: dict, out_dir: Path) -> None:
    """Each program against the first on the same items: means and paired bootstrap 95% CIs."""
    from trace_dspy.optimize.scorers import paired_bootstrap_ci

    def values(rows, key, component):
        if key == "empathy":
            return [float(r.get("score", 0.0)) for r in rows]
        if key == "emotion_acc":
            return [float((r.get("prediction") or {}).get("emotion") == r.get("gold_emotion")) for r in rows]
        return [0.0 if "error" in r else float((r.get("components") or {}).get(component) or 0.0) for r in rows]

    first = results[programs[0]].rows
    table, cells = {}, []
    for ref in programs:
        rows, summ = results[ref].rows, results[ref].summary
        entry = {k: summ.get(k) for k in ("n", "failed", "empathy", "empathy_learned", "strategy_fit", "relevance",
                                         "emotion_acc", "dist2", "parrot_rate", "copied_rate")}
        row = [ref]
        for key, component in COMPARED:
            mine = values(rows, key, component)
            row.append(f"{summ[key]:.4f}" if isinstance(summ.get(key), float) else "-")
            if ref != programs[0]:
                diff, low, high = paired_bootstrap_ci(mine, values(first, key, component), seed=args.seed)
                entry[f"{key}_diff"] = [diff, low, high]
                row.append(f"{diff:+.4f} [{low:+.4f}, {high:+.4f}]")
            else:
                row.append("-")
        row += [f"{summ.get('dist2', 0.0):.1f}", str(summ.get("failed", 0))]
        table[ref] = entry
        cells.append(row)
    headers = ["program"]
    for key, _ in COMPARED:
        headers += [key, f"{key} vs {programs[0]} [95% CI]"]
    print(f"\n{len(first)} items, each program against {programs[0]} (paired bootstrap, seed {args.seed}):")
    print(markdown_table(headers + ["Dist-2", "failed"], cells))
    atomic_write_json(out_dir / "compare.json", {"command": command_line("evaluate", argv),
                                                 "run": {**base, "programs": programs}, "table": table})
    print(f"compare.json in {out_dir}")


def run_ablation(args, argv, settings: Settings, source, examples, metric) -> int:
    """Evaluate each variant on the same examples; paired bootstrap CIs against 'full'."""
    from dataclasses import replace

    from trace_dspy.optimize.scorers import paired_bootstrap_ci
    from trace_dspy.workflows.loading import load_for_run

    try:
        configs = ablation_configs(settings, [n for n in args.ablation.split(",") if n])
    except ConfigError as exc:
        return fail(str(exc))
    parts = {"ablation": sorted(configs), "split": args.split, "view": args.view, "limit": len(examples),
             "seed": args.seed, "data": source.fingerprint, "config": settings.to_dict()}
    out_dir = args.output_dir or Path("runs/ablation") / run_key({"program": "ablation", **parts})
    results = {}
    for name, program_config in configs.items():
        variant = replace(settings, program=program_config)
        loaded = load_for_run("default", variant, data=source, seed=args.seed)
        rows_path = out_dir / name / "examples.jsonl"
        rows_path.parent.mkdir(parents=True, exist_ok=True)
        if args.fresh and rows_path.exists():
            rows_path.unlink()
        print(f"ablation {name}: {len(examples)} examples, rows in {rows_path}", file=sys.stderr)
        try:
            results[name] = evaluate_program(loaded.program, examples, metric, lm=loaded.lms.default,
                                             threads=args.threads, results_path=rows_path,
                                             max_failure_rate=args.max_failure_rate, desc=name)
        except FailureRateExceeded as exc:
            return fail(f"{name}: {exc}", code=1)
    full = [r.get("score", 0.0) for r in results["full"].rows]

    def component(rows, name):  # failed rows and missing parts count 0, as in the composite
        return [0.0 if "error" in r else float((r.get("components") or {}).get(name) or 0.0) for r in rows]

    table_rows = []
    table = {}
    for name, result in results.items():
        scores = [r.get("score", 0.0) for r in result.rows]
        diff, low, high = paired_bootstrap_ci(scores, full, seed=args.seed)
        summ = result.summary
        paired = {part: list(paired_bootstrap_ci(component(result.rows, part), component(results["full"].rows, part),
                                                 seed=args.seed))
                  for part in ("empathy", "strategy_fit", "relevance", "emotion")}
        table[name] = {**{k: v for k, v in summ.items() if k != "distributions"},
                       "diff_vs_full": diff, "ci_low": low, "ci_high": high,
                       "paired_components_vs_full": paired}
        ci = "-" if name == "full" else f"{diff:+.4f} [{low:+.4f}, {high:+.4f}]"
        cells = [f"{summ[k]:.4f}" if isinstance(summ.get(k), float) else "-"
                 for k in ("empathy_learned", "strategy_fit", "relevance", "emotion_acc", "similarity", "rules")]
        table_rows.append([name, f"{summ['empathy']:.4f}", ci, *cells, f"{summ.get('dist2', 0):.1f}",
                           "yes" if summ.get("collapsed") else "no", summ["failed"],
                           f"{summ.get('reply_candidates_per_dialogue', 1.0):.2f}",
                           f"{summ.get('seconds_per_dialogue', 0):.1f}"])
    print(markdown_table(["variant", "empathy", "diff vs full [95% CI]", "learned empathy", "strategy fit", "relevance",
                          "emotion_acc", "similarity", "rules", "Dist-2", "collapsed", "failed", "replies written",
                          "s/dialogue"], table_rows, align="lrrrrrrrrrlrrr"))
    atomic_write_json(out_dir / "ablation.json", {"command": command_line("evaluate", argv),
                                                  "run": parts, "table": table})
    print(f"rows and ablation.json in {out_dir}")
    if not args.no_mlflow:
        with logged_or_warned(out_dir):
            import mlflow

            with mlflow_run(tracking_uri=args.tracking_uri, experiment=args.experiment, run_name="ablation",
                            tags={"trace_dspy.kind": "ablation"}):
                log_params({"split": args.split, "view": args.view, "limit": len(examples), "seed": args.seed,
                            "variants": ",".join(configs)})
                for name, row in table.items():
                    with mlflow_run(tracking_uri=args.tracking_uri, experiment=args.experiment,
                                    run_name=f"ablation {name}", tags={"trace_dspy.kind": "ablation-variant"},
                                    nested=True):
                        log_params({"variant": name, "program": configs[name].to_dict()})
                        mlflow.log_metrics(numeric_metrics(row, args.split))
                mlflow.log_artifact(str(out_dir / "ablation.json"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
