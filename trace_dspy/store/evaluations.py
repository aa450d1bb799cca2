"""Evaluation runs in MLflow: a finished evaluation's rows become traces with one assessment per metric part.

``evaluate_program(trace=True)`` leaves one trace per dialogue (stage spans, LM calls) and its id in the
row. :func:`log_evaluation` then hands those traces to ``mlflow.genai.evaluate`` with code scorers that
read each row's already computed metric parts, so MLflow's scorer means are the summary's numbers, no
part is computed twice, and no LM is called. Rows without a trace (kept from an earlier, untraced run)
get a small one holding their input and output, so every row is in the run.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

from trace_dspy.core.labels import EMOTION_TO_GROUP

# The logged model's name inside a compile run (trace_dspy.workflows.serving.log_program_model).
MODEL_NAME = "model"

# Scorer name -> the summary key whose value its mean equals.
SCORER_SUMMARY_KEYS = {
    "empathy": "empathy",  # the composite; a failed row scores 0, as in the summary
    "empathy_learned": "empathy_learned",
    "level_ER": "level_ER",
    "level_IP": "level_IP",
    "level_EX": "level_EX",
    "strategy_fit": "strategy_fit",
    "relevance": "relevance",
    "rules": "rules",
    "emotion_correct": "emotion_acc",
    "group_correct": "group_acc",
}


def row_scores(row: dict[str, Any]) -> dict[str, float]:
    """The metric parts of one evaluation row, under their scorer names.

    A failed row carries only the composite (0) and, with a gold label, a wrong emotion: the summary
    counts it the same way and leaves it out of the component means.
    """
    out = {"empathy": float(row.get("score", 0.0))}
    if "error" not in row:
        components = row.get("components") or {}
        if components.get("empathy") is not None:
            out["empathy_learned"] = float(components["empathy"])
        for mech, value in (row.get("levels") or {}).items():
            if value is not None and f"level_{mech}" in SCORER_SUMMARY_KEYS:
                out[f"level_{mech}"] = float(value)
        for part in ("strategy_fit", "relevance", "rules"):
            if components.get(part) is not None:
                out[part] = float(components[part])
    gold = row.get("gold_emotion")
    if gold:
        predicted = (row.get("prediction") or {}).get("emotion")
        out["emotion_correct"] = float(predicted == gold)
        out["group_correct"] = float(predicted in EMOTION_TO_GROUP
                                     and EMOTION_TO_GROUP[predicted] == EMOTION_TO_GROUP.get(gold))
    return out


def _ensure_traces(rows: Sequence[dict[str, Any]]) -> int:
    """Give every row a trace: rows evaluated without tracing get one holding their input and output.
    Returns how many traces it made."""
    import mlflow

    made = 0
    for row in rows:
        if row.get("trace_id"):
            continue
        with mlflow.start_span(name="trace_dspy") as live:
            live.set_inputs({"dialogue": row.get("dialogue")})
            live.set_outputs(row.get("prediction") or {"error": row.get("error")})
            live.set_attribute("trace_dspy.note", "answered before tracing was on; no stage spans")
        row["trace_id"] = mlflow.get_last_active_trace_id()
        made += 1
    return made


def dataset_identity(rows: Sequence[dict[str, Any]], dataset: dict[str, Any]) -> dict[str, Any]:
    """Name, digest and source of the evaluated items: the data's fingerprint, split, view, seed and ids."""
    ids = [str(r.get("id")) for r in rows]
    digest = hashlib.sha256(json.dumps({"dataset": dataset, "ids": ids}, sort_keys=True).encode()).hexdigest()[:16]
    name = "-".join(str(dataset[k]) for k in ("kind", "split", "view") if dataset.get(k)) or "dialogues"
    return {"name": f"{name}-seed{dataset.get('seed', 0)}-n{len(rows)}", "digest": digest,
            "source_type": "local", "source": json.dumps({**dataset, "items": len(rows)}, sort_keys=True)}


