"""Run a program over examples, score every reply, and summarise.

``evaluate_program`` is the library entry point used by ``python -m
trace_dspy.cli.evaluate`` and by the compile workflow. Every example gets one row
(prediction, metric components, or the error); rows are appended to a JSONL
file as they finish, so an interrupted run resumes where it stopped.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dspy
from dspy.utils.usage_tracker import track_usage

from trace_dspy.core import spans
from trace_dspy.core.config import ConfigError
from trace_dspy.core.console import progress, with_dspy_context
from trace_dspy.core.jsonl import AppendWriter, read_records
from trace_dspy.core.pricing import COST_KEY, Pricing
from trace_dspy.core.safety import redact
from trace_dspy.core.tables import markdown_table
from trace_dspy.lm.specs import fresh_calls, use_lm
from trace_dspy.optimize.metric import (
    COMPONENTS,
    DETAIL_KEYS,
    MECHANISMS,
    SUMMARY_KEYS,
    EmpathyMetric,
    collapse_check,
    exemplar_replies,
)
from trace_dspy.optimize.scorers import (
    bleu,
    distinct_n,
    distribution,
    ead_n,
    emotion_accuracy,
    group_accuracy,
    mean_length,
    rouge_l,
    safe_mean,
    token_f1,
)
from trace_dspy.store.traces import tracing as record_traces
from trace_dspy.workflows.settings import Settings

PREDICTION_FIELDS = ("emotion", "emotion_group", "trigger_spans", "cause_summary", "cause_category",
                     "strategy", "secondary_strategy", "response", "emotion_path", "plan_path", "reply_rewards",
                     "reply_plans")
# Below this many finished examples the failure rate is too noisy to stop on.
MIN_EXAMPLES_FOR_FAILURE_STOP = 10


class FailureRateExceeded(RuntimeError):
    """Too many examples failed for the score to mean anything.

    ``reason`` is the message without the note on where finished rows are kept.
    """

    def __init__(self, message: str, reason: str | None = None):
        super().__init__(message)
        self.reason = reason or message


def _too_many_failures(failures: int, finished: int, limit: float, first_error: str,
                       results_path) -> FailureRateExceeded:
    reason = (f"{failures} of {finished} examples failed (more than {limit:.0%}); stopping instead of "
              f"reporting a misleading score. First error: {first_error}.")
    kept = f" Finished rows are kept in {results_path}; rerun to resume." if results_path else ""
    return FailureRateExceeded(reason + kept, reason)


@dataclass
class EvalResult:
    summary: dict[str, Any]
    rows: list[dict[str, Any]]
    results_path: Path | None

    @property
    def score(self) -> float:
        return self.summary["empathy"]


def usage_totals(tracker) -> dict[str, int]:
    """LM calls that reached a model (cache hits are not recorded) and their tokens, from a usage tracker."""
    entries = [e for per_lm in tracker.usage_data.values() for e in per_lm]
    return {"lm_calls": len(entries),
            "prompt_tokens": sum(e.get("prompt_tokens") or 0 for e in entries),
            "completion_tokens": sum(e.get("completion_tokens") or 0 for e in entries)}


def run_one(program, metric: EmpathyMetric, example: dspy.Example) -> dict[str, Any]:
    row: dict[str, Any] = {
        "id": example.get("sample_id") or example.dialogue,
        "conversation_id": example.get("conversation_id"),
        "gold_emotion": example.get("emotion"),
        "gold_response": example.get("response"),
        "dialogue": example.dialogue,
    }
    started = time.perf_counter()
    error = None
    with track_usage() as usage:
        try:
            pred = program(**example.inputs())
        except Exception as exc:  # a failed example is recorded and counted, never dropped
            error = redact(f"{type(exc).__name__}: {exc}")[:2000]
    # Cost of the program call alone (not the metric): wall time and the LM
    # calls that reached a model (cache hits are not counted).
    row.update(seconds=time.perf_counter() - started, **usage_totals(usage))
    trace_id = spans.last_trace_id()
    if trace_id:
        row["trace_id"] = trace_id
    if error is not None:
        row.update(error=error, score=0.0)
        return row
    row["prediction"] = {k: pred[k] for k in PREDICTION_FIELDS if k in pred}
    row["exemplar_replies"] = exemplar_replies(pred.get("exemplars"))
    return score_row(row, metric, example, pred)


def score_row(row: dict[str, Any], metric: EmpathyMetric, example: dspy.Example, pred=None) -> dict[str, Any]:
    """Fill a row's score fields from its prediction (``pred``, or the stored one)."""
    if pred is None:
        pred = dspy.Prediction(**row["prediction"], exemplar_replies=row.get("exemplar_replies") or [])
    try:
        scored = metric.evaluate(example, pred)
    except Exception as exc:  # e.g. the judge LM failed
        row.update(error=redact(f"metric: {type(exc).__name__}: {exc}")[:2000], score=0.0)
        return row
    row.update(score=scored.score, components=scored.components, feedback=scored.feedback,
               rules=scored.details.get("rules"), judge=scored.details.get("judge"),
               levels=scored.details.get("levels"), copied=scored.details.get("copied"),
               tone_pleasant=scored.details.get("tone_pleasant"),
               similarity_kind=scored.details.get("similarity_kind"),
               empathy_kind=scored.details.get("empathy_kind"),
               relevance_kind=scored.details.get("relevance_kind"), metric_signature=metric.signature)
    return row


