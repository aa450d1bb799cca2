"""A chat that grows past the dialogue limit keeps going: the program reads the newest exchanges that fit, the
chat says so once (naming /reset), and /save still keeps every exchange."""

from __future__ import annotations

from conftest import run_repl

from trace_dspy import TraceProgram
from trace_dspy.core.dialogue import MAX_DIALOGUE_CHARS
from trace_dspy.data.sources import read_jsonl
from trace_dspy.testing.fakes import fake_lm
from trace_dspy.workflows.conversation import ChatSession

TURN = 4_000  # characters of each speaker turn; the fake's reply repeats it, so an exchange is about 8,000


def echo(outputs, inputs):
    if "response" in outputs:
        return {"response": "you said: " + inputs.get("dialogue", "").splitlines()[-1].split(": ", 1)[1]}
    return {}


def long_turn(n: int) -> str:
    return f"turn{n} " + "x" * (TURN - 6)


def run_lines(session: ChatSession, lines: list[str]) -> list[str]:
    return run_repl(session, lines)[1]


def test_a_chat_past_the_limit_keeps_answering_with_its_newest_exchanges(tmp_path):
    lm, engine = fake_lm(echo)
    session = ChatSession(TraceProgram(), lm)
    turns = [long_turn(n) for n in range(1, 8)]
    out = run_lines(session, [*turns, f"/save {tmp_path / 'chat.jsonl'}"])
    assert not [line for line in out if line.startswith("error")], out
    replies = [line for line in out if line.startswith("trace> ")]
    assert len(replies) == len(turns) and replies[-1].startswith("trace> you said: turn7")
    notices = [line for line in out if "/reset" in line]
    assert len(notices) == 1 and f"{MAX_DIALOGUE_CHARS:,}" in notices[0] and "oldest" in notices[0], out
    # the notice comes with the first reply that left the oldest exchanges out
    assert out.index(notices[0]) == out.index(replies[2]) - 1
    # what the program read last: within the limit, ending with the last turn, the oldest exchanges left out
    dialogue = [c for c in engine.calls if "response" in c.outputs][-1].inputs["dialogue"]
    assert len(dialogue) <= MAX_DIALOGUE_CHARS + 1000 and dialogue.endswith(turns[-1]) and "turn1 " not in dialogue
    assert session.dropped >= 4
    # the saved transcript keeps every exchange
    assert [len(s.turns) for s in read_jsonl(tmp_path / "chat.jsonl")] == [1, 3, 5, 7, 9, 11, 13]


def test_reset_starts_a_whole_new_conversation(tmp_path):
    lm, _ = fake_lm(echo)
    session = ChatSession(TraceProgram(), lm)
    out = run_lines(session, [long_turn(n) for n in range(1, 5)] + ["/reset", "hello again", long_turn(9)])
    assert session.dropped == 0 and len(session.exchanges) == 2
    assert len([line for line in out if "/reset" in line]) == 1


def test_one_message_past_the_limit_is_refused_and_the_chat_goes_on():
    lm, _ = fake_lm(echo)
    session = ChatSession(TraceProgram(), lm)
    out = run_lines(session, ["y" * (MAX_DIALOGUE_CHARS + 5), "a short one"])
    errors = [line for line in out if line.startswith("error")]
    assert errors == [f"error: your message is {MAX_DIALOGUE_CHARS + 5:,} characters long; the limit is "
                      f"{MAX_DIALOGUE_CHARS:,}: send a shorter one"], out
    assert out[-2] == "trace> you said: a short one" and len(session.exchanges) == 1
