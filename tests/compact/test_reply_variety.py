"""The reply race's variety penalty: a reply that opens as the recent ones did gives way on a tie."""

from __future__ import annotations

import dspy
import pytest

from trace_dspy import ProgramConfig, TraceProgram
from trace_dspy.core.config import ConfigError
from trace_dspy.compact.reply_variety import RecentOpenings, opening
from trace_dspy.compact.writer import opening_history
from trace_dspy.testing.fakes import fake_lm

# The compact writer races the plans; the fields layout lets the fake LM answer by the plan's fields.
COMPACT = {"writer": "compact", "reply_format": "fields"}
REPLIES = {"IP+EX": "That sounds hard. What happened next?", "EX+EX": "Oh no, that is hard. How are you now?"}


def writer(outputs, inputs):
    if "response" in outputs and "strategy" in inputs:
        return {"response": REPLIES[f"{inputs['strategy']}+{inputs.get('secondary_strategy', inputs['strategy'])}"]}
    return {}


def race(penalty: float, history: list[str] | None):
    lm, _ = fake_lm(writer, strategy="IP", secondary_strategy="EX")
    program = TraceProgram(ProgramConfig(prior_k=0, best_of=1, variety_penalty=penalty, **COMPACT))
    program.reply_plans = ["EX+EX"]
    program.reward_fn = lambda inputs, pred: 0.5  # every reply ties
    if history is not None:
        program.remember_openings(size=4)
        for reply in history:
            opening_history(program).add(reply)
    with dspy.context(lm=lm):
        return program(dialogue="Speaker: my exam went badly."), program


def test_the_penalty_changes_the_choice_when_two_candidates_tie():
    said_before = ["That sounds awful.", "That sounds like a lot.", "Oh, that is sad."]
    kept, _ = race(0.1, None)  # no history: the first of equals, the LM's own plan
    assert kept.response == REPLIES["IP+EX"]
    kept, program = race(0.1, said_before)  # "that sounds" opened two of the last three
    assert kept.response == REPLIES["EX+EX"]
    assert kept.reply_rewards == [0.5, 0.5]  # the recorded rewards are the metric's own
    assert program.recent_openings.share("Oh no, what a day.") == pytest.approx(1 / 4)  # the kept one was added
    kept, _ = race(0.0, said_before)  # the penalty off
    assert kept.response == REPLIES["IP+EX"]


def test_a_clear_winner_is_kept_whatever_it_opens_with():
    lm, _ = fake_lm(writer, strategy="IP", secondary_strategy="EX")
    program = TraceProgram(ProgramConfig(prior_k=0, best_of=1, **COMPACT)).remember_openings(size=4)
    program.reply_plans = ["EX+EX"]
    program.reward_fn = lambda inputs, pred: 0.9 if pred.response.startswith("That") else 0.5
    for reply in ["That sounds awful.", "That sounds fine."]:
        opening_history(program).add(reply)
    with dspy.context(lm=lm):
        assert program(dialogue="Speaker: my exam went badly.").response == REPLIES["IP+EX"]


def test_openings_and_history():
    assert opening("  That's SO great, really!") == "that's so"
    assert opening("") == ""
    recent = RecentOpenings(size=2)
    assert recent.share("That sounds fine.") == 0.0
    for reply in ("That sounds fine.", "Oh no.", "That sounds bad."):
        recent.add(reply)
    assert len(recent) == 2 and recent.share("that sounds odd") == pytest.approx(0.5)
    with pytest.raises(ValueError):
        RecentOpenings(size=0)
    with pytest.raises(ConfigError, match="variety_penalty"):
        ProgramConfig(variety_penalty=-0.1)


def test_copies_start_without_a_history():
    program = TraceProgram().remember_openings()
    opening_history(program).add("That sounds fine.")
    copy = program.deepcopy()
    assert copy.recent_openings is None and opening_history(copy) is None and len(program.recent_openings) == 1


def test_best_of_n_samples_stand_by_the_penalty_too():
    from trace_dspy.compact.reply_variety import RecentOpenings as History

    replies = iter(["That sounds hard. How are you?", "That sounds bad. How are you?", "Oh no. How are you?"])

    def writer(outputs, inputs):
        return {"response": next(replies)} if "response" in outputs else {}

    lm, _ = fake_lm(writer, strategy="ER", secondary_strategy="EX")
    program = TraceProgram(ProgramConfig(prior_k=0, best_of=3, best_of_threshold=1.0, variety_penalty=0.2,
                                         **COMPACT))
    program.recent_openings = History(4)
    for said in ("That sounds fine.", "That sounds long."):
        program.recent_openings.add(said)
    program.reward_fn = lambda inputs, pred: 0.55 if pred.response.startswith("That") else 0.5
    with dspy.context(lm=lm):
        kept = program(dialogue="Speaker: my exam went badly.")
    # Both "That sounds" samples score 0.55 but stand at 0.55 - 0.2 * 2/2 = 0.35; "Oh no" stands at 0.5.
    assert kept.response == "Oh no. How are you?"
    assert kept.reply_rewards == [0.55, 0.55, 0.5]
