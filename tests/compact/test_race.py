"""How the compact writer chooses the reply (compact.race, optimize.selection): Best-of-N candidates rewarded by
the reference-free metric, and the race between reply plans."""

from __future__ import annotations

import dspy
import pytest

from trace_dspy import ProgramConfig, TraceProgram
from trace_dspy.core.config import ConfigError
from trace_dspy.testing.fakes import fake_lm

DIALOGUE = "Speaker: My dog died yesterday."
REPLIES = ["Okay then.", "That is sad news.", "I am so sorry about your dog; how are you holding up?", "Fine."]
REWARDS = dict(zip(REPLIES, (0.2, 0.5, 0.9, 0.1)))
# The compact writer in the fields layout, which the fake LM answers reply by reply.
COMPACT = {"writer": "compact", "reply_format": "fields"}
WRITERS = {"compact": COMPACT, "standard": {"writer": "standard"}}


def compact(**config) -> ProgramConfig:
    return ProgramConfig(**{**COMPACT, **config})


def embedded_lm(constrained: bool = True) -> dspy.LM:
    """An LM of the embedded engine's kind (no model loaded: only its kind is asked)."""
    from trace_dspy.lm.engine import LlamaEngine

    engine = LlamaEngine.__new__(LlamaEngine)
    engine.constrained = constrained
    return dspy.LM("local/embedded", engine=engine, cache=False)


def run(config, rewards=REWARDS, trace=None):
    replies = iter(REPLIES)
    lm, engine = fake_lm(response=lambda inputs: next(replies))
    program = TraceProgram(config)
    program.reward_fn = lambda inputs, pred: rewards[pred.response]
    with dspy.context(lm=lm, **({"trace": trace} if trace is not None else {})):
        pred = program(dialogue=DIALOGUE)
    return pred, sum(c.outputs == ("response",) for c in engine.calls), program


@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_the_highest_reward_candidate_wins(writer):
    # Both writers choose among their candidates the same way (optimize.selection).
    pred, calls, _ = run(ProgramConfig(**WRITERS[writer], best_of=4, best_of_threshold=1.0))
    assert calls == 4
    assert pred.response == REPLIES[2]
    assert pred.reply_rewards == [0.2, 0.5, 0.9, 0.1]  # every candidate's, in order


def test_candidates_stop_at_the_threshold():
    pred, calls, _ = run(compact(best_of=4, best_of_threshold=0.5))
    assert (calls, pred.response, pred.reply_rewards) == (2, REPLIES[1], [0.2, 0.5])
    first_good = {**REWARDS, REPLIES[0]: 0.7}
    pred, calls, _ = run(compact(best_of=4, best_of_threshold=0.6), rewards=first_good)
    assert (calls, pred.response, pred.reply_rewards) == (1, REPLIES[0], [0.7])


def test_a_worse_sample_never_replaces_the_first_reply():
    worse = {**REWARDS, REPLIES[0]: 0.95}
    pred, calls, _ = run(compact(best_of=3, best_of_threshold=1.0), rewards=worse)
    assert calls == 3 and pred.response == REPLIES[0] and pred.reply_rewards == [0.95, 0.5, 0.9]


def test_one_candidate_is_one_call_and_no_reward():
    for config in (compact(best_of=1), ProgramConfig()):  # the standard writer writes one by default
        pred, calls, _ = run(config)
        assert calls == 1 and "reply_rewards" not in pred


@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_optimizer_traces_name_the_programs_own_predictor(writer):
    trace: list = []
    _, _, program = run(ProgramConfig(**WRITERS[writer], best_of=3, best_of_threshold=1.0), trace=trace)
    reply_steps = [p for p, _, o in trace if "response" in o]
    assert reply_steps and all(p is program.generate_response for p in reply_steps)


def test_settings_are_checked():
    for bad in ({"best_of": 0}, {"best_of": 9}, {"best_of_threshold": 1.5}, {"best_of": True}):
        with pytest.raises(ConfigError, match="best_of"):
            ProgramConfig(**bad)


def test_the_default_reward_prefers_an_answer_to_a_parrot():
    program = TraceProgram(compact(best_of=2))
    inputs = {"dialogue": DIALOGUE, "strategy": "ER", "secondary_strategy": "EX", "exemplars": []}
    parrot = program.reply_reward(inputs, dspy.Prediction(response="My dog died yesterday."))
    answer = program.reply_reward(inputs, dspy.Prediction(
        response="I am so sorry about your dog. How are you coping with losing him?"))
    assert parrot == 0.0 and answer > 0.2


def test_the_default_reward_zeroes_a_pasted_demo_reply():
    program = TraceProgram(compact(best_of=2))
    inputs = {"dialogue": DIALOGUE, "strategy": "ER", "secondary_strategy": "EX", "exemplars": []}
    demo = "I am so sorry about your dog. How are you coping with losing him?"
    assert program.reply_reward(inputs, dspy.Prediction(response=demo)) > 0.2
    program.generate_response.demos = [dspy.Example(dialogue="Speaker: My cat died.", response=demo)]
    assert program.reply_reward(inputs, dspy.Prediction(response=demo)) == 0.0


def test_a_program_that_has_scored_replies_can_still_be_copied_by_optimizers():
    """The reward metric cached on the program holds a lock: optimizers' reset_copy() must share it, not copy it."""
    program = TraceProgram(compact(best_of=2))
    inputs = {"dialogue": DIALOGUE, "strategy": "ER", "secondary_strategy": "EX", "exemplars": []}
    reward = program.reply_reward(inputs, dspy.Prediction(response="I am so sorry about your dog."))
    fresh = program.reset_copy()
    assert fresh.reward_metrics is program.reward_metrics
    assert fresh.generate_response is not program.generate_response
    assert fresh.reply_reward(inputs, dspy.Prediction(response="I am so sorry about your dog.")) == reward


