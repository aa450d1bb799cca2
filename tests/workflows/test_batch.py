"""respond --input resumes only answers to the same dialogue, never rewrites a file that is not its own, and
stops on a full disk with one line and every written row kept.

Models are fakes (ScriptedEngine behind ``fake_lm``); the echo reply carries the dialogue's last turn, so a
row that holds another dialogue's answer shows it.
"""

from __future__ import annotations

import errno
import json
import logging
from pathlib import Path

import pytest
from conftest import respond_uncompiled

from trace_dspy import ProgramConfig, TraceProgram
from trace_dspy.core import jsonl
from trace_dspy.testing.fakes import fake_lm
from trace_dspy.workflows.batch import BatchError, dialogue_sha256, respond_batch


class Recorder:
    """An echo responder that records the last line of each dialogue it is asked to answer."""

    def __init__(self):
        self.asked: list[str] = []

    def __call__(self, outputs, inputs):
        if "response" in outputs:
            last = inputs["dialogue"].splitlines()[-1]
            self.asked.append(last.removeprefix("Speaker: "))
            return {"response": "heard: " + last}
        return {}


def setup():
    rec = Recorder()
    lm, engine = fake_lm(rec)
    return TraceProgram(ProgramConfig(prior_k=0)), lm, rec


def write(path: Path, records: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records), encoding="utf-8")
    return path


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def assert_each_row_answers_its_own_line(out: Path, src: Path) -> None:
    """Every input line has one row, in order, and the row's reply is to that line's dialogue."""
    inputs = [json.loads(line) for line in src.read_text().splitlines() if line.strip()]
    got = rows(out)
    assert len(got) == len(inputs)
    for n, (line, row) in enumerate(zip(inputs, got, strict=True), 1):
        assert row["id"] == line.get("id", f"line-{n}") and row["line"] == n
        assert row["response"] == "heard: Speaker: " + line["turns"][-1], (line, row)
        assert row["dialogue_sha256"] == dialogue_sha256(row["dialogue"]) and row["trace_dspy_output"] == 1


def stale(out: Path) -> list[dict]:
    side = out.with_name(out.name + ".stale.jsonl")
    return rows(side) if side.exists() else []


# ---------------------------------------------------------------- 3. an answer stays with its dialogue

@pytest.mark.parametrize("change", ["insert at the top", "insert in the middle", "remove one", "shuffle"])
def test_lines_without_ids_keep_their_answers_whatever_lines_move(tmp_path, change):
    program, lm, rec = setup()
    texts = ["I lost my keys.", "My dog is sick.", "I got the job!", "My sister moved away."]
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write(src, [{"turns": [t]} for t in texts])
    respond_batch(program, src, out, lm=lm)
    rec.asked.clear()
    new = {"insert at the top": ["The exam went badly.", *texts],
           "insert in the middle": [texts[0], texts[1], "The exam went badly.", texts[2], texts[3]],
           "remove one": [texts[0], texts[2], texts[3]],
           "shuffle": [texts[3], texts[1], texts[0], texts[2]]}[change]
    write(src, [{"turns": [t]} for t in new])
    report = respond_batch(program, src, out, lm=lm)
    assert_each_row_answers_its_own_line(out, src)
    # Only the new dialogue was asked; every other line took its own earlier answer.
    added = [t for t in new if t not in texts]
    assert rec.asked == added and report.answered == len(added) and report.skipped == len(new) - len(added)
    # The removed dialogue's answer was moved aside, not dropped.
    assert [r["response"] for r in stale(out)] == [f"heard: Speaker: {t}" for t in texts if t not in new]


def test_an_edited_dialogue_is_asked_again_and_its_old_answer_moved_aside(tmp_path):
    program, lm, rec = setup()
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write(src, [{"id": "a", "turns": ["I lost my keys."]}, {"id": "b", "turns": ["My dog is sick."]},
                {"id": "c", "dialogue": "Speaker: Hi.\nListener: Hello!\nSpeaker: I passed."}])
    respond_batch(program, src, out, lm=lm)
    before = rows(out)
    rec.asked.clear()
    # b's dialogue is edited; c is written another way with the same turns (the same dialogue once normalised).
    write(src, [{"id": "a", "turns": ["I lost my keys."]}, {"id": "b", "turns": ["My dog is fine now."]},
                {"id": "c", "turns": ["Hi.", "Hello!", "I passed."]}])
    report = respond_batch(program, src, out, lm=lm)
    assert rec.asked == ["My dog is fine now."] and (report.answered, report.skipped) == (1, 2)
    after = rows(out)
    assert after[1]["response"] == "heard: Speaker: My dog is fine now." and after[0] == before[0]
    assert after[2] == before[2]
    moved = stale(out)
    assert len(moved) == 1 and moved[0]["response"] == "heard: Speaker: My dog is sick."
    assert "another dialogue" in moved[0]["moved_aside"]