def evaluate_program(
    program: dspy.Module,
    examples: Sequence[dspy.Example],
    metric: EmpathyMetric,
    *,
    lm: dspy.LM | None = None,
    threads: int = 1,
    results_path: str | os.PathLike | None = None,
    max_failure_rate: float | None = 0.5,
    desc: str = "evaluate",
    reference_dist2: float | None = None,
    trace: bool = False,
    pricing: Pricing | None = None,
) -> EvalResult:
    """Evaluate ``program`` on ``examples``; resumes from ``results_path`` if it exists.

    ``reference_dist2`` (the Dist-2 of the program this one would replace) arms
    the collapse check's Dist-2 test. ``trace`` records one MLflow trace per
    dialogue (stage spans and LM calls) in the active experiment; each row keeps
    its ``trace_id``. With ``pricing`` the summary says what 1,000 dialogues
    would cost at those prices (``cost_per_1000_dialogues``).
    """
    ids = [e.get("sample_id") or e.dialogue for e in examples]
    if len(set(ids)) != len(ids):
        raise ValueError("examples must have unique sample_id values")
    done, retry = _resume(results_path, ids, examples, metric)
    todo = [e for e, i in zip(examples, ids) if i not in done]
    rows: dict[str, dict] = dict(done)

    def task(example):
        with (fresh_calls() if (example.get("sample_id") or example.dialogue) in retry else nullcontext()), use_lm(lm):
            return run_one(program, metric, example)

    writer = AppendWriter(results_path) if results_path is not None else None
    callbacks = [*(dspy.settings.config.get("callbacks") or []), spans.lm_span_callback()] if trace else None
    try:
        with progress(total=len(todo), desc=desc, unit="dialogues") as bar, record_traces(trace), \
                (dspy.context(callbacks=callbacks) if trace else nullcontext()), \
                ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
            _collect(pool, with_dspy_context(task), todo, rows, writer=writer, bar=bar, done_count=len(done),
                     max_failure_rate=max_failure_rate, results_path=results_path)
    finally:
        if writer:
            writer.close()
    ordered = [rows[i] for i in ids]
    # Runs too short for the early stop are judged once they are complete.
    failed = [r["error"] for r in ordered if "error" in r]
    if max_failure_rate is not None and ordered and len(failed) / len(ordered) > max_failure_rate:
        raise _too_many_failures(len(failed), len(ordered), max_failure_rate, failed[0], results_path)
    summary = summarize(ordered, reference_dist2=reference_dist2, metric_config=metric.config, pricing=pricing)
    return EvalResult(summary, ordered, Path(results_path) if results_path else None)


