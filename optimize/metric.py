"""The empathy metric: one composite score in [0, 1] and DSPy's metric contracts.

Components (each in [0, 1]):

- ``emotion``: 1 for the gold label, ``group_credit`` for the right Ekman group;
- ``empathy``: the learned EPITOME scorer (trace_dspy.optimize.empathy) on the
  speaker's words and the reply: the sum of the expected ER, IP and EX levels
  over 6 (reference-free; needs the ``embed`` extra, and is off without it);
- ``strategy_fit``: does the reply realize the planned primary and secondary
  strategies (the scorer's level for them, against the others)?
- ``relevance``: does the reply answer this speaker? The learned relevance
  head (trace_dspy.optimize.relevance): P(fits) from the MiniLM embeddings of
  the speaker's words, their last turn and the reply, fitted on the ED pool;
  token F1 without the ``embed`` extra;
- ``rules``: share of TRACE's reply rules met (one or two sentences, reuses a
  detail of the speaker's words, no unsolicited advice, does not parrot);
- ``similarity``: cosine similarity to the gold reply (token F1 without the extra);
- ``judge``: the LM judge's ratings folded into one number (only when its
  weight is above 0; it costs one judge call per example).

The composite is the weighted mean of the components whose weight is above 0
and that have a value, times ``grounded``: 0 for a reply that parrots the
speaker or nearly copies a demo's or a retrieved example's reply, and
``relevance / relevance_floor`` (capped at 1) for a reply unrelated to the
speaker. docs/reference/metric.md has the validity study behind the default weights.

A batch-level check (:func:`collapse_check`) flags a set of replies that
collapsed: few distinct replies, or Dist-2 fallen by half against a reference.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Protocol

import dspy
from trace_dspy.optimize.metric_notes import prediction_field as _get
from trace_dspy.optimize.metric_notes import reply_notes
from trace_dspy.optimize.scorers import distinct_n, emotion_credit, near_copy, response_rules, token_f1
from trace_dspy.optimize.tokens import tokenize

from trace_dspy.core.config import ConfigError, from_table
from trace_dspy.core.console import warn_once
from trace_dspy.core.dialogue import listener_turns, speaker_turns
from trace_dspy.core.labels import STRATEGIES
from trace_dspy.core.pricing import COST_KEY
from trace_dspy.core.stages import REGISTRY

log = logging.getLogger(__name__)
_UNSET = object()
MECHANISMS = STRATEGIES


@dataclass(frozen=True)
class MetricConfig:
    # Reference-based parts (they need the gold emotion and reply).
    emotion: float = 0.2
    similarity: float = 0.2
    # Reference-free parts: empathy, relevance and rules split 4:6:0 with a relevance floor
    # of 0.4, as the validity study's weight search chose (docs/reference/metric.md): the best
    # agreement with human EPITOME ratings among the mixes that rank a real ED reply above
    # every kind of wrong one at AUC 0.90. strategy_fit needs a plan and is checked
    # against human levels per mechanism instead.
    empathy: float = 0.2
    relevance: float = 0.3
    rules: float = 0.0
    strategy_fit: float = 0.1
    judge: float = 0.0
    group_credit: float = 0.5
    # With DSPy's ``trace`` set (bootstrapping), a demo is kept when the score reaches this.
    threshold: float = 0.5
    # "auto" (semantic when the embed extra is installed), "semantic" or "token_f1".
    similarity_kind: str = "auto"
    # A reply whose token F1 with a demo's or a retrieved example's reply reaches this is a copy
    # (parroting the speaker uses the rules' own threshold, optimize.scorers.COPY_F1).
    copy_f1: float = 0.8
    # Relevance (the learned P(fits), or cosine with a caller's embedder) below this scales the
    # score down (relevance / floor); 0 turns that off.
    relevance_floor: float = 0.4
    # The tone head's agreement of a reply with the tone of the situation (optimize.tone) below
    # this scales the score down (tone / floor); 0 (the evaluation's default) only reports it. The reply
    # reward sets it from the program's ``tone_floor``.
    tone_floor: float = 0.0
    # Batch level: collapsed when fewer than this share of replies are distinct ...
    min_distinct: float = 0.6
    # ... or when Dist-2 falls to this share of the reference's (the program it replaces) or below.
    dist2_ratio: float = 0.5

    def __post_init__(self) -> None:
        weights = self.weights()
        if any(w < 0 for w in weights.values()) or not sum(weights.values()) > 0:
            raise ConfigError(f"metric weights must be >= 0 with a positive sum, got {weights}")
        for name in ("group_credit", "threshold", "copy_f1", "relevance_floor", "tone_floor", "min_distinct",
                     "dist2_ratio"):
            if not 0 <= getattr(self, name) <= 1:
                raise ConfigError(f"metric {name} must be in [0, 1], got {getattr(self, name)}")
        if self.similarity_kind not in ("auto", "semantic", "token_f1"):
            raise ConfigError("similarity_kind must be auto, semantic or token_f1")

    def weights(self) -> dict[str, float]:
        return {"emotion": self.emotion, "empathy": self.empathy, "strategy_fit": self.strategy_fit,
                "relevance": self.relevance, "rules": self.rules, "similarity": self.similarity,
                "judge": self.judge}

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> MetricConfig:
        return from_table(cls, data, "metric")


class ReplyGuards(Protocol):
    """Extra checks a caller's metric runs on candidates (the compact writer's, ``trace_dspy.compact.guards``):
    each reads the reply and the dialogue's turns, and says what gave it away."""

    version: int

    def parrots(self, reply: str, turns: Sequence[str]) -> bool: ...
    def brings_in_relative(self, reply: str, turns: Sequence[str]) -> str | None: ...
    def takes_theirs(self, reply: str, turns: Sequence[str]) -> str | None: ...