def test_auto_draws_candidates_only_for_the_compact_writer():
    from trace_dspy.lm.specs import GrammarLM

    program = TraceProgram(ProgramConfig())
    assert program.config.best_of == "auto"
    assert program.best_of(fake_lm()[0]) == 1
    # A grammar alone does not make the writer compact; the embedded model does, constrained or not.
    assert program.best_of(GrammarLM("openai/local", api_base="http://127.0.0.1:9/v1", api_key="x")) == 1
    assert program.best_of(embedded_lm()) == 4 and program.best_of(embedded_lm(constrained=False)) == 4
    assert TraceProgram(ProgramConfig(writer="compact")).best_of(fake_lm()[0]) == 4
    assert TraceProgram(ProgramConfig(best_of=2)).best_of(fake_lm()[0]) == 2


def race(firsts: dict, samples: dict, threshold: float, best_of: int = 3):
    """A program with two further plans; each plan's replies are scored from ``firsts`` (its first reply) and
    ``samples`` (its sampled candidates, in order). Returns the prediction and the replies written."""
    written: list[str] = []

    def reply(inputs):
        plan = f"{inputs['strategy']}+{inputs.get('secondary_strategy', inputs['strategy'])}"
        text = f"{plan} reply {sum(w.startswith(plan) for w in written)}"
        written.append(text)
        return text

    def reward(inputs, pred):
        plan, _, number = pred.response.partition(" reply ")
        return firsts[plan] if number == "0" else samples[plan][int(number) - 1]

    lm, _ = fake_lm(response=reply)
    program = TraceProgram(compact(best_of=best_of, best_of_threshold=threshold))
    program.reply_plans = (("EX", "EX"), ("ER", "ER"))
    program.reward_fn = reward
    with dspy.context(lm=lm):
        pred = program(dialogue=DIALOGUE)
    return pred, written


def own_plan() -> str:
    lm, _ = fake_lm()
    with dspy.context(lm=lm):
        pred = TraceProgram(ProgramConfig()).forward(dialogue=DIALOGUE)
    return f"{pred.strategy}+{pred.secondary_strategy}"


def test_no_plan_is_sampled_once_a_first_reply_reaches_the_threshold():
    own = own_plan()
    firsts = {own: 0.3, "EX+EX": 0.7, "ER+ER": 0.4}
    pred, written = race(firsts, {p: [0.9, 0.9] for p in firsts}, threshold=0.6)
    assert all(w.endswith("reply 0") for w in written) and len(written) == len(set(firsts))
    assert pred.response == "EX+EX reply 0" and (pred.strategy, pred.secondary_strategy) == ("EX", "EX")


def test_sampling_starts_at_the_best_plan_and_keeps_the_best_candidate_found():
    own = own_plan()
    firsts = {own: 0.3, "EX+EX": 0.5, "ER+ER": 0.45}
    # EX+EX is sampled first (best first reply); its second sample clears 0.8 and the search stops there.
    pred, written = race(firsts, {"EX+EX": [0.6, 0.85], "ER+ER": [0.99, 0.99], own: [0.99, 0.99]}, threshold=0.8)
    assert written[len(set(firsts)):] == ["EX+EX reply 1", "EX+EX reply 2"]
    assert pred.response == "EX+EX reply 2" and pred.strategy == "EX"
    # Nothing clears the threshold: every plan is sampled, and the best candidate of all is kept.
    samples = {"EX+EX": [0.2, 0.1], "ER+ER": [0.55, 0.5], own: [0.4, 0.35]}
    pred, written = race(firsts, samples, threshold=0.8)
    assert len(written) == 3 * len(set(firsts))
    assert pred.response == "ER+ER reply 1" and max(pred.reply_rewards) == 0.55


@pytest.mark.slow
def test_the_shipped_reward_prefers_a_reply_about_the_speaker():
    """The reply reward with the shipped heads (no LM): replies that are not about the speaker's situation, or
    that speak as the speaker, lose to plain ones that are."""
    program = TraceProgram(ProgramConfig(writer="compact"))

    def reward(message: str, reply: str) -> float:
        inputs = {"dialogue": f"Speaker: {message}", "emotion": "sad", "strategy": "ER", "secondary_strategy": "EX",
                  "exemplars": []}
        return program.reply_reward(inputs, dspy.Prediction(response=reply))

    dog = "My dog died yesterday."
    assert reward(dog, "Howdy there! What's your dog's name?") < reward(
        dog, "I'm so sorry to hear that. How are you holding up?")
    birthday = "Everyone forgot my birthday."
    assert reward(birthday, "That sounds like a joke, but it's actually a story about a guy who lost his birthday.") \
        < reward(birthday, "Oh no, that's awful. How are you feeling about your birthday?")
    flight = "My flight home for the holidays got delayed by two days."
    assert reward(flight, "That's awful news about your flight home. How are you feeling about your brother's "
                          "wedding?") == 0.0
    assert reward(flight, "That's awful news about your flight home. How are you holding up?") > 0.1
    barking = "My neighbor's dog keeps barking all night and I can't sleep."
    assert reward(barking, "Oh no, I'm sorry about that. How are you feeling about your dog?") == 0.0
    assert reward(barking, "Oh no, I'm sorry about that. How are you sleeping?") > 0.1
    son = "My son took his first steps today!"
    assert reward(son, "Oh, that is so beautiful, and I'm so proud of you, my son.") == 0.0
    assert reward(son, "That's wonderful news! How did he do it?") > 0.1
