"""The output constraint: built from the typed signature, passed with the LM call, the same grammar as before."""

from __future__ import annotations

import textwrap
from typing import Literal

import dspy
import pytest

from test_prompts import DIALOGUE, FULL, INPUTS  # the prompts tests' dialogue and stage inputs
from trace_dspy.core.labels import EMOTIONS
from trace_dspy.core.stages import REGISTRY
from trace_dspy.lm.adapters import ADAPTERS, CompactChatAdapter
from trace_dspy.lm.constraint import OutputConstraint, OutputField, constraint_kwargs
from trace_dspy.lm.engine import LlamaEngine
from trace_dspy.lm.grammar import (
    DEFAULT_QUOTE_FIELDS,
    grammar_for,
    grammar_for_call,
    prompt_constraint,
)
from trace_dspy.lm.specs import TraceLM
from trace_dspy.program.pipeline import TraceProgram
from trace_dspy.compact.reply_adapter import ChatReplyAdapter

LAYOUTS = {"chat": "sections", "compact": "sections", "json": "json"}


def _signatures():
    program = TraceProgram(FULL)
    return [(stage.name, getattr(program, stage.name).signature) for stage in REGISTRY]


@pytest.mark.parametrize("name", list(ADAPTERS))
def test_the_signature_gives_the_grammar_that_the_prompt_asked_for(name):
    """Every stage under every adapter: the constraint built from the typed signature makes exactly the grammar
    that reading the rendered prompt made, quoting and candidate labels included."""
    adapter = ADAPTERS[name]()
    for stage, signature in _signatures():
        values = {k: INPUTS.get(k, f"<{k}>") for k in signature.input_fields}
        messages = adapter.format(signature, [], values)
        from_prompt = grammar_for(messages[0]["content"], messages[-1]["content"], quote_fields=DEFAULT_QUOTE_FIELDS)
        constraint = OutputConstraint.from_signature(signature, LAYOUTS[name], values)
        assert from_prompt is not None, (name, stage)
        assert grammar_for_call(constraint, quote_fields=DEFAULT_QUOTE_FIELDS) == from_prompt, (name, stage)


def test_field_kinds_follow_the_annotations():
    assert OutputField.from_annotation("e", Literal["a", "b"]) == OutputField("e", "label", ("a", "b"))
    assert OutputField.from_annotation("s", list[str]).kind == "list"
    assert [OutputField.from_annotation("x", t).kind for t in (str, bool, int, float)] == ["text", "bool", "int",
                                                                                           "float"]
    assert OutputField.from_annotation("n", Literal[1, 2]) is None  # labels must be strings
    assert OutputField.from_annotation("d", dict[str, str]) is None
    with pytest.raises(ValueError, match="kind"):
        OutputField("x", "table")
    constraint = OutputConstraint("json", (OutputField("e", "label", ("a",)),), (("dialogue", "hi"),))
    assert OutputConstraint.from_json(constraint.to_json()) == constraint


class Reworded(dspy.Signature):
    """Read the chat below and pick the single feeling word that fits the person who wrote it best."""

    dialogue: str = dspy.InputField(desc="What was said, one line per turn, the writer first.")
    emotion: Literal["sad", "proud", "afraid"] = dspy.OutputField(desc="Exactly one feeling word from the set.")


class RewordedAdapter(CompactChatAdapter):
    """The compact layout with its field list and closing line worded differently: no prompt reader knows it."""

    def format_system_message(self, signature) -> str:
        fields = ", ".join(f"{name} ({info.json_schema_extra['desc']})" for name, info in
                           signature.output_fields.items())
        return (f"{textwrap.dedent(signature.instructions).strip()}\n\nGive back: {fields}\n"
                "Write every answer below its [[ ## name ## ]] marker and finish with [[ ## completed ## ]].")


class RecordingEngine(LlamaEngine):
    """The embedded engine up to decoding: records the grammar each call decodes under, answers in layout."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.grammars: list[str | None] = []

    def _decode(self, messages, prefill, kwargs, constraint):
        self.grammars.append(grammar_for_call(constraint, limits=self.text_limits, quote_fields=self.quote_fields))
        text = "[[ ## emotion ## ]]\nsad\n\n[[ ## completed ## ]]"
        return {"id": "recorded", "choices": [{"text": text, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}


def test_a_reworded_prompt_still_decodes_constrained():
    """The prompt's wording is no part of the constraint: reworded instructions, field descriptions and
    layout lines leave the grammar that of the signature's types."""
    engine = RecordingEngine()
    lm = TraceLM("local/recording", engine=engine, cache=False)
    adapter = RewordedAdapter()
    system = adapter.format(Reworded, [], {"dialogue": DIALOGUE})[0]["content"]
    assert prompt_constraint(system) is None  # reading this prompt would have run unconstrained
    with dspy.context(lm=lm, adapter=adapter):
        out = dspy.Predict(Reworded)(dialogue=DIALOGUE)
    assert out.emotion == "sad"
    assert len(engine.grammars) == 1
    grammar = engine.grammars[0]
    assert grammar is not None and '"[[ ## emotion ## ]]\\n"' in grammar
    assert all(f'"{label}"' in grammar for label in ("sad", "proud", "afraid"))
    assert not any(f'"{label}"' in grammar for label in EMOTIONS if label not in ("sad", "proud", "afraid"))


def test_the_chat_reply_runs_unconstrained_and_plain_lms_never_see_the_keyword():
    reply = next(sig for stage, sig in _signatures() if stage == "generate_response")
    values = {k: INPUTS.get(k, "") for k in reply.input_fields}
    lm = TraceLM("local/recording", engine=RecordingEngine(), cache=False)
    assert "output_constraint" not in ChatReplyAdapter()._constrained(lm, {}, reply, values)
    emotion = next(sig for stage, sig in _signatures() if stage == "recognize_emotion")
    assert "output_constraint" in ChatReplyAdapter()._constrained(lm, {}, emotion, values)
    plain = dspy.LM("openai/gpt-4o-mini")  # refuses keywords it does not know
    assert constraint_kwargs(plain, {"temperature": 0.0}, emotion, values, "sections") == {"temperature": 0.0}


@pytest.mark.slow
@pytest.mark.embedded
def test_a_reworded_prompt_binds_the_embedded_model(local_model, monkeypatch):
    """On the real engine: the reworded prompt decodes under the signature's grammar, first time, to a label."""
    from trace_dspy.lm import engine as engine_module
    from trace_dspy.lm.specs import local_lm

    grammars = []
    real = engine_module.greedy

    def recording(llama, tokens, grammar_text, *args, **kwargs):
        grammars.append(grammar_text)
        return real(llama, tokens, grammar_text, *args, **kwargs)

    monkeypatch.setattr(engine_module, "greedy", recording)
    lm = local_lm(cache=False)
    with dspy.context(lm=lm, adapter=RewordedAdapter()):
        out = dspy.Predict(Reworded)(dialogue="Speaker: My dog died this morning.")
    assert out.emotion in ("sad", "proud", "afraid")
    assert lm.engine.stats.calls == 1  # parsed at once: no fallback call
    assert len(grammars) == 1 and '"afraid"' in grammars[0]
