"""One writer per output file: a second run on an output that another run is writing is refused with one
line (exit 2) before it reads or changes anything, whichever way it writes (respond --input, respond
--engine spark, the Python API, chat's /save), and the first run keeps every answer it reported.

The first run is real and deterministic: a batch whose fake model pauses inside one call until the test has
tried the second writer (in this process, on its own descriptor of the lock, as another process would), or a
``respond`` process whose fake model hangs on its last line.
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import respond_uncompiled

import trace_dspy
from trace_dspy import ProgramConfig, TraceProgram
from trace_dspy.testing.fakes import fake_lm
from trace_dspy.workflows.batch import BatchError, respond_batch

REPO = Path(__file__).resolve().parents[2]
PACKAGE = Path(trace_dspy.__file__).parent
FIRST = [f"First run, story {i}." for i in range(6)]
SECOND = [f"Second run, story {i}." for i in range(6)]


def write(path: Path, texts: list[str], prefix: str) -> Path:
    path.write_text("".join(json.dumps({"id": f"{prefix}{i}", "turns": [t]}) + "\n" for i, t in enumerate(texts)))
    return path


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def last_turn(inputs) -> str:
    return inputs.get("dialogue", "").splitlines()[-1].removeprefix("Speaker: ")


@contextlib.contextmanager
def first_run_in_progress(tmp_path: Path) -> Iterator[Path]:
    """respond_batch answering FIRST into out.jsonl, paused inside its fourth reply (three rows on disk) for
    the block; afterwards the run finishes, and every one of its six answers must be in the output."""
    paused, go = threading.Event(), threading.Event()

    def responder(outputs, inputs):
        if "response" not in outputs:
            return {}
        if last_turn(inputs) == FIRST[3]:
            paused.set()
            go.wait(60)
        return {"response": "heard: " + last_turn(inputs)}

    lm, _ = fake_lm(responder)
    src, out = write(tmp_path / "first.jsonl", FIRST, "a"), tmp_path / "out.jsonl"
    done: dict = {}

    def first_run():
        try:
            done["report"] = respond_batch(TraceProgram(ProgramConfig(prior_k=0)), src, out, lm=lm)
        except BaseException as exc:  # noqa: BLE001 - reported by the test below
            done["error"] = exc

    worker = threading.Thread(target=first_run, daemon=True)
    worker.start()
    assert paused.wait(60), done
    try:
        yield out
    finally:
        go.set()
        worker.join(60)
    assert "error" not in done, done["error"]
    report = done["report"]
    assert (report.answered, report.failed) == (6, 0)
    assert [(r["id"], r["response"]) for r in rows(out)] == [(f"a{i}", f"heard: {t}") for i, t in enumerate(FIRST)]
    assert not (tmp_path / "out.jsonl.stale.jsonl").exists()  # nothing of the first run was moved aside
    assert not (tmp_path / "out.jsonl.lock").exists()  # the lock file goes with the run


class Asked:
    """The second run's fake model: records what it was asked."""

    def __init__(self):
        self.asked: list[str] = []

    def __call__(self, outputs, inputs):
        if "response" in outputs:
            self.asked.append(last_turn(inputs))
            return {"response": "second: " + last_turn(inputs)}
        return {}


@pytest.fixture
def second(tmp_path, monkeypatch):
    """respond's main() for the second run (every LM its own fake, the uncompiled program); yields
    (main, its recorder, its input file)."""
    asked = Asked()
    run = respond_uncompiled(tmp_path, monkeypatch, asked)

    return run, asked, write(tmp_path / "second.jsonl", SECOND, "b")


def assert_refused_in_one_line(err: str, out: Path) -> None:
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert f"{out}.lock" in err and "another run" in err and "nothing was read or changed" in err


@pytest.mark.parametrize("threads", ["1", "3"])
def test_respond_input_on_an_output_another_run_writes_is_refused_and_both_keep_their_answers(
        tmp_path, second, capsys, threads):
    run, asked, src = second
    with first_run_in_progress(tmp_path) as out:
        before = out.read_bytes()
        assert run("--input", str(src), "--output", str(out), "--threads", threads) == 2
        assert_refused_in_one_line(capsys.readouterr().err, out)
        assert asked.asked == [] and out.read_bytes() == before


