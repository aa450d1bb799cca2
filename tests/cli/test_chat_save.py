"""chat's /save holds --output's standard: a file that is not a transcript this command saved is refused with one
line and left byte for byte as it was, and saving again to the same file (more turns, a new conversation after
/reset) keeps everything the file held."""

from __future__ import annotations

import json

import pytest
from conftest import run_repl

from trace_dspy import TraceProgram
from trace_dspy.data.sources import read_jsonl
from trace_dspy.testing.fakes import fake_lm
from trace_dspy.workflows.conversation import ChatSession


def echo(outputs, inputs):
    if "response" in outputs:
        return {"response": "you said: " + inputs["dialogue"].splitlines()[-1].split(": ", 1)[1]}
    return {}


def chat(lines: list[str], session: ChatSession | None = None) -> tuple[ChatSession, list[str]]:
    """Run the REPL over ``lines``; returns the session and what it printed."""
    if session is None:
        lm, _ = fake_lm(echo)
        session = ChatSession(TraceProgram(), lm)
    code, out = run_repl(session, lines)
    assert code == 0
    return session, out


def respond_output() -> bytes:
    row = {"id": "r1", "line": 1, "dialogue_sha256": "0" * 64, "dialogue": "Speaker: hi", "response": "hello",
           "stages": {}, "trace_dspy_output": 1}
    return (json.dumps(row) + "\n").encode()


@pytest.mark.parametrize("content", [
    "plain notes", "a dataset of the user's", "a respond output", "one transcript line and one of the user's",
])
def test_save_refuses_a_file_that_is_not_a_transcript_and_leaves_it_unchanged(tmp_path, content):
    transcript = {"id": "chat-0123abcd-1", "conversation_id": "chat-0123abcd", "turns": ["hi"], "emotion": "sad",
                  "reply": "hello"}
    data = {
        "plain notes": b"my own notes, written by hand\n",
        "a dataset of the user's": (json.dumps({"id": "d1", "turns": ["hi"], "reply": "hello", "emotion": "sad"})
                                    + "\n").encode(),
        "a respond output": respond_output(),
        "one transcript line and one of the user's": (json.dumps(transcript) + "\n" + json.dumps(
            {"id": "mine", "turns": ["x"], "reply": "y", "emotion": "sad"}) + "\n").encode(),
    }[content]
    target = tmp_path / "notes.jsonl"
    target.write_bytes(data)
    session, out = chat(["I lost my keys.", f"/save {target}"])
    errors = [line for line in out if line.startswith("error:")]
    assert len(errors) == 1 and "is not a chat transcript" in errors[0] and str(target) in errors[0], out
    assert not any(line.startswith("(saved") for line in out)
    assert target.read_bytes() == data
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.jsonl"]  # no lock or temporary file left


def test_saving_again_and_after_reset_to_one_file_keeps_every_exchange(tmp_path):
    target = tmp_path / "talk.jsonl"
    session, out = chat(["I lost my keys.", f"/save {target}", "I found them in the fridge!", f"/save {target}"])
    first_id = session.conversation_id
    assert [line for line in out if line.startswith("(saved")] == [f"(saved 1 exchange to {target})",
                                                                    f"(saved 2 exchanges to {target})"]
    # The user corrects a predicted emotion by hand, then the same session goes on after /reset.
    lines = target.read_text().splitlines()
    corrected = {**json.loads(lines[0]), "emotion": "anxious"}
    target.write_text(json.dumps(corrected) + "\n" + lines[1] + "\n")
    _, out = chat(["/reset", "My sister is visiting.", f"/save {target}"], session)
    assert not any(line.startswith("error:") for line in out), out
    saved = read_jsonl(target)
    assert [(s.conversation_id, len(s.turns)) for s in saved] == [
        (first_id, 1), (first_id, 3), (session.conversation_id, 1)]
    assert json.loads(target.read_text().splitlines()[0]) == corrected  # the hand correction is kept
    assert sorted(p.name for p in tmp_path.iterdir()) == ["talk.jsonl"]


def test_save_writes_into_an_empty_file_and_refuses_a_link(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.touch()
    elsewhere = tmp_path / "elsewhere.jsonl"
    elsewhere.write_text("my own notes\n")
    link = tmp_path / "link.jsonl"
    link.symlink_to(elsewhere)
    _, out = chat(["I passed my exam!", f"/save {empty}", f"/save {link}"])
    assert f"(saved 1 exchange to {empty})" in out and len(read_jsonl(empty)) == 1
    errors = [line for line in out if line.startswith("error:")]
    assert len(errors) == 1 and "symbolic link" in errors[0]
    assert link.is_symlink() and elsewhere.read_text() == "my own notes\n"

