"""The evaluate command's runs: each program on the same items, its rows, summary and MLflow evaluation run,
and, for two programs or more, each against the first with paired bootstrap intervals.

Rows go to ``<out_dir>/examples.jsonl`` (a rerun resumes them), the summary to ``summary.json``; a
comparison writes ``compare.json`` in its folder.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trace_dspy.core.console import heartbeat, say
from trace_dspy.core.jsonl import atomic_write_json
from trace_dspy.core.pricing import Pricing
from trace_dspy.core.tables import markdown_table
from trace_dspy.workflows.evaluation import (
    EvalResult,
    FailureRateExceeded,
    evaluate_program,
)

# The summary keys a comparison sets side by side, each with the row component its per-item values come from.
COMPARED = (("empathy", "empathy"), ("empathy_learned", "empathy"), ("strategy_fit", "strategy_fit"),
            ("relevance", "relevance"), ("emotion_acc", "emotion"))


class EvaluationInterrupted(KeyboardInterrupt):
    """Ctrl-C during an evaluation; ``rows_path`` holds the rows finished so far (a rerun resumes them)."""

    def __init__(self, rows_path: Path):
        super().__init__(str(rows_path))
        self.rows_path = rows_path


@dataclass
class RunOptions:
    """How every program of one evaluate command is run and where it is recorded."""

    split: str = "test"
    seed: int = 0
    threads: int = 4
    max_failure_rate: float | None = 0.5
    fresh: bool = False
    trace: bool = True
    command: str = ""
    output_dir: Path | None = None
    mlflow: bool = True
    tracking_uri: str | None = None
    experiment: str = "trace-dspy"
    # Prices for the cost per 1,000 dialogues in each summary (None: no cost); the record states them.
    pricing: Pricing | None = None


@dataclass
class Evaluated:
    """One program's evaluation: its result, summary, folder and MLflow run, if logged."""

    ref: str
    result: EvalResult
    summary: dict[str, Any]
    similarity_kind: str
    out_dir: Path
    mlflow_run: tuple[str, str] | None = None  # (experiment id, run id)

    @property
    def rows_path(self) -> Path:
        return self.out_dir / "examples.jsonl"


def slug(text: str) -> str:
    """A folder name for a program reference: its last 40 safe characters."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", str(text)).strip("-")[-40:] or "program"


def run_key(parts: dict[str, Any]) -> str:
    """A run's folder name: the program, split, view and size, and a digest of everything in ``parts``."""
    digest = hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:10]
    return f"{slug(parts['program'])}-{parts['split']}-{parts['view']}-n{parts['limit']}-{digest}"


def tracing_or_off(tracking_uri: str | None, experiment: str) -> bool:
    """Prepare the store for one trace per dialogue; False (with a warning) when the store is unusable."""
    from trace_dspy.store.tracking import error_line, prepare_tracing

    try:
        prepare_tracing(tracking_uri, experiment)
    except Exception as exc:  # noqa: BLE001 - the store is unusable: evaluate anyway, untraced
        say(f"warning: tracing is off ({error_line(exc)})")
        return False
    return True


def evaluate_programs(loaded: dict[str, Any], metrics: dict[str, Any], source, examples: Sequence,
                      base: dict[str, Any], options: RunOptions,
                      on_done: Callable[[Evaluated], None] = lambda e: None) -> dict[str, Evaluated]:
    """Evaluate each loaded program (reference -> loaded program) on ``examples``, in order.

    ``base`` is what identifies the run besides the program (split, view, limit, seed, data, config).
    ``on_done`` gets each evaluation as it finishes. With two programs or more, their folders sit in
    one comparison folder (see :func:`compare_dir`).
    """
    programs = list(loaded)
    shared = compare_dir(programs, base, options.output_dir)
    done: dict[str, Evaluated] = {}
    for ref in programs:
        parts = {"program": ref, **base, "metric": metrics[ref].config.to_dict()}
        if shared is not None:
            out_dir = shared / slug(ref)
        else:
            out_dir = options.output_dir or Path("runs/evaluate") / run_key(parts)
        try:
            done[ref] = evaluate_one(ref, loaded[ref], metrics[ref], source, examples, parts, out_dir, options)
        except FailureRateExceeded as exc:
            if len(programs) > 1:
                raise FailureRateExceeded(f"{ref}: {exc}", exc.reason) from exc
            raise
        on_done(done[ref])
    return done


def compare_dir(programs: Sequence[str], base: dict[str, Any], output_dir: Path | None) -> Path | None:
    """The comparison folder of two programs or more (None for one)."""
    if len(programs) < 2:
        return None
    return output_dir or Path("runs/compare") / run_key({"program": "compare", **base, "programs": list(programs)})


