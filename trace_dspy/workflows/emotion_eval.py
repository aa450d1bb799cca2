"""The emotion part of a program on its own: the prior's candidates and ``recognize_emotion``, against gold labels.

``python -m trace_dspy.evaluate --stage emotion`` runs it. Each item gets one row (id, gold, predicted,
candidates: the prior's three most likely labels, correct), appended as it finishes so that an interrupted
run resumes; the summary holds accuracy over the 32 labels and the 6 Ekman groups, the prior's top-3 hit
rate, macro-F1 and a per-label table; ``confusion.png`` is the row-normalised 32x32 confusion matrix, its
labels grouped by Ekman group. No later stage runs, so no reply is written or scored.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dspy

from trace_dspy.core.console import progress, with_dspy_context
from trace_dspy.core.jsonl import AppendWriter, atomic_write_json, read_records
from trace_dspy.core.labels import EKMAN_GROUPS, EMOTION_TO_GROUP, EMOTIONS, ekman_group
from trace_dspy.core.safety import redact
from trace_dspy.lm.specs import fresh_calls, use_lm
from trace_dspy.optimize.scorers import emotion_accuracy, group_accuracy, macro_f1
from trace_dspy.store.tracking import DEFAULT_EXPERIMENT
from trace_dspy.workflows.loading import LoadedProgram
from trace_dspy.workflows.settings import Settings

TOP_K = 3
ROWS_FILE, SUMMARY_FILE, CONFUSION_FILE = "examples.jsonl", "summary.json", "confusion.png"
# The 32 labels group by group (anger, fear, disgust, happiness, sadness, surprise), near labels side by side
# (afraid/terrified, angry/furious): the order of the confusion matrix's axes.
GROUPED_EMOTIONS: tuple[str, ...] = tuple(e for g in EKMAN_GROUPS for e, eg in EMOTION_TO_GROUP.items() if eg == g)
HEADLINE_KEYS = ("emotion_acc", "group_acc", "top3", "macro_f1", "n", "failed")


@dataclass
class EmotionEvalSetup:
    """What one emotion evaluation runs: the loaded program, its items, and where they came from."""

    ref: str
    loaded: LoadedProgram
    settings: Settings
    source: Any  # trace_dspy.data.sources.DataSource
    items: list[dspy.Example]
    split: str
    view: str
    seed: int

    def key(self) -> dict[str, Any]:
        """What makes two runs the same run (their rows can resume each other)."""
        return {"program": self.ref, "stage": "emotion", "split": self.split, "view": self.view,
                "limit": len(self.items), "seed": self.seed, "data": self.source.fingerprint,
                "config": self.settings.to_dict()}

    @property
    def lm_name(self) -> str:
        return redact(self.loaded.lms.config.for_stage("recognize_emotion").model, limit=None)


@dataclass
class EmotionEvalResult:
    summary: dict[str, Any]
    rows: list[dict[str, Any]]
    out_dir: Path
    mlflow_run_id: str | None = None

    @property
    def rows_path(self) -> Path:
        return self.out_dir / ROWS_FILE

    @property
    def summary_path(self) -> Path:
        return self.out_dir / SUMMARY_FILE

    @property
    def confusion_path(self) -> Path:
        return self.out_dir / CONFUSION_FILE


def item_id(example: dspy.Example) -> str:
    return example.get("sample_id") or example.dialogue


def prepare_emotion_eval(ref: str, settings: Settings, *, data: str | None = None, split: str = "test",
                         view: str = "trace", limit: int | None = None, seed: int = 0) -> EmotionEvalSetup:
    """Load the items (a seeded sample of ``limit``; None: all) and the program, as the full evaluation does.

    Raises DataError, ValueError or the loader's errors (an unknown reference) for what a user can fix.
    """
    from trace_dspy.data.sources import load_splits, load_test, resolve_source
    from trace_dspy.workflows.loading import load_for_run

    source = resolve_source(settings.data_source(data), seed=seed)  # a loud notice for the seed set
    if split == "test":
        items = load_test(source, view=view, limit=limit, seed=seed)
    else:
        items, view = load_splits(source, seed=seed, dev_size=limit).dev, "longest"
    items = [e for e in items if e.get("emotion") in EMOTION_TO_GROUP]
    if not items:
        raise ValueError(f"no {split} items with a gold emotion in {source.kind}: {source.location}")
    if len({item_id(e) for e in items}) != len(items):
        raise ValueError("the items must have unique sample ids")
    loaded = load_for_run(ref, settings, data=source, seed=seed)
    return EmotionEvalSetup(ref, loaded, settings, source, items, split, view, seed)


def recognize_row(program, example: dspy.Example) -> dict[str, Any]:
    """One item's row: the prior's top labels, the program's emotion (``program.recognize``), and the verdict."""
    row: dict[str, Any] = {"id": item_id(example), "gold": example.get("emotion"), "predicted": None,
                           "candidates": None, "correct": False}
    try:
        top = program.prior_candidates(example.dialogue, TOP_K)
        row["candidates"] = None if top is None else [[label, round(float(p), 4)] for label, p in top]
        pred = program.recognize(example.dialogue)
    except Exception as exc:  # noqa: BLE001 - a failed item is recorded and counted wrong, never dropped
        row["error"] = redact(f"{type(exc).__name__}: {exc}")[:2000]
        return row
    row.update(predicted=pred.emotion, correct=pred.emotion == row["gold"], emotion_path=pred.emotion_path)
    return row