COMPONENTS = ("emotion", "empathy", "strategy_fit", "relevance", "rules", "similarity", "judge", "grounded", "tone")

# Every key of an evaluation summary (trace_dspy.workflows.evaluation.summarize), in display order. Some are
# there only when their inputs are: gold emotions, gold replies, the embedder, a judge, Best-of-N, timed rows.
SUMMARY_KEYS = (
    "n", "failed", "failure_rate", "empathy", "collapsed", "collapse_reason", "distinct_replies",
    # the composite's parts ("empathy_learned" is the learned scorer's component) and the details behind them
    "emotion", "empathy_learned", "level_ER", "level_IP", "level_EX", "strategy_fit", "relevance", "grounded",
    "rules", "rule_brief", "rule_reuses_detail", "rule_no_advice", "rule_not_parroting",
    "similarity", "judge", "judge_emotional_reaction", "judge_interpretation", "judge_exploration",
    "judge_relevance", "judge_fluency",
    "copied_rate", "parrot_rate", "emotion_acc", "group_acc",
    # the tone head: mean agreement with the situation's tone ("tone", a component), and the share of replies
    # on the side of the gold emotion's tone
    "tone", "tone_agreement",
    # against the gold replies, then diversity and length of the replies
    "bleu1", "bleu2", "bleu3", "bleu4", "rouge_l", "token_f1", "dist1", "dist2", "ead1", "ead2", "length",
    # cost per dialogue, and what 1,000 dialogues would cost on a hosted LM (only when prices are given)
    "seconds_per_dialogue", "lm_calls_per_dialogue", "prompt_tokens_per_dialogue", "completion_tokens_per_dialogue",
    COST_KEY, "reply_candidates_per_dialogue",
    # what measured, and the label distributions of the predictions
    "similarity_kind", "empathy_kind", "distributions",
)


def summary_keys(*names: str) -> tuple[str, ...]:
    """``names`` in SUMMARY_KEYS order; a name that is not a summary key is an error."""
    unknown = [n for n in names if n not in SUMMARY_KEYS]
    if unknown:
        raise ValueError(f"not evaluation summary keys: {unknown}")
    return tuple(k for k in SUMMARY_KEYS if k in names)


