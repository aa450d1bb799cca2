"""The scaffolded reply's tone bands and opener choice: a sure tone is acknowledged in a whole sentence of that tone,
and with a history of openings the first reply takes the opener recent replies used least."""

from __future__ import annotations

import dspy
import pytest

from trace_dspy import ProgramConfig, TraceProgram
from trace_dspy.core.openers import (
    BAND_ACKNOWLEDGEMENTS,
    BAND_OPENERS,
    PLEASANT_AT_LEAST,
    SCAFFOLD_OPENERS,
    UNPLEASANT_AT_MOST,
    WHOLE_QUESTIONS,
    tone_band,
)
from trace_dspy.program.pipeline import stage_signature
from trace_dspy.program.reply_adapter import ChatReplyAdapter
from trace_dspy.program.reply_cue import ReplyCue, current_cue, reply_cue
from trace_dspy.program.reply_text import openers_for, scaffold_openers, spare_openers
from trace_dspy.program.reply_variety import RecentOpenings, opening
from trace_dspy.testing.fakes import fake_lm

PLAN = {"strategy": "ER", "secondary_strategy": "EX"}


def test_bands_follow_the_prior_pleasantness():
    assert tone_band(None) == "mixed"
    assert tone_band(UNPLEASANT_AT_MOST) == "unpleasant" and tone_band(UNPLEASANT_AT_MOST + 0.01) == "mixed"
    assert tone_band(PLEASANT_AT_LEAST) == "pleasant" and tone_band(PLEASANT_AT_LEAST - 0.01) == "mixed"
    assert ReplyCue(pleasant=0.05).band == "unpleasant" and ReplyCue().band == "mixed"
    # A band's acknowledgements are of one tone, and no two open alike (the history tells them apart by their
    # first two words).
    for band, table in BAND_OPENERS.items():
        assert set(table["ER"]) <= BAND_ACKNOWLEDGEMENTS
        assert len({opening(o) for o in table["ER"]}) == len(table["ER"])
    assert not set(BAND_OPENERS["pleasant"]["ER"]) & set(BAND_OPENERS["unpleasant"]["ER"])
    # Mixed keeps the stock openers; a sure band replaces the acknowledgement and the question, not IP.
    assert openers_for(PLAN, band="mixed") == SCAFFOLD_OPENERS
    sad = openers_for(PLAN, band="unpleasant")
    assert sad["ER"] == BAND_OPENERS["unpleasant"]["ER"] and sad["IP"] == SCAFFOLD_OPENERS["IP"]


def test_the_cue_is_set_for_its_block_only():
    assert current_cue() == ReplyCue()
    with pytest.raises(RuntimeError):
        with reply_cue(ReplyCue(pleasant=0.9)):
            assert current_cue().band == "pleasant"
            raise RuntimeError("the reply failed")
    assert current_cue() == ReplyCue()  # restored after an error too


def test_with_a_history_the_first_reply_takes_the_least_used_opener():
    table = openers_for(PLAN, band="unpleasant")
    message = {**PLAN, "dialogue": "Speaker: My bike was stolen."}
    first = scaffold_openers(message, 0, table)[0]  # no history: this message's place
    assert first in BAND_OPENERS["unpleasant"]["ER"]
    recent = RecentOpenings(8)
    recent.add(first + " How are you?")
    again = scaffold_openers(message, 0, table, recent=recent)[0]
    assert again != first  # the opening used last gives way
    # Over a batch of sad messages every acknowledgement gets its turn before one comes round again.
    recent, seen = RecentOpenings(20), []
    for i in range(len(BAND_OPENERS["unpleasant"]["ER"])):
        lead = scaffold_openers({**PLAN, "dialogue": f"Speaker: Bad news number {i}."}, 0, table, recent=recent)[0]
        seen.append(lead)
        recent.add(lead)
    assert sorted(seen) == sorted(BAND_OPENERS["unpleasant"]["ER"])
    # Model-continued openers rotate over the first ``variety`` only, history or not.
    stock = [scaffold_openers({**PLAN, "dialogue": f"Speaker: day {i}."}, 0, SCAFFOLD_OPENERS, 1, recent)[0]
             for i in range(10)]
    assert set(stock) == {"That sounds"}
    # Only the acknowledgement varies: an IP lead is always its best opener, history or not.
    leads = {scaffold_openers({"strategy": "IP", "secondary_strategy": "EX", "dialogue": f"Speaker: day {i}."}, 0,
                              SCAFFOLD_OPENERS, 3, recent)[0] for i in range(10)}
    assert leads == {SCAFFOLD_OPENERS["IP"][0]}
    assert RecentOpenings(3).least_used([]) == 0


def _writer(prefills: list, stuck: str = ""):
    """Goes on from an acknowledgement with what it is about, from a question with its end; adds nothing to
    an opener ending in ``stuck``."""
    def responder(outputs, inputs):
        if "prefill" not in inputs:
            return {}
        prefills.append(inputs["prefill"])
        prefill = inputs["prefill"]
        if stuck and prefill.endswith(stuck):
            return {"response": "."}
        if prefill.endswith("about"):
            return {"response": " your bike."}
        return {"response": " about the bike now?" if prefill.endswith("feeling") else " awful."}
    return responder