def test_respond_engine_spark_is_refused_before_spark_or_the_model_is_touched(tmp_path, second, capsys,
                                                                               monkeypatch):
    import trace_dspy.workflows.spark as spark

    run, asked, src = second

    def must_not_run(*args, **kwargs):
        raise AssertionError("the refused run went on to Spark")

    monkeypatch.setattr(spark, "spark_session", must_not_run)
    monkeypatch.setattr(spark, "model_uri_for", lambda *args, **kwargs: "unused-model-uri")
    with first_run_in_progress(tmp_path) as out:
        before = out.read_bytes()
        assert run("--engine", "spark", "--input", str(src), "--output", str(out)) == 2
        assert_refused_in_one_line(capsys.readouterr().err, out)
        assert out.read_bytes() == before


class Untouchable:
    """A Spark session that fails the test if anything of it is used."""

    def __getattr__(self, name):
        raise AssertionError(f"Spark was used ({name}) by a run that had to be refused")


def test_the_python_api_refuses_too_and_spark_is_never_started(tmp_path):
    from trace_dspy.workflows.spark import respond_spark

    lm, engine = fake_lm(Asked())
    src = write(tmp_path / "second.jsonl", SECOND, "b")
    with first_run_in_progress(tmp_path) as out:
        before = out.read_bytes()
        with pytest.raises(BatchError, match="is being written by another run") as spark_refusal:
            respond_spark(src, out, "unused-model-uri", spark=Untouchable())
        with pytest.raises(BatchError, match="is being written by another run"):
            respond_batch(TraceProgram(ProgramConfig(prior_k=0)), src, out, lm=lm)
        assert f"{out}.lock" in str(spark_refusal.value)
        assert engine.calls == [] and out.read_bytes() == before


def test_two_chats_saving_to_one_file_at_once_keep_both_conversations(tmp_path, monkeypatch):
    import trace_dspy.workflows.conversation as conversation
    from trace_dspy.data.sources import read_jsonl

    lm, _ = fake_lm(Asked())
    first, other = conversation.ChatSession(TraceProgram(), lm), conversation.ChatSession(TraceProgram(), lm)
    first.say("I lost my keys.")
    other.say("My sister is visiting!")
    other.say("We went to the zoo.")
    path = tmp_path / "talk.jsonl"
    real, paused, go = conversation.atomic_write_lines, threading.Event(), threading.Event()

    def slow_write(*args, **kwargs):  # the first save is paused inside its write
        if threading.current_thread() is not threading.main_thread():
            paused.set()
            go.wait(60)
        return real(*args, **kwargs)

    monkeypatch.setattr(conversation, "atomic_write_lines", slow_write)
    worker = threading.Thread(target=first.save, args=(path,), daemon=True)
    worker.start()
    assert paused.wait(60)
    refused = ""
    try:
        other.save(path)
    except ValueError as exc:  # TranscriptError
        refused = str(exc)
    finally:
        go.set()
        worker.join(60)
    assert "is being written by another run" in refused and f"{path}.lock" in refused
    other.save(path)  # once the first save is done, the second one goes through
    saved = read_jsonl(path)
    assert sorted(s.conversation_id for s in saved) == sorted([first.conversation_id] + [other.conversation_id] * 2)


# ---------------------------------------------------------------- two processes, as the attack ran


