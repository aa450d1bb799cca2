import pytest

from trace_dspy.optimize import emotion_accuracy, group_accuracy


def test_emotion_accuracy_hand_computed():
    gold = ["sad", "angry", "proud", "afraid"]
    pred = ["sad", "furious", None, "afraid"]
    assert emotion_accuracy(gold, pred) == 0.5
    # furious and angry share the anger group; None stays wrong.
    assert group_accuracy(gold, pred) == 0.75


def test_group_accuracy_counts_unknown_predictions_as_wrong():
    assert group_accuracy(["sad", "sad"], ["lonely", "banana"]) == 0.5


def test_scorers_reject_mismatched_or_empty_input():
    with pytest.raises(ValueError, match="gold has 1"):
        emotion_accuracy(["sad"], [])
    with pytest.raises(ValueError, match="no items"):
        group_accuracy([], [])