def _resume(results_path, ids: list, examples: Sequence[dspy.Example],
            metric: EmpathyMetric) -> tuple[dict[str, dict], set[str]]:
    """The rows of an earlier run to keep (rescored when the metric changed) and the failed ids to ask again."""
    done: dict[str, dict] = {}
    retry: set[str] = set()
    if results_path is not None:
        wanted = set(ids)
        previous = read_records(results_path, accept=lambda r: "error" in r or "prediction" in r,
                                what="evaluation rows")
        done = {k: v for k, v in previous.items() if "error" not in v and k in wanted and "prediction" in v}
        # Failed rows are asked again past DSPy's cache, which would replay the failed reply.
        retry = {k for k, v in previous.items() if "error" in v and k in wanted}
    # Rows kept from an earlier run under another metric are scored again (no LM call for the program).
    signature = metric.signature
    by_id = dict(zip(ids, examples))
    for key, row in done.items():
        if row.get("metric_signature") != signature:
            score_row(row, metric, by_id[key])
    return done, retry


def _collect(pool, work, todo: list, rows: dict[str, dict], *, writer, bar, done_count: int,
             max_failure_rate: float | None, results_path) -> None:
    """Run ``work`` on every example of ``todo`` in ``pool``; each row goes into ``rows`` and to ``writer``
    as it finishes. Stops early (FailureRateExceeded) when too many of the new rows failed."""
    failures = 0
    pending = {pool.submit(work, e) for e in todo}
    while pending:
        finished, pending = wait(pending, return_when=FIRST_COMPLETED)
        for fut in finished:
            row = fut.result()
            rows[row["id"]] = row
            failures += "error" in row
            if writer:
                writer.write(row)
            bar.update(1)
        finished_count = len(rows) - done_count
        if (max_failure_rate is not None and finished_count >= MIN_EXAMPLES_FOR_FAILURE_STOP
                and failures / finished_count > max_failure_rate):
            for fut in pending:
                fut.cancel()
            sample = next(r["error"] for r in rows.values() if "error" in r)
            raise _too_many_failures(failures, finished_count, max_failure_rate, sample, results_path)


def summarize(rows: Sequence[dict[str, Any]], *, reference_dist2: float | None = None,
              metric_config=None, pricing: Pricing | None = None) -> dict[str, Any]:
    """Corpus-level numbers from per-example rows (failed rows score 0).

    ``collapsed`` flags replies that collapsed (few distinct ones, or Dist-2
    at half of ``reference_dist2`` or below; see optimize.metric.collapse_check).
    With ``pricing``, the USD that 1,000 dialogues would cost at its prices, from
    the tokens per dialogue (the rows of all dialogues, failed ones included).
    """
    if not rows:
        raise ValueError("no rows to summarise")
    ok = [r for r in rows if "error" not in r]
    preds = [r.get("prediction") or {} for r in rows]
    replies = [p.get("response") or "" for p in preds]
    ok_replies = [(r.get("prediction") or {}).get("response") or "" for r in ok]
    golds = [r.get("gold_response") or "" for r in rows]
    summary: dict[str, Any] = {
        "n": len(rows),
        "failed": len(rows) - len(ok),
        "failure_rate": (len(rows) - len(ok)) / len(rows),
        "empathy": sum(r.get("score", 0.0) for r in rows) / len(rows),
    }
    summary.update(_cost_numbers(rows, pricing))
    candidates = [len(p["reply_rewards"]) for p in preds if isinstance(p.get("reply_rewards"), list)]
    if candidates:  # Best-of-N: how many replies were written per dialogue
        summary["reply_candidates_per_dialogue"] = sum(candidates) / len(candidates)
    summary.update(_component_numbers(ok))
    summary.update(collapse_check(ok_replies, reference_dist2=reference_dist2, config=metric_config))
    gold_emotions = [r.get("gold_emotion") for r in rows]
    if all(gold_emotions):
        summary["emotion_acc"] = emotion_accuracy(gold_emotions, [p.get("emotion") for p in preds])
        summary["group_acc"] = group_accuracy(gold_emotions, [p.get("emotion") for p in preds])
    if all(golds):
        for n in (1, 2, 3, 4):
            summary[f"bleu{n}"] = bleu(golds, replies, n)
        summary["rouge_l"] = sum(rouge_l(g, h) for g, h in zip(golds, replies)) / len(rows)
        summary["token_f1"] = sum(token_f1(g, h) for g, h in zip(golds, replies)) / len(rows)
    if ok_replies:
        summary.update(_reply_numbers(ok, ok_replies))
    for kind_key in ("similarity_kind", "empathy_kind"):
        kinds = {r.get(kind_key) for r in ok if r.get(kind_key)}
        summary[kind_key] = ",".join(sorted(kinds)) or None
    summary["distributions"] = {
        name: distribution(p.get(name) for p in preds if p)
        for name in ("emotion_group", "strategy", "cause_category")
    }
    return summary


