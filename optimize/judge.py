"""LM judges: a reference-free empathy rater and a pairwise comparer.

Both are DSPy modules with their own judge LM, always run under
``dspy.context(lm=judge_lm)`` so that they never borrow the program's model by
accident. Give them a strong model when you can (``--judge-lm``): how well the
embedded 135M model judges is measured in docs/reference/metric.md.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Literal

import dspy

from trace_dspy.lm.specs import use_lm

Level = Literal["none", "weak", "strong"]
Quality = Literal["poor", "fair", "good"]
LEVEL_VALUE = {"none": 0, "weak": 1, "strong": 2, "poor": 0, "fair": 1, "good": 2}
Choice = Literal["A", "B", "tie"]


class JudgeReply(dspy.Signature):
    """Rate a listener's reply to a speaker who shared something personal. Use the three
    EPITOME empathy mechanisms, each none, weak or strong: emotional reaction (the reply
    voices warmth, compassion or concern), interpretation (it shows it understood the
    feeling or the experience behind it), exploration (it asks a specific question that
    invites the speaker to say more). Also rate relevance to what the speaker said and
    fluency of the language as poor, fair or good. Justify in one short sentence first."""

    dialogue: str = dspy.InputField(desc="The conversation, ending on the speaker's turn.")
    reply: str = dspy.InputField(desc="The listener's reply to rate.")
    justification: str = dspy.OutputField(desc="One short sentence on what the reply does well or badly.")
    emotional_reaction: Level = dspy.OutputField()
    interpretation: Level = dspy.OutputField()
    exploration: Level = dspy.OutputField()
    relevance: Quality = dspy.OutputField()
    fluency: Quality = dspy.OutputField()


def judge_score(ratings: dict[str, int]) -> float:
    """One number in [0, 1] from the five ratings (each 0..2).

    Empathy counts half: a reply that is strong on two mechanisms, or weak on
    all three and strong on one, saturates it; relevance and fluency a quarter each.
    """
    empathy = min(1.0, (ratings["emotional_reaction"] + ratings["interpretation"] + ratings["exploration"]) / 4)
    return 0.5 * empathy + 0.25 * ratings["relevance"] / 2 + 0.25 * ratings["fluency"] / 2


class EmpathyJudge(dspy.Module):
    """Rates one reply; returns the ratings as numbers, the justification and a score."""

    FIELDS = ("emotional_reaction", "interpretation", "exploration", "relevance", "fluency")

    def __init__(self, lm: dspy.LM | None = None):
        super().__init__()
        self.rate = dspy.Predict(JudgeReply)
        self._lm = lm

    def forward(self, dialogue: str, reply: str) -> dspy.Prediction:
        with use_lm(self._lm):
            out = self.rate(dialogue=dialogue, reply=reply)
        ratings = {f: LEVEL_VALUE[out[f]] for f in self.FIELDS}
        return dspy.Prediction(**ratings, justification=out.justification, score=judge_score(ratings))


class CompareReplies(dspy.Signature):
    """Two listeners answered the same speaker. Decide which reply is more empathetic
    (warmer, shows more understanding, invites the speaker to share) and which is more
    consistent with the conversation (fits what the speaker actually said). Answer A, B
    or tie for each."""

    dialogue: str = dspy.InputField(desc="The conversation, ending on the speaker's turn.")
    reply_a: str = dspy.InputField()
    reply_b: str = dspy.InputField()
    more_empathetic: Choice = dspy.OutputField()
    more_consistent: Choice = dspy.OutputField()


class PairwiseJudge(dspy.Module):
    """Compares two replies in both orders, to cancel position bias.

    For each criterion the outcome for ``first`` is ``win`` (it won both orders,
    or one with a tie), ``loss`` (the mirror case) or ``tie``.
    """

    CRITERIA = ("more_empathetic", "more_consistent")

    def __init__(self, lm: dspy.LM | None = None):
        super().__init__()
        self.compare = dspy.Predict(CompareReplies)
        self._lm = lm

    def forward(self, dialogue: str, first: str, second: str) -> dspy.Prediction:
        with use_lm(self._lm):
            ab = self.compare(dialogue=dialogue, reply_a=first, reply_b=second)
            ba = self.compare(dialogue=dialogue, reply_a=second, reply_b=first)
        outcomes = {}
        for criterion in self.CRITERIA:
            vote = {"A": 1, "B": -1, "tie": 0}[ab[criterion]] - {"A": 1, "B": -1, "tie": 0}[ba[criterion]]
            outcomes[criterion] = "win" if vote > 0 else "loss" if vote < 0 else "tie"
        return dspy.Prediction(**outcomes, raw=[ab.toDict(), ba.toDict()])


def pairwise_rates(outcomes: Iterable[str]) -> dict[str, float]:
    """Win/tie/loss shares of a list of outcomes."""
    counts = Counter(outcomes)
    total = sum(counts.values())
    if not total:
        raise ValueError("no outcomes")
    unknown = set(counts) - {"win", "tie", "loss"}
    if unknown:
        raise ValueError(f"unknown outcomes: {sorted(unknown)}")
    return {k: counts[k] / total for k in ("win", "tie", "loss")}