def evaluate_one(ref: str, loaded, metric, source, examples: Sequence, parts: dict[str, Any], out_dir: Path,
                 options: RunOptions) -> Evaluated:
    """Evaluate one program, write its rows and summary, log its evaluation run."""
    out_dir.mkdir(parents=True, exist_ok=True)
    rows_path = out_dir / "examples.jsonl"
    if options.fresh and rows_path.exists():
        rows_path.unlink()
    say(f"evaluating {ref} on {len(examples)} {options.split} examples ({source.kind}: {source.location}); "
        f"rows in {rows_path}")
    try:
        result = evaluate_program(loaded.program, examples, metric, lm=loaded.lms.default, threads=options.threads,
                                  results_path=rows_path, max_failure_rate=options.max_failure_rate,
                                  trace=options.trace, desc=ref if len(ref) <= 30 else "evaluate",
                                  pricing=options.pricing)
    except KeyboardInterrupt:
        raise EvaluationInterrupted(rows_path) from None
    summary = {**result.summary, "similarity_kind": metric.similarity_kind}
    record = {"command": options.command, "run": parts, "summary": summary,
              "data": source.describe(), "program": loaded.describe()}
    if options.pricing is not None:
        record["pricing"] = options.pricing.to_dict()
    evaluated = Evaluated(ref, result, summary, metric.similarity_kind, out_dir)
    if options.mlflow:
        with heartbeat("mlflow") as phase:
            phase.note("logging the evaluation run and its traces")
            evaluated.mlflow_run = _log_run(evaluated, record, loaded, metric, source, parts, options)
    atomic_write_json(out_dir / "summary.json", record)
    return evaluated


def _log_run(evaluated: Evaluated, record: dict, loaded, metric, source, parts: dict,
             options: RunOptions) -> tuple[str, str] | None:
    """The evaluation run in MLflow; None, with a warning, when the store fails (the files are written)."""
    from trace_dspy.store.tracking import (
        log_evaluation_run,
        logged_or_warned,
        numeric_metrics,
    )

    split, view = options.split, parts["view"]
    params = {"program_ref": evaluated.ref, "split": split, "view": view, "limit": parts["limit"],
              "seed": options.seed, "data": source.describe(), "config": parts["config"],
              "metric": metric.config.to_dict(),
              **({"pricing": options.pricing.to_dict()} if options.pricing is not None else {})}
    dataset = {**source.describe(), "split": split, "view": view, "seed": options.seed}
    with logged_or_warned(evaluated.out_dir):
        return log_evaluation_run(evaluated.out_dir, record, evaluated.result.rows,
                                  tracking_uri=options.tracking_uri, experiment=options.experiment,
                                  run_name=f"evaluate {evaluated.ref}", params=params,
                                  metrics=numeric_metrics(evaluated.summary, split), dataset=dataset,
                                  manifest=loaded.manifest)
    return None


def _values(rows, key: str, component: str) -> list[float]:
    if key == "empathy":
        return [float(r.get("score", 0.0)) for r in rows]
    if key == "emotion_acc":
        return [float((r.get("prediction") or {}).get("emotion") == r.get("gold_emotion")) for r in rows]
    return [0.0 if "error" in r else float((r.get("components") or {}).get(component) or 0.0) for r in rows]


def compare_programs(done: dict[str, Evaluated], base: dict[str, Any], out_dir: Path, *, seed: int,
                     command: str) -> str:
    """Each program against the first on the same items: means and paired bootstrap 95% CIs.

    Writes ``compare.json`` to ``out_dir``; returns the table with its heading line.
    """
    from trace_dspy.optimize.scorers import paired_bootstrap_ci

    programs = list(done)
    first = done[programs[0]].result.rows
    table, cells = {}, []
    for ref in programs:
        rows, summ = done[ref].result.rows, done[ref].result.summary
        entry = {k: summ.get(k) for k in ("n", "failed", "empathy", "empathy_learned", "strategy_fit", "relevance",
                                         "emotion_acc", "dist2", "parrot_rate", "copied_rate")}
        row = [ref]
        for key, component in COMPARED:
            row.append(f"{summ[key]:.4f}" if isinstance(summ.get(key), float) else "-")
            if ref != programs[0]:
                diff, low, high = paired_bootstrap_ci(_values(rows, key, component), _values(first, key, component),
                                                      seed=seed)
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
    atomic_write_json(out_dir / "compare.json", {"command": command, "run": {**base, "programs": programs},
                                                 "table": table})
    return (f"\n{len(first)} items, each program against {programs[0]} (paired bootstrap, seed {seed}):\n"
            + markdown_table(headers + ["Dist-2", "failed"], cells))