def recognize_all(program, items: Sequence[dspy.Example], *, lm=None, rows_path: Path, threads: int = 1,
                  desc: str = "emotion") -> list[dict[str, Any]]:
    """Rows for ``items`` in their order; resumes from ``rows_path`` (failed rows are asked again)."""
    ids = [item_id(e) for e in items]
    previous = read_records(rows_path, accept=lambda r: "gold" in r and "predicted" in r, what="emotion rows")
    rows = {k: v for k, v in previous.items() if k in set(ids) and "error" not in v}
    retry = {k for k, v in previous.items() if "error" in v}
    todo = [e for e, i in zip(items, ids) if i not in rows]

    def task(example):
        # A failed item is asked again past DSPy's cache, which would replay the failed reply.
        with fresh_calls() if item_id(example) in retry else nullcontext(), use_lm(lm):
            return recognize_row(program, example)

    writer = AppendWriter(rows_path)
    pool = ThreadPoolExecutor(max_workers=max(1, threads))
    try:
        with progress(total=len(todo), desc=desc, unit="items") as bar:
            work = with_dspy_context(task)
            for future in as_completed([pool.submit(work, e) for e in todo]):
                row = future.result()
                rows[row["id"]] = row
                writer.write(row)
                bar.update(1)
    finally:  # interrupted: what finished is on disk; nothing queued starts
        pool.shutdown(wait=True, cancel_futures=True)
        writer.close()
    return [rows[i] for i in ids]


def per_label_table(gold: Sequence[str], predicted: Sequence[str | None]) -> dict[str, dict[str, Any]]:
    """Precision, recall, F1 and support for each of the 32 labels, in EMOTIONS order (0 where undefined)."""
    table = {}
    for label in EMOTIONS:
        hits = sum(g == label and p == label for g, p in zip(gold, predicted))
        support, called = list(gold).count(label), list(predicted).count(label)
        table[label] = {"group": ekman_group(label), "precision": hits / called if called else 0.0,
                        "recall": hits / support if support else 0.0,
                        "f1": 2 * hits / (support + called) if hits else 0.0, "support": support,
                        "predicted": called}
    return table


