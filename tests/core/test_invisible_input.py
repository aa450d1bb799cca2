"""A message that shows nothing is refused like a blank one, before any model is asked (and paid) to answer it.

Zero-width spaces (U+200B), bidi controls, a BOM (U+FEFF) and their kin are
not whitespace to ``str.split``, so a message of only them used to reach the
model. Each entry point is driven with them: ``respond "MESSAGE"``, ``chat``,
``respond --input`` (an error row for that line, no model call) and the
program itself; visible text, accents and emoji are still answered.
"""

from __future__ import annotations

import io
import json
import sys

import dspy
import pytest
from conftest import fake_every_lm

from trace_dspy import TraceProgram
from trace_dspy.core.dialogue import DialogueError, normalize_dialogue
from trace_dspy.testing.fakes import fake_lm

INVISIBLE = {
    "zero-width spaces": "\u200b\u200b\u200b",
    "a BOM": "\ufeff",
    "bidi controls": "\u202e\u2066\u2069\u200f",
    "joiners and word joiners": "\u200c\u200d\u2060",
    "a Hangul filler and a blank Braille pattern": "\u3164 \u2800",
    "invisible mixed with whitespace": " \u200b\t\ufeff\u00a0\u2028",
}


def echo(outputs, inputs):
    if "response" in outputs:
        return {"response": "heard: " + inputs["dialogue"].splitlines()[-1]}
    return {}


@pytest.fixture
def engine(monkeypatch):
    """Every LM the commands build is one scripted fake; its engine records the calls."""
    return fake_every_lm(monkeypatch, echo)


@pytest.mark.parametrize("text", INVISIBLE.values(), ids=INVISIBLE.keys())
def test_the_program_refuses_a_message_that_shows_nothing(text):
    with pytest.raises(DialogueError, match="empty"):
        normalize_dialogue(text)
    with pytest.raises(DialogueError, match="turn 2 .* is empty"):
        normalize_dialogue(["I lost my job.", text, "And then my car broke."])
    lm, engine = fake_lm(echo)
    with dspy.context(lm=lm), pytest.raises(DialogueError):
        TraceProgram()(dialogue=text)
    assert engine.calls == []


@pytest.mark.parametrize("text", ["café", "🙂", "hi\u200b", "\u200bok", "ありがとう"])
def test_visible_text_with_or_without_invisible_characters_is_kept(text):
    assert normalize_dialogue(text) == f"Speaker: {text}"


@pytest.mark.parametrize("text", INVISIBLE.values(), ids=INVISIBLE.keys())
def test_respond_refuses_it_before_any_model_call(engine, capsys, text):
    from trace_dspy.cli.respond import main

    assert main([text]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: dialogue is empty") and len(err.strip().splitlines()) == 1, err
    assert engine.calls == []


def test_chat_refuses_it_and_the_conversation_goes_on(engine, capsys, monkeypatch):
    from trace_dspy.cli.chat import main

    lines = [*INVISIBLE.values(), "I lost my keys.", "\u200b\u200b"]
    monkeypatch.setattr(sys, "stdin", io.StringIO("".join(f"{line}\n" for line in lines)))
    assert main([]) == 0
    out = capsys.readouterr().out
    replies = [line for line in out.splitlines() if line.startswith("trace> ")]
    assert replies == ["trace> heard: Speaker: I lost my keys."], out
    assert out.count("error: ") == len(INVISIBLE) + 1 and "is empty" in out
    answered = {c.inputs.get("dialogue") for c in engine.calls}
    assert answered == {"Speaker: I lost my keys."}  # the model saw only the visible turn


def test_respond_input_makes_an_error_row_without_a_model_call(engine, tmp_path, capsys):
    from trace_dspy.cli.respond import main

    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    rows = [{"id": name, "turns": [text]} for name, text in INVISIBLE.items()]
    rows += [{"id": "dialogue string", "dialogue": "Speaker: \ufeff\u200b"},
             {"id": "listener only invisible", "turns": ["I got the job!", "\u200b", "I start Monday."]}]
    src.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    assert main(["--input", str(src), "--output", str(out)]) == 1
    written = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert [r["id"] for r in written] == [r["id"] for r in rows]
    assert all("is empty" in r.get("error", "") and not r.get("response") for r in written), written
    assert engine.calls == []
    assert f"{len(rows)} failed" in capsys.readouterr().err
