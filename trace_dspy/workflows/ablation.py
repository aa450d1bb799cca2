"""Ablations: named variants of the configured program on the same items, each against ``full`` with paired
bootstrap intervals (``evaluate --ablation``).

Each variant's rows go to ``<out_dir>/<variant>/examples.jsonl`` (a rerun resumes them); the table goes to
``ablation.json`` and, unless MLflow is off, to one parent run with a nested run per variant.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from trace_dspy.core.console import say
from trace_dspy.core.jsonl import atomic_write_json
from trace_dspy.core.tables import markdown_table
from trace_dspy.workflows.evaluation import (
    FailureRateExceeded,
    ablation_configs,
    evaluate_program,
)
from trace_dspy.workflows.evaluation_runs import RunOptions, run_key
from trace_dspy.workflows.settings import Settings

COMPONENTS = ("empathy", "strategy_fit", "relevance", "emotion")
HEADERS = ["variant", "empathy", "diff vs full [95% CI]", "learned empathy", "strategy fit", "relevance",
           "emotion_acc", "similarity", "rules", "Dist-2", "collapsed", "failed", "replies written", "s/dialogue"]


@dataclass
class AblationReport:
    """The variants' table (markdown), its JSON form by variant, and the folder it was written to."""

    markdown: str
    table: dict[str, dict[str, Any]]
    out_dir: Path


def run_ablation(settings: Settings, source, examples: Sequence, metric, names: Sequence[str], *, view: str,
                 options: RunOptions) -> AblationReport:
    """Evaluate each named variant (``ablation_configs``) on ``examples``; paired bootstrap CIs against 'full'.

    Raises ConfigError for an unknown variant and FailureRateExceeded (naming the variant) when one fails.
    """
    from trace_dspy.workflows.loading import load_for_run

    configs = ablation_configs(settings, [n for n in names if n])
    parts = {"ablation": sorted(configs), "split": options.split, "view": view, "limit": len(examples),
             "seed": options.seed, "data": source.fingerprint, "config": settings.to_dict()}
    out_dir = options.output_dir or Path("runs/ablation") / run_key({"program": "ablation", **parts})
    results = {}
    for name, program_config in configs.items():
        loaded = load_for_run("default", replace(settings, program=program_config), data=source, seed=options.seed)
        rows_path = out_dir / name / "examples.jsonl"
        rows_path.parent.mkdir(parents=True, exist_ok=True)
        if options.fresh and rows_path.exists():
            rows_path.unlink()
        say(f"ablation {name}: {len(examples)} examples, rows in {rows_path}")
        try:
            results[name] = evaluate_program(loaded.program, examples, metric, lm=loaded.lms.default,
                                             threads=options.threads, results_path=rows_path,
                                             max_failure_rate=options.max_failure_rate, desc=name)
        except FailureRateExceeded as exc:
            raise FailureRateExceeded(f"{name}: {exc}", exc.reason) from exc
    table, cells = _table(results, seed=options.seed)
    atomic_write_json(out_dir / "ablation.json", {"command": options.command, "run": parts, "table": table})
    if options.mlflow:
        _log(out_dir, table, configs, parts, options)
    return AblationReport(markdown_table(HEADERS, cells, align="lrrrrrrrrrlrrr"), table, out_dir)


def _component(rows, name: str) -> list[float]:
    """A metric part per row; failed rows and missing parts count 0, as in the composite."""
    return [0.0 if "error" in r else float((r.get("components") or {}).get(name) or 0.0) for r in rows]


def _table(results: dict[str, Any], *, seed: int) -> tuple[dict[str, dict[str, Any]], list[list[Any]]]:
    """Each variant's summary with its paired differences against 'full', and the markdown rows."""
    from trace_dspy.optimize.scorers import paired_bootstrap_ci

    full_rows = results["full"].rows
    full = [r.get("score", 0.0) for r in full_rows]
    table, cells = {}, []
    for name, result in results.items():
        diff, low, high = paired_bootstrap_ci([r.get("score", 0.0) for r in result.rows], full, seed=seed)
        summ = result.summary
        paired = {part: list(paired_bootstrap_ci(_component(result.rows, part), _component(full_rows, part),
                                                 seed=seed))
                  for part in COMPONENTS}
        table[name] = {**{k: v for k, v in summ.items() if k != "distributions"},
                       "diff_vs_full": diff, "ci_low": low, "ci_high": high, "paired_components_vs_full": paired}
        ci = "-" if name == "full" else f"{diff:+.4f} [{low:+.4f}, {high:+.4f}]"
        parts = [f"{summ[k]:.4f}" if isinstance(summ.get(k), float) else "-"
                 for k in ("empathy_learned", "strategy_fit", "relevance", "emotion_acc", "similarity", "rules")]
        cells.append([name, f"{summ['empathy']:.4f}", ci, *parts, f"{summ.get('dist2', 0):.1f}",
                      "yes" if summ.get("collapsed") else "no", summ["failed"],
                      f"{summ.get('reply_candidates_per_dialogue', 1.0):.2f}",
                      f"{summ.get('seconds_per_dialogue', 0):.1f}"])
    return table, cells


def _log(out_dir: Path, table: dict, configs: dict, parts: dict, options: RunOptions) -> None:
    """One parent run holding ablation.json, with a nested run per variant; a warning if the store fails."""
    from trace_dspy.store.tracking import (
        log_record_run,
        logged_or_warned,
        numeric_metrics,
    )

    variants = {name: ({"variant": name, "program": configs[name].to_dict()}, numeric_metrics(row, options.split))
                for name, row in table.items()}
    with logged_or_warned(out_dir):
        log_record_run(out_dir / "ablation.json", {}, tracking_uri=options.tracking_uri,
                       experiment=options.experiment, run_name="ablation", kind="ablation",
                       params={"split": options.split, "view": parts["view"], "limit": parts["limit"],
                               "seed": options.seed, "variants": ",".join(configs)},
                       variants=variants)
