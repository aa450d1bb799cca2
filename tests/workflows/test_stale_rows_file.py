"""``<output>.stale.jsonl``, where respond moves rows the input no longer asks for, is never a link or another
name of the output or the input: such a file is refused with one line (exit 2) before anything is asked,
moved or read through the link, and every file is left as it was."""

from __future__ import annotations

import json
import os

import pytest

import trace_dspy.lm.specs as lms_module
from trace_dspy.testing.fakes import fake_lm


def echo(outputs, inputs):
    if "response" in outputs:
        return {"response": "heard: " + inputs["dialogue"].splitlines()[-1]}
    return {}


@pytest.fixture
def run(tmp_path, monkeypatch):
    from trace_dspy.cli.respond import main

    lm, engine = fake_lm(echo)
    monkeypatch.setattr(lms_module, "build_lm", lambda spec: lm)
    monkeypatch.setenv("TRACE_DSPY_DATA", "")
    (tmp_path / "c.toml").write_text("[program]\nprior_k = 0\n")
    return lambda *argv: main(["--config", str(tmp_path / "c.toml"), "--program", "default", *argv]), engine


def write(path, ids):
    path.write_text("".join(json.dumps({"id": i, "turns": [f"Story {i}."]}) + "\n" for i in ids))
    return path


@pytest.mark.parametrize("side_file", [
    "a link to the output", "a hard link to the output", "a link to a file of the user's", "a dangling link",
])
def test_a_stale_rows_file_that_is_a_link_or_the_output_is_refused_and_nothing_moves(tmp_path, run, capsys,
                                                                                     side_file):
    main, engine = run
    src, out = write(tmp_path / "in.jsonl", ["a", "b", "c"]), tmp_path / "out.jsonl"
    assert main("--input", str(src), "--output", str(out)) == 0
    write(src, ["a", "c"])  # b's answer would be moved aside
    side, notes = tmp_path / "out.jsonl.stale.jsonl", tmp_path / "notes.jsonl"
    notes.write_text('{"my": "own notes"}\n')
    target = {"a link to the output": out, "a link to a file of the user's": notes,
              "a dangling link": tmp_path / "nowhere.jsonl"}.get(side_file)
    if target is None:
        os.link(out, side)
    else:
        side.symlink_to(target)
    files = {p: p.read_bytes() for p in (out, src, notes)}
    calls = len(engine.calls)
    capsys.readouterr()
    assert main("--input", str(src), "--output", str(out)) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1 and str(side) in err, err
    assert ("symbolic link" if target is not None else "the output file itself") in err
    assert {p: p.read_bytes() for p in files} == files and len(engine.calls) == calls
    assert side.is_symlink() == (target is not None)
    assert [json.loads(line)["id"] for line in out.read_text().splitlines()] == ["a", "b", "c"]  # b still there


def test_the_stale_rows_writer_never_copies_a_link_target(tmp_path):
    from trace_dspy.core.jsonl import ForeignFileError, atomic_add_records

    notes, side = tmp_path / "notes.jsonl", tmp_path / "out.jsonl.stale.jsonl"
    notes.write_text('{"my": "own notes"}\n')
    side.symlink_to(notes)
    with pytest.raises(ForeignFileError, match="symbolic link"):
        atomic_add_records(side, [{"id": "b", "response": "moved"}])
    assert side.is_symlink() and notes.read_text() == '{"my": "own notes"}\n'