def summarize_emotions(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The headline numbers and the per-label table. A failed row counts wrong; ``top3`` is over the rows with
    prior candidates (None: the program has no usable prior); ``macro_f1`` averages over the gold labels."""
    if not rows:
        raise ValueError("no rows to summarise")
    gold = [r["gold"] for r in rows]
    predicted = [r.get("predicted") for r in rows]
    ranked = [r for r in rows if r.get("candidates") is not None]
    top3 = (sum(r["gold"] in [c[0] for c in r["candidates"][:TOP_K]] for r in ranked) / len(ranked)
            if ranked else None)
    paths = sorted({r["emotion_path"] for r in rows if r.get("emotion_path")})
    return {"emotion_acc": emotion_accuracy(gold, predicted), "group_acc": group_accuracy(gold, predicted),
            "top3": top3, "macro_f1": macro_f1(gold, predicted), "n": len(rows),
            "failed": sum("error" in r for r in rows), "emotion_path": "; ".join(paths) or None,
            "per_label": per_label_table(gold, predicted)}


def plot_confusion(gold: Sequence[str], predicted: Sequence[str | None], path: Path, *, title: str = "") -> Path:
    """The 32x32 confusion matrix (gold rows, predicted columns), each row a share of that label's items,
    the labels grouped by Ekman group. Written atomically as a PNG; failed items appear in no column."""
    # A Figure on an Agg canvas: pyplot, and the backend it would choose, is never touched.
    import numpy as np
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    index = {label: i for i, label in enumerate(GROUPED_EMOTIONS)}
    counts = np.zeros((len(index), len(index)))
    for g, p in zip(gold, predicted):
        if g in index and p in index:
            counts[index[g], index[p]] += 1
    support = np.array([list(gold).count(label) for label in GROUPED_EMOTIONS], dtype=float)
    matrix = counts / np.maximum(support, 1)[:, None]
    fig = Figure(figsize=(12, 11), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    image = ax.imshow(matrix, cmap="Blues", vmin=0, vmax=1)
    ticks = range(len(GROUPED_EMOTIONS))
    ax.set_xticks(ticks, labels=GROUPED_EMOTIONS, rotation=90, fontsize=8)
    ax.set_yticks(ticks, labels=[f"{e} ({int(n)})" for e, n in zip(GROUPED_EMOTIONS, support)], fontsize=8)
    colours = dict(zip(EKMAN_GROUPS, ("#c0392b", "#8e44ad", "#27ae60", "#d68910", "#2e86c1", "#148f77")))
    for tick in (*ax.get_xticklabels(), *ax.get_yticklabels()):
        tick.set_color(colours[EMOTION_TO_GROUP[tick.get_text().split(" ")[0]]])
    edge = 0
    for group in EKMAN_GROUPS[:-1]:  # a line between groups
        edge += sum(1 for eg in EMOTION_TO_GROUP.values() if eg == group)
        ax.axhline(edge - 0.5, color="grey", linewidth=0.8)
        ax.axvline(edge - 0.5, color="grey", linewidth=0.8)
    for i, j in zip(*np.nonzero(counts)):
        value = matrix[i, j]
        ax.text(j, i, f"{value * 100:.0f}", ha="center", va="center", fontsize=6,
                color="white" if value > 0.5 else "black")
    ax.set_xlabel("predicted emotion (label colours: Ekman group)")
    ax.set_ylabel("gold emotion (items)")
    ax.set_title(title or "emotion confusion matrix (row %)")
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.02, label="share of the gold label's items")
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fig.savefig(tmp, format="png")
    os.replace(tmp, path)
    return path


def _log_run(setup: EmotionEvalSetup, record: dict, out_dir: Path, tracking_uri: str | None,
             experiment: str) -> str | None:
    """An MLflow evaluation run: params, the numbers, and the folder (rows, summary, PNG) as artifacts."""
    from trace_dspy.store.tracking import (
        log_artifacts,
        log_metrics,
        log_params,
        logged_or_warned,
        mlflow_run,
        numeric_metrics,
    )

    with logged_or_warned(out_dir), mlflow_run(tracking_uri=tracking_uri, experiment=experiment,
                                               run_name=f"evaluate emotion {setup.ref}",
                                               tags={"trace_dspy.kind": "evaluate-emotion"}) as run:
        log_params({"program_ref": setup.ref, "stage": "emotion", "split": setup.split, "view": setup.view,
                    "limit": len(setup.items), "seed": setup.seed, "lm": setup.lm_name,
                    "data": setup.source.describe(), "config": setup.settings.to_dict()})
        log_metrics(numeric_metrics(record["summary"], setup.split))
        record["mlflow"] = {"run_id": run.info.run_id}
        atomic_write_json(out_dir / SUMMARY_FILE, record)
        log_artifacts(out_dir, artifact_path="evaluation")
        return run.info.run_id
    return None


def run_emotion_eval(setup: EmotionEvalSetup, *, out_dir: Path, threads: int = 1, fresh: bool = False,
                     command: str = "", mlflow: bool = True, tracking_uri: str | None = None,
                     experiment: str = DEFAULT_EXPERIMENT) -> EmotionEvalResult:
    """Recognize every item, then write the summary and the confusion matrix to ``out_dir`` and log the run
    (``mlflow``). Rows resume from an earlier run in ``out_dir`` unless ``fresh``; KeyboardInterrupt keeps them."""
    out_dir.mkdir(parents=True, exist_ok=True)
    rows_path = out_dir / ROWS_FILE
    if fresh and rows_path.exists():
        rows_path.unlink()
    started = time.perf_counter()
    rows = recognize_all(setup.loaded.program, setup.items, lm=setup.loaded.lms.default, rows_path=rows_path,
                         threads=threads)
    summary = summarize_emotions(rows)
    table = summary.pop("per_label")
    summary.update(program=setup.ref, lm=setup.lm_name, split=setup.split, view=setup.view,
                   seconds=round(time.perf_counter() - started, 3), per_label=table)
    plot_confusion([r["gold"] for r in rows], [r.get("predicted") for r in rows], out_dir / CONFUSION_FILE,
                   title=f"{setup.ref} on {len(rows)} {setup.split} items: emotion_acc {summary['emotion_acc']:.3f}, "
                         f"group_acc {summary['group_acc']:.3f}")
    record = {"command": command, "run": setup.key(), "summary": summary, "data": setup.source.describe(),
              "program": setup.loaded.describe()}
    atomic_write_json(out_dir / SUMMARY_FILE, record)
    run_id = _log_run(setup, record, out_dir, tracking_uri, experiment) if mlflow else None
    return EmotionEvalResult(summary, rows, out_dir, run_id)