def _reply(lm, pleasant: float) -> str:
    signature = stage_signature("generate_response", ProgramConfig(reply_format="scaffold"))
    inputs = {"dialogue": "Speaker: Someone stole my bike.", "emotion": "sad", **PLAN}
    with dspy.context(lm=lm, adapter=ChatReplyAdapter(scaffold=True)), reply_cue(ReplyCue(pleasant=pleasant)):
        return dspy.Predict(signature)(**{k: v for k, v in inputs.items() if k in signature.input_fields}).response


def test_a_band_acknowledgement_is_continued_and_a_stuck_one_gives_way_to_the_next():
    prefills: list = []
    lm, _ = fake_lm(_writer(prefills))
    reply = _reply(lm, 0.02)
    ack = next(a for a in BAND_OPENERS["unpleasant"]["ER"] if reply.startswith(a))
    assert reply == f"{ack} your bike. How are you feeling about the bike now?"
    assert prefills == [ack, f"{ack} your bike. How are you feeling"]
    # Where the model adds nothing to it, the band's next acknowledgement is tried in its place.
    inputs = {"dialogue": "Speaker: Someone stole my bike.", **PLAN}
    table = openers_for(inputs, band="unpleasant")
    options = BAND_OPENERS["unpleasant"]["ER"]
    assert spare_openers(inputs, 0, table)[0] == options[(options.index(ack) + 1) % len(options)]
    prefills.clear()
    lm, _ = fake_lm(_writer(prefills, stuck=ack))
    reply = _reply(lm, 0.02)
    assert prefills[:2] == [ack, spare_openers(inputs, 0, table)[0]]
    assert reply.startswith(spare_openers(inputs, 0, table)[0] + " your bike.")
    # Later candidates keep the acknowledgement (and vary the question).
    assert scaffold_openers(inputs, 1, table)[0] == ack
    assert scaffold_openers(inputs, 1, table)[1] == BAND_OPENERS["unpleasant"]["EX"][1]
    # That question is a whole one: the model is not asked to go on from it ("How are you holding up your end?").
    assert BAND_OPENERS["unpleasant"]["EX"][1] in WHOLE_QUESTIONS
    prefills.clear()
    lm, _ = fake_lm(_writer(prefills))
    signature = stage_signature("generate_response", ProgramConfig(reply_format="scaffold"))
    dialogue = {"dialogue": "Speaker: Someone stole my bike.", "emotion": "sad", **PLAN}
    with dspy.context(lm=lm.copy(rollout_id=0), adapter=ChatReplyAdapter(scaffold=True)), \
            reply_cue(ReplyCue(pleasant=0.02)):
        reply = dspy.Predict(signature)(**{k: v for k, v in dialogue.items() if k in signature.input_fields}).response
    assert reply == f"{ack} your bike. How are you holding up?"
    assert prefills == [ack]


def test_the_program_acknowledges_in_the_prior_s_tone(monkeypatch):
    prefills: list = []
    lm, _ = fake_lm(_writer(prefills), strategy="ER", secondary_strategy="EX")
    program = TraceProgram(ProgramConfig(reply_format="scaffold", prior_k=0, best_of=1))
    for pleasant, band in ((0.9, "pleasant"), (0.1, "unpleasant")):
        monkeypatch.setattr(program, "situation_pleasant", lambda dialogue, p=pleasant: p)
        with dspy.context(lm=lm):
            reply = program(dialogue="Speaker: My news today.").response
        assert any(reply.startswith(ack) for ack in BAND_OPENERS[band]["ER"]), reply
    monkeypatch.setattr(program, "situation_pleasant", lambda dialogue: 0.5)  # unsure: the model writes the lead
    with dspy.context(lm=lm):
        reply = program(dialogue="Speaker: My news today.").response
    assert any(reply.startswith(f"{opener} awful.") for opener in SCAFFOLD_OPENERS["ER"]), reply


def test_best_of_n_samples_stand_by_the_penalty_too():
    from trace_dspy.program.reply_variety import RecentOpenings as History

    replies = iter(["That sounds hard. How are you?", "That sounds bad. How are you?", "Oh no. How are you?"])

    def writer(outputs, inputs):
        return {"response": next(replies)} if "response" in outputs else {}

    lm, _ = fake_lm(writer, strategy="ER", secondary_strategy="EX")
    program = TraceProgram(ProgramConfig(prior_k=0, best_of=3, best_of_threshold=1.0, variety_penalty=0.2))
    program.recent_openings = History(4)
    for said in ("That sounds fine.", "That sounds long."):
        program.recent_openings.add(said)
    program.reward_fn = lambda inputs, pred: 0.55 if pred.response.startswith("That") else 0.5
    with dspy.context(lm=lm):
        kept = program(dialogue="Speaker: my exam went badly.")
    # Both "That sounds" samples score 0.55 but stand at 0.55 - 0.2 * 2/2 = 0.35; "Oh no" stands at 0.5.
    assert kept.response == "Oh no. How are you?"
    assert kept.reply_rewards == [0.55, 0.55, 0.5]


@pytest.mark.slow
def test_the_shipped_reward_prefers_a_reply_about_the_speaker():
    """The reply reward with the shipped heads (no LM): replies that are not about the speaker's situation, or
    that speak as the speaker, lose to plain ones that are."""
    program = TraceProgram()

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