def test_rows_of_removed_ids_are_moved_aside_once_and_announced(tmp_path, caplog):
    program, lm, rec = setup()
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    records = [{"id": k, "turns": [f"story {k}"]} for k in "abcd"] + [{"id": "e", "turns": []}]  # e fails
    write(src, records)
    respond_batch(program, src, out, lm=lm)
    first = {r["id"]: r for r in rows(out)}
    write(src, [records[0], records[2]])
    with caplog.at_level(logging.WARNING, logger="trace_dspy.workflows.batch"):
        report = respond_batch(program, src, out, lm=lm)
    assert [r["id"] for r in rows(out)] == ["a", "c"] and report.moved_aside == 3
    moved = stale(out)
    assert {r["id"]: {k: v for k, v in r.items() if k != "moved_aside"} for r in moved} == \
        {k: first[k] for k in "bde"}
    assert all(r["moved_aside"] == "its id is no longer in the input" for r in moved)
    announced = [m for m in caplog.messages if "moved" in m]
    assert len(announced) == 1 and "3 earlier row" in announced[0] and f"{out}.stale.jsonl" in announced[0]
    # A further run, or the same rows met again after a crash, adds nothing twice.
    side = out.with_name(out.name + ".stale.jsonl")
    kept = side.read_bytes()
    respond_batch(program, src, out, lm=lm)
    assert side.read_bytes() == kept


def test_lines_that_do_not_parse_are_asked_every_run_and_move_no_answer(tmp_path):
    program, lm, rec = setup()
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write(src, [{"turns": ["I lost my keys."]}, "{broken", {"turns": ["My dog is sick."]}])
    respond_batch(program, src, out, lm=lm)
    broken = rows(out)[1]
    assert "invalid JSON" in broken["error"] and broken["dialogue_sha256"] is None
    # The broken line is fixed, and a new broken line is inserted at the top: every id moves by one.
    rec.asked.clear()
    write(src, ["not json either", {"turns": ["I lost my keys."]}, {"turns": ["I got the job!"]},
                {"turns": ["My dog is sick."]}])
    report = respond_batch(program, src, out, lm=lm)
    got = rows(out)
    assert "invalid JSON" in got[0]["error"] and rec.asked == ["I got the job!"] and report.failed == 1
    assert [r["response"] for r in got[1:]] == ["heard: Speaker: I lost my keys.", "heard: Speaker: I got the job!",
                                                "heard: Speaker: My dog is sick."]
    assert stale(out) == []


def test_an_output_of_an_earlier_version_resumes_by_its_stored_dialogue(tmp_path):
    program, lm, rec = setup()
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write(src, [{"id": k, "turns": [f"story {k}"]} for k in "abcd"])
    # Rows as the version before the hash wrote them: a matches its line, b answered another dialogue,
    # c stored no dialogue, d failed.
    write(out, [{"id": "a", "line": 1, "dialogue": "Speaker: story a", "response": "kept a", "stages": {}},
                {"id": "b", "line": 2, "dialogue": "Speaker: old b", "response": "stale b", "stages": {}},
                {"id": "c", "line": 3, "response": "unknown c", "stages": {}},
                {"id": "d", "line": 4, "error": "timeout"}])
    report = respond_batch(program, src, out, lm=lm)
    assert sorted(rec.asked) == ["story b", "story c", "story d"] and report.skipped == 1
    got = rows(out)
    assert got[0]["response"] == "kept a" and got[0]["dialogue_sha256"] == dialogue_sha256("Speaker: story a")
    assert [r["response"] for r in got[1:]] == [f"heard: Speaker: story {k}" for k in "bcd"]
    assert all(r["trace_dspy_output"] == 1 for r in got)
    moved = {r["id"]: r for r in stale(out)}
    assert moved["b"]["response"] == "stale b" and moved["c"]["response"] == "unknown c" and set(moved) == {"b", "c"}
    assert "earlier version" in moved["c"]["moved_aside"]


# ---------------------------------------------------------------- 4. --output is never someone else's file

@pytest.fixture
def cli(tmp_path, monkeypatch):
    """respond's main() with every LM one scripted fake and the uncompiled program; yields (main, recorder)."""
    rec = Recorder()
    run = respond_uncompiled(tmp_path, monkeypatch, rec)

    return run, rec


