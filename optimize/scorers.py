"""Pure scoring functions: plain values in, numbers out, no DSPy or LM."""

from __future__ import annotations

from collections.abc import Sequence

from trace_dspy.labels import EMOTION_TO_GROUP


def emotion_accuracy(gold: Sequence[str], predicted: Sequence[str | None]) -> float:
    """Share of items whose predicted 32-class label equals the gold label.

    A missing prediction (None, e.g. a failed stage call) counts as wrong.
    """
    if len(gold) != len(predicted):
        raise ValueError(f"gold has {len(gold)} labels but predicted has {len(predicted)}")
    if not gold:
        raise ValueError("no items to score")
    return sum(g == p for g, p in zip(gold, predicted)) / len(gold)


def group_accuracy(gold: Sequence[str], predicted: Sequence[str | None]) -> float:
    """Accuracy over the 6 Ekman groups (see trace_dspy.labels.EMOTION_TO_GROUP)."""
    if len(gold) != len(predicted):
        raise ValueError(f"gold has {len(gold)} labels but predicted has {len(predicted)}")
    if not gold:
        raise ValueError("no items to score")
    hits = sum(p in EMOTION_TO_GROUP and EMOTION_TO_GROUP[p] == EMOTION_TO_GROUP[g] for g, p in zip(gold, predicted))
    return hits / len(gold)