def interruptible() -> None:
    """In the child: SIGINT as a terminal gives it, even where the suite runs with it ignored (a background job
    started without job control inherits it ignored)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_a_second_respond_process_is_refused_while_the_first_process_writes(tmp_path, second, capsys):
    run, asked, src = second
    texts = FIRST[:5] + ["and this last one is slow"]
    first_src, out = write(tmp_path / "first.jsonl", texts, "a"), tmp_path / "out.jsonl"
    env = {**os.environ, "PYTHONPATH": str(REPO), "TRACE_DSPY_ARTIFACTS": str(tmp_path / "artifacts"),
           "TRACE_DSPY_CACHE": str(tmp_path / "cache"), "TRACE_FAKE_SLOW_MARKER": str(tmp_path / "sleeping")}
    env.pop("TRACE_DSPY_DATA", None)
    proc = subprocess.Popen([sys.executable, str(REPO / "tests/fake_cli.py"), "trace_dspy.cli.respond", "--config",
                             str(tmp_path / "c.toml"), "--program", "default", "--input", str(first_src),
                             "--output", str(out)], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, preexec_fn=interruptible)
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / "sleeping").exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert proc.poll() is None, proc.communicate()[1].decode()[-2000:]
        before = out.read_bytes()
        assert len(before.splitlines()) == 5  # the first process's five answers are on disk
        assert run("--input", str(src), "--output", str(out)) == 2
        err = capsys.readouterr().err
        assert_refused_in_one_line(err, out)
        assert f"(process {proc.pid})" in err  # the line names the run that holds the lock
        assert asked.asked == [] and out.read_bytes() == before
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err.decode()[-2000:]
    assert [r["response"] for r in rows(out)] == [f"heard: {t}" for t in FIRST[:5]]
    assert not (tmp_path / "out.jsonl.lock").exists()


# ---------------------------------------------------------------- no writer goes around the lock

# What writes a respond output or a chat transcript, and the modules that do it.
WRITERS = {"plan_batch", "AppendWriter", "atomic_write_lines", "atomic_add_records", "ResumePlan"}
OUTPUT_MODULES = {"workflows/batch.py", "workflows/spark.py", "workflows/conversation.py", "cli/respond.py",
                  "cli/chat.py"}
# ResumePlan's methods write only through a plan, and plan_batch makes a plan only under the lock
# (test_plan_batch_refuses_to_plan_without_the_lock); plan_batch itself makes the plan.
THROUGH_A_PLAN = {("workflows/batch.py", "move_aside"), ("workflows/batch.py", "append"),
                  ("workflows/batch.py", "finish"), ("workflows/batch.py", "plan_batch")}


def _called(node: ast.Call) -> str | None:
    func = node.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None


def _unlocked_writes(module: str, tree: ast.AST) -> list[str]:
    """'module:line function()' for each writer call not preceded, in its function, by output_lock(...)."""
    found = []
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        calls = [n for n in ast.walk(fn) if isinstance(n, ast.Call)]
        locked = [n.lineno for n in calls if _called(n) == "output_lock"]
        for call in calls:
            if _called(call) in WRITERS and (module, fn.name) not in THROUGH_A_PLAN:
                if not any(line < call.lineno for line in locked):
                    found.append(f"{module}:{call.lineno} {fn.name}() calls {_called(call)}")
    return found


def test_every_writer_of_an_output_takes_the_lock_first():
    unlocked, seen = [], set()
    for path in sorted(PACKAGE.rglob("*.py")):
        module = path.relative_to(PACKAGE).as_posix()
        tree = ast.parse(path.read_text(encoding="utf-8"))
        names = {_called(n) for n in ast.walk(tree) if isinstance(n, ast.Call)}
        # Respond outputs are planned (plan_batch, ResumePlan) in the output modules only.
        if module not in OUTPUT_MODULES:
            assert not names & {"plan_batch", "ResumePlan"}, f"{module} plans a respond output"
            continue
        seen |= names & WRITERS
        unlocked += _unlocked_writes(module, tree)
    assert unlocked == []
    assert {"plan_batch", "AppendWriter", "atomic_add_records"} <= seen  # the scan sees the writers it checks


def test_plan_batch_refuses_to_plan_without_the_lock(tmp_path):
    from trace_dspy.workflows.batch import plan_batch

    src, out = write(tmp_path / "first.jsonl", FIRST, "a"), tmp_path / "out.jsonl"
    with pytest.raises(RuntimeError, match="output_lock"):
        plan_batch(src, out)
    from trace_dspy.core.locks import output_lock

    with output_lock(out):
        assert len(plan_batch(src, out).todo) == 6
    assert not (tmp_path / "out.jsonl.lock").exists()
