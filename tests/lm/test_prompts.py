"""One prompt parser (trace_dspy.lm.prompts) for the engine and the fakes: one test per adapter."""

from __future__ import annotations

from dataclasses import replace

import dspy
import pytest

from trace_dspy.core.config import ProgramConfig
from trace_dspy.core.stages import REGISTRY
from trace_dspy.lm import prompts
from trace_dspy.lm.adapters import CompactChatAdapter
from trace_dspy.lm.grammar import grammar_for, output_grammar
from trace_dspy.program.pipeline import TraceProgram
from trace_dspy.compact.reply_adapter import ChatReplyAdapter, is_reply_signature
from trace_dspy.testing.fakes import fake_lm

DIALOGUE = ("Speaker: My dog Biscuit ran away yesterday. We searched the whole park.\n"
            "Listener: Oh no! Have you found him?\nSpeaker: Not yet. I keep checking the door.")
INPUTS = {
    "dialogue": DIALOGUE, "emotion": "sad", "emotion_candidates": "sad (61%), devastated (20%), lonely (9%)",
    "trigger_spans": ["My dog Biscuit ran away yesterday."], "cause_summary": "Their dog ran away.",
    "cause_category": "Loss & Failure", "strategy": "ER", "secondary_strategy": "EX",
    "exemplars": ["Speaker: I lost my cat.\nListener (reply): That is so hard."], "commonsense": "xWant: to find him",
    "revision_note": "", "response": "I'm so sorry about Biscuit.",
}
FULL = ProgramConfig(commonsense=True, reflection=True, prior_k=3, reasoning=("recognize_emotion",))


def _prompt(adapter, signature):
    values = {name: INPUTS.get(name, f"<{name}>") for name in signature.input_fields}
    messages = adapter.format(signature, [], values)
    return messages[0]["content"], messages[-1]["content"], values


def _signatures():
    program = TraceProgram(FULL)
    return [(stage.name, getattr(program, stage.name).signature) for stage in REGISTRY]


ADAPTERS = {"chat": dspy.ChatAdapter(), "compact": CompactChatAdapter(), "json": dspy.JSONAdapter()}


@pytest.mark.parametrize("name", list(ADAPTERS))
def test_the_parser_reads_every_stage_prompt_of_each_structured_adapter(name):
    adapter = ADAPTERS[name]
    for stage, signature in _signatures():
        system, user, values = _prompt(adapter, signature)
        # the output fields, in order, with their types: what both the engine's grammar and the fake answer
        assert prompts.output_names(system) == tuple(signature.output_fields), (name, stage)
        assert prompts.layout(system) == ("json" if name == "json" else "sections")
        # the input sections: what the fake's responders see and where the engine reads quotes and labels
        found = prompts.sections(user)
        assert set(found) == set(values), (name, stage)
        assert found["dialogue"] == DIALOGUE
        assert "Respond with" not in " ".join(found.values())
        assert prompts.instructions(system).startswith(signature.instructions.strip()[:40])
        # the engine builds a grammar naming the same fields from the same parse
        grammar = output_grammar(system)
        assert grammar is not None, (name, stage)
        for field in signature.output_fields:
            assert (f"[[ ## {field} ## ]]" in grammar) or (f'\\"{field}\\"' in grammar), (name, stage, field)


@pytest.mark.parametrize("name", list(ADAPTERS))
def test_the_fake_answers_each_adapter_in_its_layout_and_the_program_parses_it(name):
    lm, fake = fake_lm(follow_layout=True)
    program = TraceProgram(replace(FULL, adapter=name))
    with dspy.context(lm=lm):
        prediction = program(dialogue=DIALOGUE)
    assert prediction.response == "I'm sorry the driving test went that way again; how are you holding up?"
    stages = fake.stage_order()
    assert stages[:2] == ["recognize_emotion", "infer_commonsense"] and "reflect" in stages
    assert "unknown" not in stages
    first = fake.calls[0]
    assert first.inputs["dialogue"] == DIALOGUE  # sections parsed by the shared code
    assert first.instructions.startswith(program.recognize_emotion.signature.instructions.strip()[:40])


def test_the_chat_reply_layout_has_no_output_fields_and_both_sides_agree():
    adapter = ChatReplyAdapter()
    signature = next(sig for stage, sig in _signatures() if stage == "generate_response")
    assert is_reply_signature(signature)
    system, user, _ = _prompt(adapter, signature)
    assert prompts.output_fields(system) == [] and prompts.layout(system) is None
    assert grammar_for(system, user) is None  # the engine runs it unconstrained (a stop at the line break)
    lm, fake = fake_lm(response="That sounds so hard; I'm sorry about Biscuit.")
    with dspy.context(lm=lm, adapter=adapter):
        out = dspy.Predict(signature)(**{k: INPUTS.get(k, "") for k in signature.input_fields})
    assert out.response == "That sounds so hard; I'm sorry about Biscuit."
    assert fake.calls[-1].outputs == ("response",) and fake.calls[-1].inputs["message"] == "Not yet. I keep checking the door."


def test_a_last_input_section_stops_before_the_closing_line():
    # The engine used to read "Respond with the corresponding output fields..." as part of the last input section,
    # so it became a quotable "sentence" of the speaker; the shared parser stops at that line.
    signature = next(sig for stage, sig in _signatures() if stage == "recognize_emotion")
    _, user, _ = _prompt(dspy.ChatAdapter(), signature)
    last = list(prompts.sections(user))[-1]
    assert not prompts.section(user, last).rstrip().endswith("]]")
    assert "Respond with" not in prompts.section(user, last)


def test_parse_failures_are_counted_where_the_adapter_fails():
    from dspy.utils.exceptions import AdapterParseError

    from trace_dspy.lm.adapters import parse_failures

    before = sum(parse_failures().values())
    lm, fake = fake_lm(response="Listener:   ")  # nothing left once the role prefix is removed
    with dspy.context(lm=lm), pytest.raises(AdapterParseError):
        TraceProgram(ProgramConfig(reply_format="chat", prior_k=0))(dialogue=DIALOGUE)
    # the chat-reply adapter's parse failed once; DSPy's JSON fallback then failed in its own parser
    assert sum(parse_failures().values()) - before == 1
    assert len(fake.calls) == 5  # three analysis stages, the reply, and the fallback's second try
