"""The output grammars the embedded engine decodes under, built from the prompt (no model needed)."""

from __future__ import annotations

import json
import threading
import time

import dspy
import pytest

from trace_dspy import TraceProgram
from trace_dspy.core.labels import CAUSE_CATEGORIES, EMOTIONS
from trace_dspy.lm.adapters import CompactChatAdapter
from trace_dspy.lm.grammar import output_grammar, quotable_sentences

STAGES = ["recognize_emotion", "analyze_cause", "plan_strategy", "generate_response"]
DIALOGUE = ("Speaker: My dog Biscuit ran away yesterday. We searched the whole park.\n"
            "Listener: Oh no! Have you found him?\nSpeaker: Not yet. I keep checking the door.")


def _system(stage: str, adapter=None) -> str:
    program = TraceProgram()
    return (adapter or dspy.ChatAdapter()).format(getattr(program, stage).signature, [], {})[0]["content"]


@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.parametrize("adapter", [dspy.ChatAdapter(), CompactChatAdapter(), dspy.JSONAdapter()],
                         ids=["chat", "compact", "json"])
def test_every_stage_prompt_gets_a_grammar(stage, adapter):
    grammar = output_grammar(_system(stage, adapter))
    assert grammar and grammar.startswith("root ::= ")
    if stage == "recognize_emotion":
        for label in EMOTIONS:
            assert f'"{label}"' in grammar or f'\\"{label}\\"' in grammar


def test_grammar_layout_and_limits():
    grammar = output_grammar(_system("analyze_cause"), limits={"cause_summary": 50},
                             quotes={"trigger_spans": ["It rained.", 'He said "no".']})
    assert '"[[ ## trigger_spans ## ]]\\n"' in grammar
    assert grammar.rstrip().endswith('"\\n\\n[[ ## completed ## ]]"')
    assert "{0,49}" in grammar  # the cause_summary cap
    assert json.dumps(json.dumps('He said "no".')) in grammar  # JSON-escaped, then GBNF-quoted
    for category in CAUSE_CATEGORIES:
        assert f'"{category}"' in grammar


def test_unrecognised_prompts_run_unconstrained():
    assert output_grammar("You are a helpful assistant.") is None
    weird = _system("recognize_emotion").replace("Literal[", "dict[str, Literal[")
    assert output_grammar(weird) is None


def test_quotable_sentences_come_from_speaker_turns_only():
    user = "[[ ## dialogue ## ]]\n" + DIALOGUE + "\n\n[[ ## emotion ## ]]\nsad"
    assert quotable_sentences(user, "dialogue") == [
        "My dog Biscuit ran away yesterday.", "We searched the whole park.", "Not yet.", "I keep checking the door.",
    ]
    assert quotable_sentences(user, "missing") == []


def test_label_sets_are_parsed_once_and_never_by_two_threads_at_once(monkeypatch):
    """CPython 3.11's ast.parse is not thread-safe ("AST constructor recursion depth mismatch" in a threaded
    run): grammars parse each Literal type once, under a lock."""
    from trace_dspy.lm import grammar

    monkeypatch.setattr(grammar, "_LITERALS", {})
    inside, overlaps, calls = [0], [0], [0]
    real = grammar.ast.literal_eval

    def counting(text):
        calls[0] += 1
        inside[0] += 1
        overlaps[0] += inside[0] > 1
        try:
            time.sleep(0.001)
            return real(text)
        finally:
            inside[0] -= 1

    monkeypatch.setattr(grammar.ast, "literal_eval", counting)
    types = [f"Literal['a{i}', 'b{i}']" for i in range(20)]
    threads = [threading.Thread(target=lambda: [grammar.field_from_type("f", t) for t in types])
               for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert overlaps[0] == 0
    assert calls[0] == len(types)
    field = grammar.field_from_type("f", "Literal['x', 'y']")
    assert grammar._value_rule(field, False, 10, None, choices=["y"]) == '("y")'
