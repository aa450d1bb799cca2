"""The empathy metric: one composite score in [0, 1] and DSPy's metric contracts.

Components (each in [0, 1]):

- ``emotion``: 1 for the gold label, ``group_credit`` for the right Ekman group;
- ``rules``: share of TRACE's reply rules met (one or two sentences, reuses a
  detail of the speaker's words, no unsolicited advice, does not parrot);
- ``similarity``: cosine similarity to the gold reply (MiniLM, ``embed`` extra),
  or token F1 to it without the extra;
- ``relevance``: cosine similarity between the reply and the speaker's words
  (reference-free; zero when the reply parrots them), token F1 without the extra;
- ``judge``: the LM judge's ratings folded into one number (only when its
  weight is above 0; it costs one judge call per example).

The composite is the weighted mean of the components whose weight is above 0.
Default weights (see docs/metric.md for why): emotion 0.3, rules 0.3,
similarity 0.4, judge 0 (the embedded model judges near chance; with a strong
judge LM set ``judge = 0.3``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import dspy

from trace_dspy.config import ConfigError, from_table
from trace_dspy.dialogue import speaker_text
from trace_dspy.labels import EMOTION_TO_GROUP
from trace_dspy.optimize.scorers import (
    content_words,
    emotion_credit,
    response_rules,
    sentence_count,
    token_f1,
)

_UNSET = object()


@dataclass(frozen=True)
class MetricConfig:
    emotion: float = 0.3
    rules: float = 0.3
    similarity: float = 0.4
    relevance: float = 0.0
    judge: float = 0.0
    group_credit: float = 0.5
    # With DSPy's ``trace`` set (bootstrapping), a demo is kept when the score reaches this.
    threshold: float = 0.5
    # "auto" (semantic when the embed extra is installed), "semantic" or "token_f1".
    similarity_kind: str = "auto"

    def __post_init__(self) -> None:
        weights = self.weights()
        if any(w < 0 for w in weights.values()) or not sum(weights.values()) > 0:
            raise ConfigError(f"metric weights must be >= 0 with a positive sum, got {weights}")
        if not 0 <= self.group_credit <= 1 or not 0 <= self.threshold <= 1:
            raise ConfigError("group_credit and threshold must be in [0, 1]")
        if self.similarity_kind not in ("auto", "semantic", "token_f1"):
            raise ConfigError("similarity_kind must be auto, semantic or token_f1")

    def weights(self) -> dict[str, float]:
        return {"emotion": self.emotion, "rules": self.rules, "similarity": self.similarity,
                "relevance": self.relevance, "judge": self.judge}

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> MetricConfig:
        return from_table(cls, data, "metric")


@dataclass
class Scored:
    score: float
    components: dict[str, float | None]
    details: dict[str, Any]
    notes: list[tuple[str, str]]  # (kind, text): what to fix

    @property
    def feedback(self) -> str:
        return " ".join(text for _, text in self.notes) or "Good: right emotion, brief, specific, no advice."


# Which notes each stage can act on (GEPA reflects on one predictor at a time).
_STAGE_NOTES = {
    "recognize_emotion": {"emotion"},
    "analyze_cause": {"detail", "emotion"},
    "plan_strategy": {"judge", "similarity"},
    "generate_response": {"length", "detail", "advice", "parrot", "similarity", "judge", "empty"},
}


class EmpathyMetric:
    """The composite metric, callable with each of DSPy's metric signatures:

    - ``metric(example, pred)`` or ``metric(example, pred, trace=None)`` -> float;
    - ``metric(example, pred, trace)`` with a trace (bootstrapping) -> bool;
    - ``metric(gold, pred, trace, pred_name, pred_trace)`` (GEPA) ->
      ``dspy.Prediction(score=..., feedback=...)``.
    """

    name = "empathy"

    def __init__(self, config: MetricConfig | None = None, *, judge=None, embedder=_UNSET):
        self.config = config or MetricConfig()
        if self.config.judge > 0 and judge is None:
            raise ConfigError("the metric's judge weight is above 0 but no judge was given")
        self.judge = judge
        if embedder is _UNSET:
            embedder = None
            if self.config.similarity_kind != "token_f1":
                from trace_dspy.optimize.similarity import get_embedder

                embedder = get_embedder()
        if embedder is None and self.config.similarity_kind == "semantic":
            from trace_dspy.optimize.similarity import MISSING_EMBED

            raise ConfigError(MISSING_EMBED.split(";")[0])
        self.embedder = embedder

    @property
    def similarity_kind(self) -> str:
        return "semantic" if self.embedder is not None else "token_f1"

    # -- scoring ------------------------------------------------------------------

    def evaluate(self, example, pred) -> Scored:
        reply = _get(pred, "response")
        if not isinstance(reply, str) or not reply.strip():
            return Scored(0.0, dict.fromkeys(self.config.weights()), {},
                          [("empty", "No reply was produced; every stage must return its fields.")])
        gold_emotion, predicted = example.get("emotion"), _get(pred, "emotion")
        speaker = _speaker_words(example)
        rules = response_rules(reply, speaker)
        components: dict[str, float | None] = {
            "emotion": emotion_credit(gold_emotion, predicted, self.config.group_credit) if gold_emotion else None,
            "rules": sum(rules.values()) / len(rules),
            "similarity": None,
            "relevance": None,
            "judge": None,
        }
        if speaker:
            components["relevance"] = 0.0 if not rules["not_parroting"] else self._similarity(reply, speaker)
        gold_reply = example.get("response")
        if gold_reply:
            components["similarity"] = self._similarity(reply, gold_reply)
        details: dict[str, Any] = {"rules": rules, "similarity_kind": self.similarity_kind}
        if self.config.judge > 0:
            judged = self.judge(dialogue=example.dialogue, reply=reply)
            components["judge"] = judged.score
            details["judge"] = {k: judged[k] for k in (*type(self.judge).FIELDS, "justification")}
        score = weighted_mean(components, self.config.weights())
        score = 0.0 if score is None else score
        return Scored(score, components, details, self._notes(example, pred, components, rules, details))

    def _notes(self, example, pred, components, rules, details) -> list[tuple[str, str]]:
        notes: list[tuple[str, str]] = []
        gold, predicted = example.get("emotion"), _get(pred, "emotion")
        if gold and predicted != gold:
            same_group = EMOTION_TO_GROUP.get(predicted) == EMOTION_TO_GROUP.get(gold)
            notes.append(("emotion", f"Wrong emotion: predicted '{predicted}' but the speaker feels '{gold}'"
                         + (" (same Ekman group, half credit)." if same_group else
                            f" (group {EMOTION_TO_GROUP.get(gold)}, not {EMOTION_TO_GROUP.get(predicted)}).")))
        reply = _get(pred, "response") or ""
        if not rules["brief"]:
            notes.append(("length", f"Length: the reply has {sentence_count(reply)} sentences; use one or two short ones."))
        if not rules["reuses_detail"]:
            words = sorted(content_words(_speaker_words(example)))[:5]
            notes.append(("detail", "Missing detail: reuse a concrete detail from the speaker's words"
                          + (f" (for example: {', '.join(words)})." if words else ".")))
        if not rules["no_advice"]:
            notes.append(("advice", "Unsolicited advice: do not tell the speaker what to do; respond to the feeling."))
        if not rules["not_parroting"]:
            notes.append(("parrot", "The reply repeats the speaker's words; answer them as the listener instead."))
        sim = components.get("similarity")
        if sim is not None and sim < 0.3 and example.get("response"):
            notes.append(("similarity", f"Far from a good reference reply such as: \"{example.response}\""))
        if "judge" in details:
            notes.append(("judge", f"Judge: {details['judge']['justification']}"))
        return notes

    def _similarity(self, reply: str, other: str) -> float:
        if self.embedder is not None:
            return self.embedder.similarity(reply, other)
        return token_f1(other, reply)

    # -- DSPy's contracts -----------------------------------------------------------

    def __call__(self, example, pred, trace=None, pred_name=_UNSET, pred_trace=_UNSET):
        scored = self.evaluate(example, pred)
        if pred_name is not _UNSET or pred_trace is not _UNSET:
            feedback = scored.feedback
            if isinstance(pred_name, str) and pred_name in _STAGE_NOTES:
                relevant = [text for kind, text in scored.notes if kind in _STAGE_NOTES[pred_name]]
                feedback = " ".join(relevant) or f"Nothing to fix in {pred_name} for this example."
            return dspy.Prediction(score=scored.score, feedback=feedback)
        if trace is not None:
            return scored.score >= self.config.threshold
        return scored.score


def weighted_mean(components: dict[str, float | None], weights: dict[str, float]) -> float | None:
    """Mean of the components with a positive weight and a value; None when there are none."""
    active = {k: w for k, w in weights.items() if w > 0 and components.get(k) is not None}
    if not active:
        return None
    return sum(w * components[k] for k, w in active.items()) / sum(active.values())


def _get(pred, name):
    try:
        return pred[name]
    except (KeyError, TypeError, AttributeError):
        return getattr(pred, name, None)


def _speaker_words(example) -> str:
    try:
        return speaker_text(example.dialogue)
    except Exception:  # a malformed dialogue has no speaker words to reuse
        return ""
