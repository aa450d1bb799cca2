"""The empathy metric's DSPy contracts, its judges, and GEPA accepting it."""

from __future__ import annotations

import dspy
import pytest
from trace_dspy.optimize.judge import EmpathyJudge, PairwiseJudge
from trace_dspy.optimize.metric import EmpathyMetric, MetricConfig
from trace_dspy.optimize.scorers import token_f1

from trace_dspy import TraceProgram
from trace_dspy.core.config import ConfigError
from trace_dspy.testing.fakes import fake_lm

EX = dspy.Example(dialogue="Speaker: I lost my keys at the beach.", emotion="sad",
                  response="Oh no, did you find them?").with_inputs("dialogue")
GOOD = "Oh no, losing your keys at the beach is awful."
BAD = "You should buy new ones. It's easy. Go now. Then relax."


def metric(**weights) -> EmpathyMetric:
    """The metric's older parts alone, on token-F1 similarity: deterministic. The learned
    scorer's components are tested in test_empathy.py."""
    base = {"emotion": 0.3, "rules": 0.3, "similarity": 0.4, "relevance": 0.0, "empathy": 0.0, "strategy_fit": 0.0}
    return EmpathyMetric(MetricConfig(**{**base, **weights}), embedder=None, scorer=None)


def test_composite_is_the_weighted_mean_of_its_components():
    m = metric()
    pred = dspy.Prediction(emotion="sad", response=GOOD)
    expected = (0.3 * 1.0 + 0.3 * 1.0 + 0.4 * token_f1(EX.response, GOOD)) / 1.0
    assert m(EX, pred) == pytest.approx(expected)
    # Same group: half emotion credit; wrong group: none.
    assert m(EX, dspy.Prediction(emotion="lonely", response=GOOD)) == pytest.approx(expected - 0.15)
    assert m(EX, dspy.Prediction(emotion="joyful", response=GOOD)) == pytest.approx(expected - 0.3)
    only_rules = metric(emotion=0, similarity=0, rules=1)
    assert only_rules(EX, dspy.Prediction(emotion="joyful", response=BAD)) == pytest.approx(1 / 4)


def test_bootstrapping_form_returns_a_bool_at_the_threshold():
    m = metric(threshold=0.6)
    good, bad = dspy.Prediction(emotion="sad", response=GOOD), dspy.Prediction(emotion="joyful", response=BAD)
    assert m(EX, good, trace=[]) is True and m(EX, bad, trace=[]) is False
    assert isinstance(m(EX, good), float)


def test_gepa_form_returns_score_and_concrete_feedback():
    m = metric()
    bad = dspy.Prediction(emotion="joyful", response=BAD)
    whole = m(EX, bad, None, None, None)
    assert isinstance(whole, dspy.Prediction) and whole.score == pytest.approx(m(EX, bad))
    for phrase in ("Wrong emotion", "'joyful'", "'sad'", "4 sentences", "keys", "advice"):
        assert phrase in whole.feedback
    emotion_only = m(EX, bad, None, "recognize_emotion", [])
    assert "Wrong emotion" in emotion_only.feedback and "advice" not in emotion_only.feedback
    reply_only = m(EX, bad, None, "generate_response", [])
    assert "advice" in reply_only.feedback and "Wrong emotion" not in reply_only.feedback
    assert "Nothing to fix" in m(EX, dspy.Prediction(emotion="sad", response=GOOD), None, "recognize_emotion",
                                 []).feedback


def test_missing_reply_scores_zero_with_a_reason():
    m = metric()
    assert m(EX, dspy.Prediction(emotion="sad")) == 0.0
    assert "No reply" in m(EX, dspy.Prediction(emotion="sad", response="  "), None, None, None).feedback


