"""The reply cue (program.reply_cue): set for its block only, and read by the scaffolded reply, so that a sure tone
is acknowledged in a whole sentence of that tone. The opener tables it chooses from: test_reply_text.py."""

from __future__ import annotations

import dspy
import pytest

from trace_dspy import ProgramConfig, TraceProgram
from trace_dspy.core.openers import BAND_OPENERS, SCAFFOLD_OPENERS, WHOLE_QUESTIONS
from trace_dspy.program.pipeline import stage_signature
from trace_dspy.program.reply_adapter import ChatReplyAdapter
from trace_dspy.program.reply_cue import ReplyCue, current_cue, reply_cue
from trace_dspy.program.reply_text import openers_for, scaffold_openers, spare_openers
from trace_dspy.testing.fakes import fake_lm

PLAN = {"strategy": "ER", "secondary_strategy": "EX"}


def test_the_cue_is_set_for_its_block_only():
    assert current_cue() == ReplyCue()
    with pytest.raises(RuntimeError):
        with reply_cue(ReplyCue(pleasant=0.9)):
            assert current_cue().band == "pleasant"
            raise RuntimeError("the reply failed")
    assert current_cue() == ReplyCue()  # restored after an error too


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