# Named subsets, each in SUMMARY_KEYS order.
# Cost per dialogue: wall seconds, LM calls that reached the model, tokens; and USD per 1,000 dialogues.
COST_KEYS = summary_keys("seconds_per_dialogue", "lm_calls_per_dialogue", "prompt_tokens_per_dialogue",
                         "completion_tokens_per_dialogue", COST_KEY)
# Left out of the summary tables (summary.json and the MLflow run have them): detail, text and distributions.
DETAIL_KEYS = summary_keys("failure_rate", "collapse_reason", "rule_brief", "rule_reuses_detail", "rule_no_advice",
                           "rule_not_parroting", "judge_emotional_reaction", "judge_interpretation",
                           "judge_exploration", "judge_relevance", "judge_fluency", "reply_candidates_per_dialogue",
                           "similarity_kind", "empathy_kind", "distributions")
# The short list an artifact's scores are shown with.
HEADLINE_KEYS = summary_keys("empathy", "collapsed", "distinct_replies", "empathy_learned", "strategy_fit", "emotion",
                             "rules", "similarity", "relevance", "emotion_acc", "group_acc", "bleu1", "rouge_l",
                             "dist1", "dist2")
# Compared before and after a compile (dev_delta/...).
DELTA_KEYS = summary_keys("empathy", "emotion_acc", "group_acc", "similarity", "rules")
# Compared between systems example by example, with paired bootstrap intervals.
PAIRED_KEYS = summary_keys("empathy", "empathy_learned", "strategy_fit", "emotion_acc", "group_acc", "emotion",
                           "rules", "similarity", "relevance", "token_f1", "rouge_l", "tone_agreement")


@dataclass
class Scored:
    score: float
    components: dict[str, float | None]
    details: dict[str, Any]
    notes: list[tuple[str, str]]  # (kind, text): what to fix

    @property
    def feedback(self) -> str:
        return " ".join(text for _, text in self.notes) or "Good: right emotion, empathetic, specific, no advice."


# Which notes each stage can act on (GEPA reflects on one predictor at a time).
_STAGE_NOTES = {s.name: set(s.notes) for s in REGISTRY if s.notes}

def strategy_fit(levels: dict[str, float], primary: str | None, secondary: str | None) -> float | None:
    """How well the reply realizes the plan, in [0, 1], from the scorer's expected levels (0-2).

    60% the primary mechanism's level, 20% the secondary's, 20% for the primary
    being the reply's strongest mechanism. A plan that names the same mechanism
    twice puts 80% on it.
    """
    if primary not in MECHANISMS:
        return None
    others = [levels[m] for m in MECHANISMS if m != primary]
    leads = float(levels[primary] >= max(others))
    if secondary in MECHANISMS and secondary != primary:
        return 0.6 * levels[primary] / 2 + 0.2 * levels[secondary] / 2 + 0.2 * leads
    return 0.8 * levels[primary] / 2 + 0.2 * leads


