"""Best-of-N replies: dspy.BestOfN around the reply stage, rewarded by the reference-free metric."""

from __future__ import annotations

import dspy
import pytest

from trace_dspy import ProgramConfig, TraceProgram
from trace_dspy.core.config import ConfigError
from trace_dspy.testing.fakes import fake_lm

DIALOGUE = "Speaker: My dog died yesterday."
REPLIES = ["Okay then.", "That is sad news.", "I am so sorry about your dog; how are you holding up?", "Fine."]
REWARDS = dict(zip(REPLIES, (0.2, 0.5, 0.9, 0.1)))


def run(config, rewards=REWARDS, trace=None):
    replies = iter(REPLIES)
    lm, engine = fake_lm(response=lambda inputs: next(replies))
    program = TraceProgram(config)
    program.reward_fn = lambda inputs, pred: rewards[pred.response]
    with dspy.context(lm=lm, **({"trace": trace} if trace is not None else {})):
        pred = program(dialogue=DIALOGUE)
    return pred, sum(c.outputs == ("response",) for c in engine.calls), program


def test_the_highest_reward_candidate_wins():
    pred, calls, _ = run(ProgramConfig(best_of=4, best_of_threshold=1.0))
    assert calls == 4
    assert pred.response == REPLIES[2]
    assert pred.reply_rewards == [0.2, 0.5, 0.9, 0.1]  # every candidate's, in order


def test_candidates_stop_at_the_threshold():
    pred, calls, _ = run(ProgramConfig(best_of=4, best_of_threshold=0.5))
    assert (calls, pred.response, pred.reply_rewards) == (2, REPLIES[1], [0.2, 0.5])
    first_good = {**REWARDS, REPLIES[0]: 0.7}
    pred, calls, _ = run(ProgramConfig(best_of=4, best_of_threshold=0.6), rewards=first_good)
    assert (calls, pred.response, pred.reply_rewards) == (1, REPLIES[0], [0.7])


def test_a_worse_sample_never_replaces_the_first_reply():
    worse = {**REWARDS, REPLIES[0]: 0.95}
    pred, calls, _ = run(ProgramConfig(best_of=3, best_of_threshold=1.0), rewards=worse)
    assert calls == 3 and pred.response == REPLIES[0] and pred.reply_rewards == [0.95, 0.5, 0.9]


def test_one_candidate_is_one_call_and_no_reward():
    pred, calls, _ = run(ProgramConfig())
    assert calls == 1 and "reply_rewards" not in pred


def test_optimizer_traces_name_the_programs_own_predictor():
    trace: list = []
    _, _, program = run(ProgramConfig(best_of=3, best_of_threshold=1.0), trace=trace)
    reply_steps = [p for p, _, o in trace if "response" in o]
    assert reply_steps and all(p is program.generate_response for p in reply_steps)


def test_settings_are_checked():
    for bad in ({"best_of": 0}, {"best_of": 9}, {"best_of_threshold": 1.5}, {"best_of": True}):
        with pytest.raises(ConfigError, match="best_of"):
            ProgramConfig(**bad)


def test_the_default_reward_prefers_an_answer_to_a_parrot():
    program = TraceProgram(ProgramConfig(best_of=2))
    inputs = {"dialogue": DIALOGUE, "strategy": "ER", "secondary_strategy": "EX", "exemplars": []}
    parrot = program.reply_reward(inputs, dspy.Prediction(response="My dog died yesterday."))
    answer = program.reply_reward(inputs, dspy.Prediction(
        response="I am so sorry about your dog. How are you coping with losing him?"))
    assert parrot == 0.0 and answer > 0.2


def test_the_default_reward_zeroes_a_pasted_demo_reply():
    program = TraceProgram(ProgramConfig(best_of=2))
    inputs = {"dialogue": DIALOGUE, "strategy": "ER", "secondary_strategy": "EX", "exemplars": []}
    demo = "I am so sorry about your dog. How are you coping with losing him?"
    assert program.reply_reward(inputs, dspy.Prediction(response=demo)) > 0.2
    program.generate_response.demos = [dspy.Example(dialogue="Speaker: My cat died.", response=demo)]
    assert program.reply_reward(inputs, dspy.Prediction(response=demo)) == 0.0


def test_a_program_that_has_scored_replies_can_still_be_copied_by_optimizers():
    """The reward metric cached on the program holds a lock: optimizers' reset_copy() must share it, not copy it."""
    program = TraceProgram(ProgramConfig(best_of=2))
    inputs = {"dialogue": DIALOGUE, "strategy": "ER", "secondary_strategy": "EX", "exemplars": []}
    program.reply_reward(inputs, dspy.Prediction(response="I am so sorry about your dog."))
    assert program._reward_metric is not None
    fresh = program.reset_copy()
    assert fresh._reward_metric is program._reward_metric
    assert fresh.generate_response is not program.generate_response


def test_auto_draws_candidates_only_for_a_constrained_small_model():
    from trace_dspy.lm.specs import GrammarLM

    program = TraceProgram(ProgramConfig())
    assert program.config.best_of == "auto"
    assert program.best_of(fake_lm()[0]) == 1
    assert program.best_of(GrammarLM("openai/local", api_base="http://127.0.0.1:9/v1", api_key="x")) == 4
    assert TraceProgram(ProgramConfig(best_of=2)).best_of(fake_lm()[0]) == 2
