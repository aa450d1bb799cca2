"""The reply cue (compact.reply_cue): passed with each scaffolded reply call, whose openers it picks, so that a
sure tone is acknowledged in a whole sentence of that tone. The opener tables it chooses from: test_reply_text.py."""

from __future__ import annotations

import dspy

from trace_dspy import ProgramConfig, TraceProgram
from trace_dspy.compact.openers import BAND_OPENERS, SCAFFOLD_OPENERS, WHOLE_QUESTIONS
from trace_dspy.compact.reply_adapter import ChatReplyAdapter
from trace_dspy.compact.reply_cue import ReplyCue
from trace_dspy.compact.reply_text import openers_for, scaffold_openers, spare_openers
from trace_dspy.compact.scaffold import ScaffoldedReply
from trace_dspy.program.pipeline import stage_signature
from trace_dspy.testing.fakes import fake_lm

PLAN = {"strategy": "ER", "secondary_strategy": "EX"}


def _scaffolded() -> tuple[ScaffoldedReply, dict]:
    """A scaffolded reply over the reply stage's predictor, and the stage's inputs for a stolen bike."""
    signature = stage_signature("generate_response", ProgramConfig(reply_format="scaffold"))
    inputs = {"dialogue": "Speaker: Someone stole my bike.", "emotion": "sad", **PLAN}
    module = ScaffoldedReply(dspy.Predict(signature), ChatReplyAdapter(scaffold=True))
    return module, {k: v for k, v in inputs.items() if k in signature.input_fields}


def test_each_call_s_cue_picks_its_openers_and_does_not_leak_into_the_next():
    prefills: list = []
    lm, _ = fake_lm(_writer(prefills))
    module, inputs = _scaffolded()
    with dspy.context(lm=lm):
        pleasant = module(cue=ReplyCue(pleasant=0.9), **inputs).response
        unpleasant = module(cue=ReplyCue(pleasant=0.02), **inputs).response
        unsure = module(**inputs).response  # no cue: no tone band, the stock openers
        again = module(cue=ReplyCue(pleasant=0.9), **inputs).response
    assert any(pleasant.startswith(ack) for ack in BAND_OPENERS["pleasant"]["ER"]), pleasant
    assert any(unpleasant.startswith(ack) for ack in BAND_OPENERS["unpleasant"]["ER"]), unpleasant
    assert any(unsure.startswith(f"{opener} awful.") for opener in SCAFFOLD_OPENERS["ER"]), unsure
    assert again == pleasant


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
    module, inputs = _scaffolded()
    with dspy.context(lm=lm):
        return module(cue=ReplyCue(pleasant=pleasant), **inputs).response


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
    module, inputs = _scaffolded()
    with dspy.context(lm=lm.copy(rollout_id=0)):
        reply = module(cue=ReplyCue(pleasant=0.02), **inputs).response
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