class EmpathyMetric:
    """The composite metric, callable with each of DSPy's metric signatures:

    - ``metric(example, pred)`` or ``metric(example, pred, trace=None)`` -> float;
    - ``metric(example, pred, trace)`` with a trace (bootstrapping) -> bool;
    - ``metric(gold, pred, trace, pred_name, pred_trace)`` (GEPA) ->
      ``dspy.Prediction(score=..., feedback=...)``.

    ``copy_sources`` are replies the program has seen as demos (for example the
    training replies): a reply that nearly copies one of them, or one of the
    prediction's retrieved exemplars, scores 0.
    """

    name = "empathy"

    def __init__(self, config: MetricConfig | None = None, *, judge=None, embedder=_UNSET, scorer=_UNSET,
                 relevance=_UNSET, tone=_UNSET, copy_sources: Iterable[str] = (), guards: ReplyGuards | None = None):
        self.config = config or MetricConfig()
        # The compact writer's extra guards (a first-person run or an opening "my ..." of the speaker's
        # words, a repeat of the listener's own earlier turn, a relative never named, a thing called theirs):
        # they steer a small writer's candidates, but they also zero a few human replies, so the evaluation
        # metric leaves them out (docs/reference/metric.md, "Guards of the reply reward").
        self.guards = guards
        if self.config.judge > 0 and judge is None:
            raise ConfigError("the metric's judge weight is above 0 but no judge was given")
        self.judge = judge
        default_embedder = embedder is _UNSET
        if embedder is _UNSET:
            embedder = None
            if self.config.similarity_kind != "token_f1":
                from trace_dspy.optimize.similarity import get_embedder

                embedder = get_embedder()
        if embedder is None and self.config.similarity_kind == "semantic":
            from trace_dspy.optimize.similarity import MISSING_EMBED

            raise ConfigError(MISSING_EMBED.split(";")[0])
        self.embedder = embedder
        if scorer is _UNSET:
            scorer = None
            if self.config.empathy > 0 or self.config.strategy_fit > 0:
                from trace_dspy.optimize.empathy import shared_scorer

                scorer = shared_scorer()
        self.scorer = scorer
        if relevance is _UNSET:
            # The learned head comes with the default embedder; a caller's own embedder gets cosine.
            relevance = None
            if (default_embedder and embedder is not None
                    and (self.config.relevance > 0 or self.config.relevance_floor > 0)):
                from trace_dspy.optimize.relevance import shared_relevance

                relevance = shared_relevance()
        self.relevance = relevance
        if tone is _UNSET:  # like the relevance head: with the default embedder
            tone = None
            if default_embedder and embedder is not None:
                from trace_dspy.optimize.tone import shared_tone

                tone = shared_tone()
        if tone is None and self.config.tone_floor > 0:
            raise ConfigError("the metric's tone_floor is above 0 but the tone head cannot run (no embedder)")
        self.tone = tone
        if scorer is None and (self.config.empathy > 0 or self.config.strategy_fit > 0):
            from trace_dspy.optimize.empathy import NO_EMBED

            warn_once(log, NO_EMBED, "%s", NO_EMBED)
        self.copy_sources: tuple[str, ...] = ()
        self.add_copy_sources(copy_sources)

    def add_copy_sources(self, sources: Iterable[str]) -> EmpathyMetric:
        """Replies a program's output must not copy (demos, training replies)."""
        known = dict.fromkeys(self.copy_sources)
        known.update(dict.fromkeys(s for s in sources if isinstance(s, str) and s.strip()))
        self.copy_sources = tuple(known)
        return self

    @property
    def similarity_kind(self) -> str:
        return "semantic" if self.embedder is not None else "token_f1"

    @property
    def signature(self) -> str:
        """A short hash of everything that decides a score: the config, the learned heads, the copy sources.

        Stored rows scored under another signature are scored again on resume.
        """
        import hashlib
        import json

        parts = {"config": self.config.to_dict(), "similarity": self.similarity_kind,
                 "empathy": (self.scorer.meta.get("dev_table") if self.scorer is not None else None),
                 "relevance": (self.relevance.meta.get("dev_table") if self.relevance is not None else None),
                 "tone": (self.tone.meta.get("dev_table") if self.tone is not None else None),
                 "copy_sources": hashlib.sha256("\x00".join(self.copy_sources).encode()).hexdigest(),
                 **({"reply_guards": self.guards.version} if self.guards is not None else {})}
        return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]

    @property
    def relevance_kind(self) -> str:
        return "learned" if self.relevance is not None else self.similarity_kind

    @property
    def empathy_kind(self) -> str:
        return "learned" if self.scorer is not None else "off"

    # -- scoring ------------------------------------------------------------------

    def evaluate(self, example, pred) -> Scored:
        reply = _get(pred, "response")
        if not isinstance(reply, str) or not reply.strip():
            return Scored(0.0, dict.fromkeys(COMPONENTS), {},
                          [("empty", "No reply was produced; every stage must return its fields.")])
        cfg = self.config
        gold_emotion, predicted = example.get("emotion"), _get(pred, "emotion")
        turns = _speaker_turns(example)
        speaker = " ".join(turns)
        guards = self.guards
        rules = response_rules(reply, speaker, speaker_turns=turns,
                               also_parrots=guards.parrots if guards is not None else None)
        components: dict[str, float | None] = dict.fromkeys(COMPONENTS)
        if gold_emotion:
            components["emotion"] = emotion_credit(gold_emotion, predicted, cfg.group_credit)
        components["rules"] = sum(rules.values()) / len(rules)
        details: dict[str, Any] = {"rules": rules, "similarity_kind": self.similarity_kind,
                                   "empathy_kind": self.empathy_kind, "relevance_kind": self.relevance_kind}
        if speaker:
            components["relevance"] = 0.0 if not rules["not_parroting"] else self._relevance(reply, speaker, turns[-1])
        gold_reply = example.get("response")
        if gold_reply:
            components["similarity"] = self._similarity(reply, gold_reply)
        if self.scorer is not None and speaker:
            levels = self.scorer.score(speaker, reply)
            details["levels"] = {m: levels[m] for m in MECHANISMS}
            components["empathy"] = levels["empathy"]
            components["strategy_fit"] = strategy_fit(levels, _get(pred, "strategy"),
                                                      _get(pred, "secondary_strategy"))
        misplaced = self._copied_or_misplaced(example, pred, reply, turns, details)
        grounded = 1.0
        if misplaced or not rules["not_parroting"]:
            grounded = 0.0
        elif (self.similarity_kind == "semantic" and cfg.relevance_floor > 0
              and components["relevance"] is not None and components["relevance"] < cfg.relevance_floor):
            grounded = components["relevance"] / cfg.relevance_floor
        components["grounded"] = grounded
        toned = self._tone_factor(reply, pred, predicted, components, details)
        if cfg.judge > 0:
            judged = self.judge(dialogue=example.dialogue, reply=reply)
            components["judge"] = judged.score
            details["judge"] = {k: judged[k] for k in (*type(self.judge).FIELDS, "justification")}
        score = weighted_mean(components, cfg.weights())
        score = 0.0 if score is None else score * grounded * toned
        return Scored(score, components, details, reply_notes(example, pred, speaker, components, rules, details))

    def _copied_or_misplaced(self, example, pred, reply: str, turns: list[str], details: dict[str, Any]) -> bool:
        """Is the reply ungrounded, parroting aside? A near copy of a retrieved example's reply, of a copy
        source or (with the reply guards) of the listener's own earlier turn; with the reply guards also a
        relative the dialogue never names, or a thing the speaker spoke of as someone else's called theirs.
        What was found goes into ``details``."""
        retrieved = [*exemplar_replies(_get(pred, "exemplars")), *(_get(pred, "exemplar_replies") or [])]
        # The listener's own earlier turns count too: a reply that says again what was said before is no answer.
        guards = self.guards
        earlier = _listener_turns(example) if guards is not None else []
        copied = near_copy(reply, [*retrieved, *self.copy_sources, *earlier], self.config.copy_f1)
        if copied is not None:
            details["copied"] = copied[:200]
            if copied in earlier:
                details["repeats_listener"] = True
        # A relative of the speaker's that the dialogue never names ("your brother's wedding" to a delayed
        # flight) is another situation's: the reply is not about this one.
        stranger = guards.brings_in_relative(reply, [*turns, *earlier]) if guards is not None else None
        if stranger is not None:
            details["brings_in"] = stranger
        # "your dog" to "my neighbor's dog": the listener has the speaker's situation wrong.
        theirs = guards.takes_theirs(reply, turns) if guards is not None else None
        if theirs is not None:
            details["takes_theirs"] = theirs
        return copied is not None or stranger is not None or theirs is not None

    def _tone_factor(self, reply: str, pred, predicted, components: dict[str, float | None],
                     details: dict[str, Any]) -> float:
        """The tone head's agreement of the reply with the situation's tone (``components["tone"]``, its
        reading in ``details``) and what the score is multiplied by: ``tone / tone_floor`` below the floor,
        else 1 (also without the tone head)."""
        cfg = self.config
        toned = 1.0
        if self.tone is not None:
            from trace_dspy.optimize.tone import agreement as tone_agreement
            from trace_dspy.optimize.tone import soft_agreement, tone_valence

            details["tone_pleasant"] = self.tone.pleasant(reply)
            # The program's reply reward knows how pleasant the situation is (the emotion prior's mass on the
            # pleasant emotions); elsewhere the predicted emotion's valence stands for it.
            situation = _get(pred, "situation_pleasant")
            components["tone"] = (soft_agreement(details["tone_pleasant"], situation) if situation is not None
                                  else tone_agreement(details["tone_pleasant"], tone_valence(predicted)))
            if cfg.tone_floor > 0 and components["tone"] is not None and components["tone"] < cfg.tone_floor:
                toned = components["tone"] / cfg.tone_floor
        return toned

    def _relevance(self, reply: str, speaker: str, last_turn: str) -> float:
        if self.relevance is not None:
            return self.relevance.score(speaker, last_turn, reply)
        return self._similarity(reply, speaker)

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