def logged_model_id(manifest: dict[str, Any]) -> str | None:
    """The MLflow model that the compile of this artifact logged (None for the uncompiled program, for an
    artifact compiled without MLflow, or when its run is not in this tracking store)."""
    import mlflow

    run_id = (manifest.get("mlflow") or {}).get("run_id")
    if not run_id:
        return None
    try:
        run = mlflow.get_run(run_id)
        models = mlflow.search_logged_models(experiment_ids=[run.info.experiment_id],
                                             filter_string=f"source_run_id = '{run_id}' AND name = '{MODEL_NAME}'",
                                             output_format="list")
    except Exception:  # noqa: BLE001 - the run lives in another store: nothing to link
        return None
    # The pyfunc model compile logged (DSPy's autolog may leave a pending one of its own beside it).
    ready = [m for m in models if str(getattr(m.status, "name", m.status)).upper() == "READY"]
    return ready[0].model_id if ready else None


def log_evaluation(rows: Sequence[dict[str, Any]], *, dataset: dict[str, Any],
                   model_id: str | None = None, flush: bool = True) -> dict[str, float]:
    """Log ``rows`` as an MLflow evaluation in the active run (one is started when none is active).

    ``dataset`` describes the items (``kind``, ``location``, ``fingerprint``, ``split``, ``view``,
    ``seed``); ``model_id`` links the run to a logged model. Returns the scorer means by scorer name.
    ``flush`` first waits for MLflow's asynchronous trace writer (its worker stops on a one-second poll,
    whatever the number of traces); a caller logging several evaluations of traces made earlier flushes
    once itself.
    """
    from trace_dspy.lm.specs import offline_litellm

    offline_litellm()  # mlflow.genai imports LiteLLM, which would fetch its price list
    import mlflow
    from mlflow.genai.scorers import scorer

    rows = list(rows)
    if not rows:
        raise ValueError("no rows to log")
    if _ensure_traces(rows) or flush:
        mlflow.flush_trace_async_logging()
    scores = {row["trace_id"]: row_scores(row) for row in rows}
    traces = [mlflow.get_trace(row["trace_id"]) for row in rows]
    if any(t is None for t in traces):
        missing = sum(t is None for t in traces)
        raise RuntimeError(f"{missing} of {len(rows)} traces are not in the tracking store")
    names = [n for n in SCORER_SUMMARY_KEYS if any(n in s for s in scores.values())]

    def part(name: str):
        def read(trace) -> float | None:
            return scores.get(trace.info.trace_id, {}).get(name)

        read.__name__ = name
        return scorer(read, name=name)

    result = _evaluate_quietly(_dataset_frame(traces, rows, dataset), [part(n) for n in names], model_id)
    means = {}
    for name in names:
        value = result.metrics.get(f"{name}/mean")
        if value is not None:
            means[name] = float(value)
    return means



def _dataset_frame(traces: list, rows: list[dict[str, Any]], dataset: dict[str, Any]):
    """The traces as the DataFrame ``mlflow.genai.evaluate`` reads, named after the dataset's identity."""
    import pandas as pd

    data = pd.DataFrame({"trace": traces})
    identity = dataset_identity(rows, dataset)
    try:  # the dataset's own name, digest and source instead of MLflow's generic "dataset"
        from mlflow.genai.datasets.evaluation_dataset import compute_records_sha256
        from mlflow.utils.mlflow_tags import MLFLOW_GENAI_EVALUATE_DATASET_IDENTITY

        data.attrs[MLFLOW_GENAI_EVALUATE_DATASET_IDENTITY] = {**identity,
                                                               "records_sha256": compute_records_sha256(data)}
    except ImportError:
        pass
    return data


def _evaluate_quietly(data, scorers: list, model_id: str | None):
    """``mlflow.genai.evaluate`` without its progress bar, UI hints and INFO lines."""
    import contextlib
    import io
    import logging

    import mlflow

    quiet = [logging.getLogger(n) for n in ("mlflow.genai", "mlflow.tracing", "mlflow.models.evaluation")]
    levels = [lg.level for lg in quiet]
    for lg in quiet:
        lg.setLevel(logging.ERROR)
    # MLflow prints a progress bar and where to look in the UI; the caller prints its own table and run id.
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            return mlflow.genai.evaluate(data=data, scorers=scorers, model_id=model_id)
    finally:
        for lg, level in zip(quiet, levels):
            lg.setLevel(level)

__all__ = ["SCORER_SUMMARY_KEYS", "dataset_identity", "log_evaluation", "logged_model_id", "row_scores"]