def _ours(tmp_path, cli) -> bytes:
    run, _ = cli
    src = write(tmp_path / "ours-in.jsonl", [{"id": "x", "turns": ["I passed!"]}])
    assert run("--input", str(src), "--output", str(tmp_path / "ours.jsonl")) == 0
    return (tmp_path / "ours.jsonl").read_bytes()


@pytest.mark.parametrize("content", [
    "user records: id and response",
    "50 user rows and one id/error line",
    "our output with one user record appended",
    "one user record without its newline",
    "our output with JSON lines that are not objects",
])
def test_a_file_that_is_not_our_output_is_refused_byte_for_byte_unchanged(tmp_path, cli, capsys, content):
    run, rec = cli
    user = [{"id": f"u{i}", "response": f"my own note {i}"} for i in range(50)]
    data = {
        "user records: id and response": "".join(json.dumps(r) + "\n" for r in user[:3]).encode(),
        "50 user rows and one id/error line": ("".join(json.dumps(r) + "\n" for r in user)
                                               + json.dumps({"id": "u50", "error": "x"}) + "\n").encode(),
        "our output with one user record appended": (json.dumps(user[0]) + "\n").encode(),
        "one user record without its newline": json.dumps(user[0]).encode(),
        "our output with JSON lines that are not objects": b"[1, 2]\n\"text\"\n",
    }[content]
    if content.startswith("our output"):
        data = _ours(tmp_path, cli) + data
        capsys.readouterr()
    rec.asked.clear()
    target = tmp_path / "mine.jsonl"
    target.write_bytes(data)
    src = write(tmp_path / "in.jsonl", [{"id": "u1", "turns": ["I got the job!"]}])
    assert run("--input", str(src), "--output", str(target)) == 2
    err = capsys.readouterr().err
    assert "is not a respond output file" in err and str(target) in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    assert target.read_bytes() == data and rec.asked == []
    assert not target.with_name(target.name + ".stale.jsonl").exists()


def test_our_own_output_with_a_last_row_missing_its_newline_is_still_ours(tmp_path):
    program, lm, rec = setup()
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write(src, [{"id": "a", "turns": ["I lost my keys."]}, {"id": "b", "turns": ["My dog is sick."]}])
    respond_batch(program, src, out, lm=lm)
    out.write_bytes(out.read_bytes().rstrip(b"\n"))  # edited by hand, the last newline lost
    rec.asked.clear()
    report = respond_batch(program, src, out, lm=lm)
    assert rec.asked == [] and report.skipped == 2
    assert_each_row_answers_its_own_line(out, src)


def test_respond_batch_refuses_a_foreign_output_before_any_call(tmp_path):
    program, lm, rec = setup()
    src = write(tmp_path / "in.jsonl", [{"id": "a", "turns": ["hi"]}])
    out = write(tmp_path / "out.jsonl", [{"id": "a", "response": "mine"}])
    kept = out.read_bytes()
    with pytest.raises(BatchError, match="line 1 is not one of its records"):
        respond_batch(program, src, out, lm=lm)
    assert out.read_bytes() == kept and rec.asked == []


# ---------------------------------------------------------------- 10. a full disk is one line

@pytest.mark.parametrize("threads", ["1", "3"])
def test_a_full_disk_while_appending_is_one_line_exit_1_and_keeps_every_row(tmp_path, cli, capsys, monkeypatch,
                                                                              threads):
    run, rec = cli
    texts = [f"I finished the garden shed, part {i}." for i in range(6)]
    src, out = write(tmp_path / "in.jsonl", [{"id": f"r{i}", "turns": [t]} for i, t in enumerate(texts)]), \
        tmp_path / "out.jsonl"
    real = jsonl.AppendWriter.write
    written = []

    def write_until_full(self, record):
        if len(written) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(self, record)
        written.append(record["id"])

    monkeypatch.setattr(jsonl.AppendWriter, "write", write_until_full)
    assert run("--input", str(src), "--output", str(out), "--threads", threads) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert str(out) in err and "No space left on device" in err and "kept" in err
    assert [r["id"] for r in rows(out)] == written and len(written) == 2
    # With space again, the rerun keeps the two rows and answers the rest.
    monkeypatch.setattr(jsonl.AppendWriter, "write", real)
    rec.asked.clear()
    assert run("--input", str(src), "--output", str(out), "--threads", threads) == 0
    # (a set: with threads, calls of the stopped run that were in flight may still be finishing)
    assert set(rec.asked) == {t for i, t in enumerate(texts) if f"r{i}" not in written}
    assert_each_row_answers_its_own_line(out, src)