def collapse_check(replies: Sequence[str], *, reference_dist2: float | None = None,
                   config: MetricConfig | None = None) -> dict[str, Any]:
    """Did a batch of replies collapse? Few distinct replies, or Dist-2 fallen by half or more.

    ``reference_dist2`` is the Dist-2 of the program being replaced (e.g. the
    uncompiled program on the same dev set).
    """
    cfg = config or MetricConfig()
    texts = [r for r in replies if isinstance(r, str) and r.strip()]
    out: dict[str, Any] = {"distinct_replies": None, "collapsed": False, "collapse_reason": None}
    if not texts:
        return out
    distinct = len({" ".join(tokenize(t)) for t in texts}) / len(texts)
    dist2 = distinct_n(texts, 2)
    out["distinct_replies"] = distinct
    reasons = []
    if len(texts) >= 3 and distinct < cfg.min_distinct:
        reasons.append(f"only {distinct:.0%} of {len(texts)} replies are distinct (collapse below {cfg.min_distinct:.0%})")
    if reference_dist2 and dist2 <= cfg.dist2_ratio * reference_dist2:
        reasons.append(f"Dist-2 fell from {reference_dist2:.1f} to {dist2:.1f}")
    if reasons:
        out.update(collapsed=True, collapse_reason="; ".join(reasons))
    return out


def weighted_mean(components: dict[str, float | None], weights: dict[str, float]) -> float | None:
    """Mean of the components with a positive weight and a value; None when there are none."""
    active = {k: w for k, w in weights.items() if w > 0 and components.get(k) is not None}
    if not active:
        return None
    return sum(w * components[k] for k, w in active.items()) / sum(active.values())


def _speaker_turns(example) -> list[str]:
    try:
        return speaker_turns(example.dialogue)
    except Exception:  # a malformed dialogue has no speaker words to reuse
        return []


def _listener_turns(example) -> list[str]:
    try:
        return listener_turns(example.dialogue)
    except Exception:  # a malformed dialogue has no earlier replies
        return []


def exemplar_replies(exemplars) -> list[str]:
    """The listener replies inside a prediction's formatted exemplars."""
    from trace_dspy.data.retrieval import exemplar_reply

    replies = (exemplar_reply(text) for text in exemplars or [] if isinstance(text, str))
    return [r for r in replies if r is not None]
