"""python -m trace_dspy.chat: the conversation logic in-process, and the command driven through a pty."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import pexpect
import pytest
from conftest import run_repl

from trace_dspy import TraceProgram
from trace_dspy.data.sources import read_jsonl
from trace_dspy.testing.fakes import fake_lm
from trace_dspy.workflows.conversation import ChatSession

FAKE_CLI = Path(__file__).resolve().parents[1] / "fake_cli.py"


def echo(outputs, inputs):
    """Reply with the speaker's last turn; fail the call on 'boom'; a label that varies."""
    last = inputs.get("dialogue", "").splitlines()[-1]
    if "boom" in last:
        raise RuntimeError("backend exploded")
    if "response" in outputs:
        return {"response": "you said: " + last.split(": ", 1)[1]}
    if "emotion" in outputs:
        return {"emotion": "joyful" if "!" in last else "sad"}
    return {}


def run_lines(session, lines):
    return run_repl(session, lines)


def test_turns_accumulate_and_the_program_sees_the_whole_dialogue():
    lm, engine = fake_lm(echo)
    session = ChatSession(TraceProgram(), lm)
    session.say("I got the job!")
    session.say("I start   on Monday.")
    assert session.turns() == ["I got the job!", "you said: I got the job!", "I start on Monday.",
                               "you said: I start on Monday."]
    last_reply_call = [c for c in engine.calls if "response" in c.outputs][-1]
    assert last_reply_call.inputs["dialogue"] == (
        "Speaker: I got the job!\nListener: you said: I got the job!\nSpeaker: I start on Monday.")
    assert [e.emotion for e in session.exchanges] == ["joyful", "sad"]


def test_saved_conversation_loads_back_with_the_data_loader(tmp_path):
    lm, _ = fake_lm(echo)
    session = ChatSession(TraceProgram(), lm)
    for text in ("My dog ran away!", "We searched all night.", "Still nothing."):
        session.say(text)
    path = session.save(tmp_path / "sub" / "chat.jsonl")
    samples = read_jsonl(path)
    assert [len(s.turns) for s in samples] == [1, 3, 5]
    assert len({s.conversation_id for s in samples}) == 1
    last = samples[-1]
    assert last.turns == ("My dog ran away!", "you said: My dog ran away!", "We searched all night.",
                          "you said: We searched all night.", "Still nothing.")
    assert last.response == "you said: Still nothing."
    assert [s.emotion for s in samples] == ["joyful", "sad", "sad"]
    # Each record is the dialogue the program answered, in the form evaluation feeds it back.
    assert last.to_example().dialogue.endswith("Listener: you said: We searched all night.\nSpeaker: Still nothing.")


def test_a_failed_model_call_keeps_the_conversation():
    lm, engine = fake_lm(echo)
    session = ChatSession(TraceProgram(), lm)
    code, out = run_lines(session, ["Hello there.", "boom goes the server", "Are you still there?"])
    assert code == 0
    assert any("the model call failed" in line and "backend exploded" in line for line in out)
    assert session.turns()[::2] == ["Hello there.", "Are you still there?"]  # the failed turn was not kept
    reply_calls = [c for c in engine.calls if "response" in c.outputs]
    assert "boom" not in reply_calls[-1].inputs["dialogue"]
    assert out[-1] == "bye"


def test_commands(tmp_path):
    lm, _ = fake_lm(echo)
    session = ChatSession(TraceProgram(), lm)
    code, out = run_lines(session, [
        "/save", "/save x.jsonl", "/nope", "/help", "/stages", "I lost my keys.", "/stages", "Found them!",
        f"/save {tmp_path}/a.jsonl", "/reset", f"/save {tmp_path}/b.jsonl", "/quit", "never read",
    ])
    text = "\n".join(out)
    assert code == 0 and out[-1] == "bye"
    assert "usage: /save FILE" in text and "nothing to save yet" in text and "unknown command /nope" in text
    assert "/stages" in text and "/reset" in text  # the help
    stage_block = text.split("(stages on)", 1)[1].split("(stages off)", 1)[0]
    assert "emotion" in stage_block and "cause_category" in stage_block and "Loss & Failure" in stage_block
    after_off = text.split("(stages off)", 1)[1]
    assert "cause_category" not in after_off and "trace> you said: Found them!" in after_off
    assert len(read_jsonl(tmp_path / "a.jsonl")) == 2
    assert not (tmp_path / "b.jsonl").exists()  # /reset emptied the conversation
    assert "never read" not in text


# ---------------------------------------------------------------- through a terminal


def ignore_sigint():
    # As in a background job started without job control: SIGINT is inherited as ignored.
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def spawn_chat(tmp_path, *args, preexec_fn=None):
    env = {k: v for k, v in os.environ.items() if k != "TRACE_DSPY_DATA"}
    child = pexpect.spawn(sys.executable, [str(FAKE_CLI), "trace_dspy.cli.chat", *args], cwd=str(tmp_path), env=env,
                          encoding="utf-8", timeout=90, dimensions=(40, 200), preexec_fn=preexec_fn)
    child.expect("you> ")
    return child


def test_a_person_chats_saves_and_leaves_with_ctrl_d(tmp_path):
    child = spawn_chat(tmp_path)
    assert "trace-dspy chat: program" in child.before
    child.sendline("I failed my driving test again.")
    child.expect(r"trace> heard: I failed my driving test again\.")
    child.expect("you> ")
    child.sendline("/stages")
    child.expect(r"\(stages on\)")
    child.expect("you> ")
    child.sendline("The examiner said I drove too carefully.")
    child.expect("cause_category +Loss & Failure")
    child.expect("trace> heard: The examiner")
    child.expect("you> ")
    child.sendline("boom")
    child.expect("the model call failed")
    child.expect("you> ")
    child.sendline("/save talk.jsonl")
    child.expect(r"saved 2 exchanges")
    child.expect("you> ")
    child.sendeof()  # Ctrl-D
    child.expect("bye")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0 and child.signalstatus is None
    assert "Traceback" not in child.before
    samples = read_jsonl(tmp_path / "talk.jsonl")
    assert samples[-1].turns[0] == "I failed my driving test again."
    assert samples[-1].response == "heard: The examiner said I drove too carefully."
    records = [json.loads(line) for line in (tmp_path / "talk.jsonl").read_text().splitlines()]
    assert {r["emotion"] for r in records} == {"sad"}


@pytest.mark.parametrize(("during_generation", "inherited"), [(False, None), (True, None), (True, ignore_sigint)],
                         ids=["at-the-prompt", "while-generating", "while-generating-started-with-sigint-ignored"])
def test_ctrl_c_leaves_cleanly(tmp_path, during_generation, inherited):
    child = spawn_chat(tmp_path, preexec_fn=inherited)
    if during_generation:
        child.sendline("slow")  # the fake model hangs for two minutes on this turn
        child.expect(r"thinking\.\.\.")
    child.sendintr()  # Ctrl-C through the terminal: SIGINT to the foreground process
    child.expect("bye")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0 and child.signalstatus is None
    assert "Traceback" not in child.before and "KeyboardInterrupt" not in child.before