def test_config_validation():
    with pytest.raises(ConfigError):
        MetricConfig(emotion=-1)
    with pytest.raises(ConfigError):
        MetricConfig(emotion=0, rules=0, similarity=0, relevance=0, empathy=0, strategy_fit=0)
    with pytest.raises(ConfigError, match="unknown keys"):
        MetricConfig.from_dict({"emotions": 1})
    with pytest.raises(ConfigError, match="no judge"):
        EmpathyMetric(MetricConfig(judge=0.3), embedder=None)
    assert MetricConfig.from_dict(MetricConfig(judge=0.2).to_dict()) == MetricConfig(judge=0.2)


def test_judge_runs_on_its_own_lm_and_feeds_the_metric():
    judge_lm, judge_engine = fake_lm(emotional_reaction="strong", interpretation="weak", exploration="none",
                                     relevance="good", fluency="good", justification="Warm and specific.")
    program_lm, program_engine = fake_lm()
    m = EmpathyMetric(MetricConfig(judge=1.0, emotion=0, rules=0, similarity=0, relevance=0, empathy=0,
                                   strategy_fit=0), judge=EmpathyJudge(judge_lm), embedder=None, scorer=None)
    with dspy.context(lm=program_lm):  # the judge must not borrow the program's LM
        scored = m.evaluate(EX, dspy.Prediction(emotion="sad", response=GOOD))
    assert len(judge_engine.calls) == 1 and program_engine.calls == []
    assert scored.components["judge"] == pytest.approx(0.5 * 0.75 + 0.25 + 0.25)
    assert scored.details["judge"]["justification"] == "Warm and specific."
    assert "Judge: Warm and specific." in scored.feedback


def test_pairwise_judge_runs_both_orders_and_cancels_position_bias():
    # A judge that always prefers whatever is shown first: both orders cancel to a tie.
    biased, engine = fake_lm(more_empathetic="A", more_consistent="A")
    outcome = PairwiseJudge(biased)(dialogue=EX.dialogue, first=GOOD, second=BAD)
    assert (outcome.more_empathetic, outcome.more_consistent) == ("tie", "tie")
    shown = [(c.inputs["reply_a"], c.inputs["reply_b"]) for c in engine.calls]
    assert shown == [(GOOD, BAD), (BAD, GOOD)]

    def prefers_good(outputs, inputs):
        pick = "A" if inputs["reply_a"] == GOOD else "B"
        return {"more_empathetic": pick, "more_consistent": "tie"}

    fair, _ = fake_lm(prefers_good)
    outcome = PairwiseJudge(fair)(dialogue=EX.dialogue, first=GOOD, second=BAD)
    assert (outcome.more_empathetic, outcome.more_consistent) == ("win", "tie")
    outcome = PairwiseJudge(fair)(dialogue=EX.dialogue, first=BAD, second=GOOD)
    assert outcome.more_empathetic == "loss"


def test_gepa_accepts_the_metric():
    program_lm, _ = fake_lm()
    reflection_lm, reflection = fake_lm()
    calls = []
    base = metric()

    def recording_metric(gold, pred, trace=None, pred_name=None, pred_trace=None):
        calls.append(pred_name)
        return base(gold, pred, trace, pred_name, pred_trace)

    trainset = [dspy.Example(dialogue=f"Speaker: I lost my keys at beach {i}.", emotion="sad",
                             response="Oh no, did you find them?").with_inputs("dialogue") for i in range(4)]
    optimizer = dspy.GEPA(metric=recording_metric, reflection_lm=reflection_lm, max_metric_calls=24,
                          reflection_minibatch_size=2, track_stats=False)
    with dspy.context(lm=program_lm):
        compiled = optimizer.compile(TraceProgram(), trainset=trainset, valset=trainset[:2])
    assert isinstance(compiled, TraceProgram) and calls
    # GEPA asked for per-predictor feedback, and our metric answered in its 5-argument form.
    assert any(name in {"recognize_emotion", "analyze_cause", "plan_strategy", "generate_response"} for name in calls)
    assert reflection.calls  # it reflected on that feedback