def _component_numbers(ok: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Means over the rows that did not fail: each metric component and mechanism level that has values, the
    shares of copied and parroting replies, and the share of replies on the gold emotion's side of the tone."""
    summary: dict[str, float] = {}
    for comp in COMPONENTS:
        value = safe_mean((r.get("components") or {}).get(comp) for r in ok)
        if value is not None:
            # "empathy" is the composite's name; the learned scorer's component is reported beside it.
            summary["empathy_learned" if comp == "empathy" else comp] = value
    for mech in MECHANISMS:
        value = safe_mean((r.get("levels") or {}).get(mech) for r in ok)
        if value is not None:
            summary[f"level_{mech}"] = value
    if ok:
        summary["copied_rate"] = sum(bool(r.get("copied")) for r in ok) / len(ok)
        summary["parrot_rate"] = sum(not (r.get("rules") or {}).get("not_parroting", True) for r in ok) / len(ok)
    toned = [tone_on_side(r) for r in ok]
    toned = [t for t in toned if t is not None]
    if toned:
        summary["tone_agreement"] = sum(toned) / len(toned)
    return summary


def _cost_numbers(rows: Sequence[dict[str, Any]], pricing: Pricing | None) -> dict[str, float]:
    """Seconds, LM calls and tokens per dialogue, and with ``pricing`` the USD per 1,000 dialogues; nothing
    for rows written before costs were recorded."""
    timed = [r for r in rows if "seconds" in r]
    if not timed:
        return {}
    out = {"seconds_per_dialogue": sum(r["seconds"] for r in timed) / len(timed)}
    for key in ("lm_calls", "prompt_tokens", "completion_tokens"):
        out[f"{key}_per_dialogue"] = sum(r.get(key, 0) for r in timed) / len(timed)
    if pricing is not None:
        out[COST_KEY] = pricing.per_dialogues(out)
    return out


def _reply_numbers(ok: Sequence[dict[str, Any]], ok_replies: list[str]) -> dict[str, Any]:
    """Diversity, length, rule pass rates and judge means of the replies of the rows that did not fail."""
    out: dict[str, Any] = {}
    out["dist1"] = distinct_n(ok_replies, 1)
    out["dist2"] = distinct_n(ok_replies, 2)
    out["ead1"] = ead_n(ok_replies, 1)
    out["ead2"] = ead_n(ok_replies, 2)
    out["length"] = mean_length(ok_replies)
    for rule in ("brief", "reuses_detail", "no_advice", "not_parroting"):
        out[f"rule_{rule}"] = safe_mean(float((r.get("rules") or {}).get(rule, False)) for r in ok)
    judged = [r["judge"] for r in ok if r.get("judge")]
    for key in ("emotional_reaction", "interpretation", "exploration", "relevance", "fluency"):
        if judged:
            out[f"judge_{key}"] = sum(j[key] for j in judged) / len(judged)
    return out


def format_table(summaries: dict[str, dict[str, Any]], keys: Sequence[str] | None = None) -> str:
    """A markdown table: one column per summary (e.g. before / after)."""
    names = list(summaries)
    if keys is None:
        keys = [k for k in next(iter(summaries.values())) if k not in ("distributions", "similarity_kind")]
    rows = []
    for key in keys:
        cells = []
        for name in names:
            value = summaries[name].get(key)
            cells.append("-" if value is None else f"{value:.4f}" if isinstance(value, float) else str(value))
        rows.append([key, *cells])
    return markdown_table(["metric", *names], rows)


# The rows of the summary tables (evaluate, compile): every summary number but the details.
TABLE_KEYS = tuple(k for k in SUMMARY_KEYS if k not in DETAIL_KEYS)


def demo_replies(program) -> list[str]:
    """The replies in a program's few-shot demos: what its output must not copy."""
    out = []
    for _, predictor in program.named_predictors():
        for demo in predictor.demos:
            reply = demo.get("response") if hasattr(demo, "get") else None
            if isinstance(reply, str):
                out.append(reply)
    return out


def build_metric(settings: Settings, lms=None):
    """The empathy metric from ``[metric]``, with its judge when the judge weight is on."""
    from trace_dspy.optimize.judge import EmpathyJudge
    from trace_dspy.optimize.metric import EmpathyMetric

    config = settings.metric()
    judge = None
    if config.judge > 0:
        from trace_dspy.lm.specs import LMSet

        judge = EmpathyJudge(lm=(lms or LMSet(settings.lm)).role("judge"))
    return EmpathyMetric(config, judge=judge)


def ablation_configs(settings: Settings, names: list[str]) -> dict[str, Any]:
    from trace_dspy.core.config import ProgramConfig

    base = settings.program.to_dict()
    configs = {"full": settings.program}
    for name in names:
        if name not in ABLATIONS:
            raise ConfigError(f"unknown ablation {name!r}; choose from {', '.join(ABLATIONS)}")
        data = dict(base)
        for key, value in ABLATIONS[name].items():
            if key == "disabled":
                data["disabled"] = sorted(set(data["disabled"]) | set(value))
            elif key == "retrieval":
                data["retrieval"] = {**data["retrieval"], **value}
            else:
                data[key] = value
        configs[name] = ProgramConfig.from_dict(data)
    return configs


# Variants of the configured program for --ablation: name -> changes to [program].
ABLATIONS: dict[str, dict[str, Any]] = {
    "no_cause": {"disabled": ["analyze_cause"]},
    "no_strategy": {"disabled": ["plan_strategy"]},
    "no_retrieval": {"retrieval": {"enabled": False}},
    "with_commonsense": {"commonsense": True},
    "with_reflection": {"reflection": True},
    "fields_reply": {"reply_format": "fields"},  # the reply stage in the field layout (the default before "auto")
    "chat_reply": {"reply_format": "chat"},  # the whole reply as one chat answer (the embedded default before scaffolds)
    "scaffold_reply": {"reply_format": "scaffold"},  # one sentence per planned mechanism, begun by an opener
    "no_prior": {"prior_k": 0},  # the emotion stage without the fitted prior's candidates
    "prior_top5": {"prior_k": 5},  # the LM chooses among 5 candidates everywhere (the default before "auto")
    "best_of_1": {"best_of": 1},  # one reply (the default before best_of = "auto")
    "best_of_2": {"best_of": 2},  # up to 2 reply candidates, the best by the reference-free metric
    "best_of_4": {"best_of": 4},  # what "auto" gives the embedded model
    "no_reply_exemplars": {"reply_exemplars": False},  # the chat writer without the retrieved exemplars
    "reply_exemplars": {"reply_exemplars": True},
    "retrieval_k4": {"retrieval": {"k": 4}},  # four retrieved exemplars instead of two
}


def tone_on_side(row: dict[str, Any]) -> float | None:
    """1.0 when a row's reply has the tone its gold emotion asks for (``tone_valence``) (the tone head's P(pleasant) on that
    side of 0.5), 0.0 when not; None without a gold emotion with a valence or without the tone head's score."""
    from trace_dspy.optimize.tone import tone_valence

    p, valence = row.get("tone_pleasant"), tone_valence(row.get("gold_emotion"))
    if p is None or valence == "any":
        return None
    return float((p > 0.5) == (valence == "positive"))
