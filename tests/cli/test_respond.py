"""python -m trace_dspy.respond: single messages, batches, resume, failures."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import Collect, fake_every_lm

from trace_dspy import TraceProgram
from trace_dspy.cli.respond import main
from trace_dspy.core.jsonl import read_records
from trace_dspy.testing.fakes import fake_lm
from trace_dspy.workflows.batch import respond_batch


def echo_responder(outputs, inputs):
    if "response" in outputs:
        return {"response": "heard: " + inputs["dialogue"].splitlines()[-1]}
    return {}


@pytest.fixture
def fake_models(monkeypatch):
    """Every LM the CLI builds is one scripted fake; yields its engine."""
    return fake_every_lm(monkeypatch, echo_responder)


def test_single_message_prints_the_reply(fake_models, capsys):
    assert main(["I failed my driving test again."]) == 0
    assert capsys.readouterr().out.strip() == "heard: Speaker: I failed my driving test again."
    order = fake_models.stage_order()
    assert order[:3] == ["recognize_emotion", "analyze_cause", "plan_strategy"]
    # The shipped default (trace-dspy@v6) on this LM (not the embedded model) is TRACE as published: the LM plans
    # and one reply is written for its plan (the fitted plans are the compact writer's).
    assert order[3:] == ["generate_response"]


def test_show_stages_and_json(fake_models, capsys):
    assert main(["--show-stages", "Speaker: a\\nListener: b\\nSpeaker: c"]) == 0
    out = capsys.readouterr().out
    assert "emotion" in out and "sadness" in out and "Loss & Failure" in out and "heard: Speaker: c" in out
    assert main(["--json", "hello"]) == 0
    assert json.loads(capsys.readouterr().out)["cause_category"] == "Loss & Failure"


@pytest.mark.parametrize(("argv", "message"), [
    (["Speaker: hi\\nListener: hey"], "last turn must be the speaker's"),
    ([], "nothing to answer"),
    (["--input", "x.jsonl"], "go together"),
    (["--threads", "0", "hi"], "at least 1"),
])
def test_user_errors_exit_2_with_a_message(fake_models, capsys, argv, message):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def _write(path, lines):
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))


def test_batch_records_failures_and_keeps_the_rest(tmp_path, fake_models, capsys):
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    _write(src, [{"id": "a", "turns": ["I lost my keys."]}, "{broken", {"id": "c", "dialogue": "Speaker: x\nListener: y"},
                 {"id": "d", "turns": ["My cat came home!"]}, {"id": "e", "turns": 7}])
    assert main(["--input", str(src), "--output", str(out)]) == 1
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in records] == ["a", "line-2", "c", "d", "e"]
    assert records[0]["response"] == "heard: Speaker: I lost my keys." and records[0]["stages"]["emotion"] == "sad"
    assert "in.jsonl:2: invalid JSON" in records[1]["error"]
    assert "last turn" in records[2]["error"]
    assert records[3]["response"].endswith("My cat came home!")
    assert "string or a list" in records[4]["error"]
    assert "2 answered now" in capsys.readouterr().err
    # A repeated id would let one answer overwrite another on resume: the whole batch is refused
    # before any model call (tests/test_trust.py covers generated ids too).
    _write(src, [{"id": "a", "turns": ["one"]}, {"id": "a", "turns": ["two"]}])
    assert main(["--input", str(src), "--output", str(tmp_path / "other.jsonl")]) == 2
    assert "repeated: 'a' (lines 1 and 2)" in capsys.readouterr().err and not (tmp_path / "other.jsonl").exists()


def test_batch_resumes_after_a_torn_write(tmp_path):
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    _write(src, [{"id": str(i), "turns": [f"message {i}"]} for i in range(5)])
    lm, engine = fake_lm(echo_responder)
    done = {"id": "1", "line": 2, "dialogue": "Speaker: message 1", "response": "kept from before", "stages": {}}
    failed = {"id": "3", "line": 4, "error": "timeout"}
    out.write_text(json.dumps(done) + "\n" + json.dumps(failed) + "\n" + '{"id": "4", "resp')  # killed mid-line
    report = respond_batch(TraceProgram(), src, out, lm=lm)
    assert (report.total, report.skipped, report.answered, report.failed) == (5, 1, 4, 0)
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in records] == ["0", "1", "2", "3", "4"]
    assert records[1]["response"] == "kept from before"  # not recomputed
    assert records[3]["response"] == "heard: Speaker: message 3"  # the failure was retried
    assert len(engine.calls) == 4 * 4
    # A second rerun has nothing to do.
    again = respond_batch(TraceProgram(), src, out, lm=lm)
    assert (again.skipped, again.answered) == (5, 0) and len(engine.calls) == 16


def test_threads_give_the_same_file_as_one_thread(tmp_path):
    src = tmp_path / "in.jsonl"
    _write(src, [{"id": str(i), "turns": [f"story number {i}."]} for i in range(24)])
    outputs = []
    for threads in (1, 8):
        lm, _ = fake_lm(echo_responder)
        out = tmp_path / f"out{threads}.jsonl"
        respond_batch(TraceProgram(), src, out, lm=lm, threads=threads)
        outputs.append(out.read_text())
    assert outputs[0] == outputs[1]


def test_read_records_ignores_a_missing_file(tmp_path):
    assert read_records(tmp_path / "none.jsonl") == {}


@pytest.mark.slow
@pytest.mark.embedded
def test_cli_answers_offline_with_the_embedded_model(local_model, tmp_path):
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "HF_HUB_OFFLINE": "1", "DSPY_CACHEDIR": str(tmp_path / "c")}
    run = subprocess.run([sys.executable, "-m", "trace_dspy.respond", "--show-stages", "I failed my driving test again."],
                         capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    lines = dict(line.split(None, 1) for line in run.stdout.strip().splitlines() if " " in line)
    assert lines["response"].strip() and lines["strategy"].strip() in {"ER", "IP", "EX"}


def test_program_flag_loads_a_compiled_artifact(fake_models, tmp_path, capsys):
    import dspy

    from trace_dspy import ProgramConfig
    from trace_dspy.store.artifacts import save_artifact

    program = TraceProgram()
    program.generate_response.signature = program.generate_response.signature.with_instructions("Be brief.")
    program.recognize_emotion.demos = [dspy.Example(dialogue="Speaker: yay", emotion="joyful")]
    folder = save_artifact(program, {"config": {"program": ProgramConfig().to_dict(), "lm": {}}}, root=tmp_path)
    assert main(["--program", str(folder), "I lost my keys."]) == 0
    assert capsys.readouterr().out.strip() == "heard: Speaker: I lost my keys."
    assert fake_models.calls[-1].instructions == "Be brief."
    assert main(["--program", str(tmp_path / "nothing"), "hi"]) == 2
    assert "cannot resolve program" in capsys.readouterr().err


class _Terminal:
    """A stderr stand-in that says it is a terminal and keeps what was written."""

    def __init__(self, tty: bool):
        self.tty, self.text = tty, ""

    def isatty(self):
        return self.tty

    def write(self, text):
        self.text += text

    def flush(self):
        pass


@pytest.mark.parametrize("tty", [True, False])
def test_status_line_on_a_terminal_only(fake_models, capsys, monkeypatch, tty):
    terminal = _Terminal(tty)
    monkeypatch.setattr(sys, "stderr", terminal)
    assert main(["I failed my driving test again."]) == 0
    assert capsys.readouterr().out.strip() == "heard: Speaker: I failed my driving test again."
    if tty:
        shown = [part for part in terminal.text.split("\r\033[K") if part]
        assert shown == ["thinking: reading how they feel...", "thinking: working out why...",
                         "thinking: planning the reply...", "thinking: writing the reply..."]
        assert terminal.text.endswith("\r\033[K")  # the line is wiped before the reply is printed
    else:
        assert "thinking" not in terminal.text and "\033" not in terminal.text


def test_without_program_respond_and_chat_run_the_newest_artifact_that_improved(fake_models, tmp_path, monkeypatch,
                                                                                 capsys):
    import dspy

    from trace_dspy import ProgramConfig
    from trace_dspy.cli.chat import _load
    from trace_dspy.store.artifacts import save_artifact
    from trace_dspy.workflows.loading import default_reference
    from trace_dspy.workflows.settings import Settings

    monkeypatch.setenv("TRACE_DSPY_ARTIFACTS", str(tmp_path))
    program = TraceProgram()
    program.generate_response.signature = program.generate_response.signature.with_instructions("Be brief.")
    program.recognize_emotion.demos = [dspy.Example(dialogue="Speaker: yay", emotion="joyful")]

    def save(before, after, collapsed=False):
        scores = {"dev_before": {"empathy": before}, "dev_after": {"empathy": after, "collapsed": collapsed}}
        return save_artifact(program, {"config": {"program": ProgramConfig().to_dict(), "lm": {}}, "scores": scores},
                             root=tmp_path, name="trace-dspy")

    folder = save(0.50, 0.55)
    assert default_reference() == "trace-dspy@v1"
    # A newer compile that did worse on dev than the uncompiled program, or collapsed, is saved but not the default.
    save(0.50, 0.45)
    save(0.50, 0.60, collapsed=True)
    assert default_reference() == "trace-dspy@v1"
    assert main(["I lost my keys."]) == 0
    assert capsys.readouterr().out.strip() == "heard: Speaker: I lost my keys."
    assert fake_models.calls[-1].instructions == "Be brief."
    assert _load(None, Settings(), None).path == folder
    import trace_dspy  # the README's snippet reaches the same program

    assert trace_dspy.load(attach_lms=False).generate_response.signature.instructions == "Be brief."


def test_truncation_warnings_are_dropped_unless_verbose(monkeypatch):
    import logging
    import os

    from trace_dspy.cli.common import setup_logging

    # MLflow's artifact progress bars go too, unless the user chose otherwise.
    monkeypatch.delenv("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", raising=False)
    setup_logging(False)
    assert os.environ["MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"] == "false"
    monkeypatch.setenv("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "true")
    setup_logging(False)
    assert os.environ["MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"] == "true"

    # A handler of our own on DSPy's logger (what a user's handler would see).
    lm_log = logging.getLogger("dspy.clients.lm")
    seen = Collect()
    lm_log.addHandler(seen)
    level = lm_log.level
    try:
        lm_log.setLevel(logging.WARNING)
        setup_logging(False)
        lm_log.warning("LM response was truncated; increase max_tokens or inspect history.")
        lm_log.warning("LM call failed: connection refused")
        assert seen.messages == ["LM call failed: connection refused"]
        seen.messages.clear()
        setup_logging(True)
        lm_log.warning("LM response was truncated; increase max_tokens or inspect history.")
        assert seen.messages == ["LM response was truncated; increase max_tokens or inspect history."]
    finally:
        lm_log.removeHandler(seen)
        lm_log.setLevel(level)
        setup_logging(True)
        logging.getLogger().setLevel(logging.WARNING)
