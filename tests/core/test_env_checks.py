"""A ``TRACE_DSPY_*`` setting that cannot be used stops a command before any work: one ``error:`` line, exit 2.

Found after the work (an index built, a whole evaluation run) it cost that work, and ended in a traceback or,
for evaluate, a warning and exit 0. Every command here runs on a fake LM that counts its calls: none may
happen.
"""

from __future__ import annotations

import time

import pytest

CACHE = "TRACE_DSPY_CACHE"
STORE_WAIT = "TRACE_DSPY_STORE_WAIT"

# command -> (its main, arguments that would make it do real work on the fake LM)
COMMANDS = {
    "respond": ("trace_dspy.cli.respond", ["--program", "default", "--config", "fast.toml", "I lost my keys."]),
    "chat": ("trace_dspy.cli.chat", ["--program", "default", "--config", "fast.toml"]),
    "evaluate": ("trace_dspy.cli.evaluate", ["--program", "default", "--limit", "2", "--threads", "1",
                                             "--config", "fast.toml"]),
    "compile": ("trace_dspy.cli.compile", ["--optimizer", "labeled", "--max-labeled", "1", "--train", "4", "--dev",
                                           "3", "--threads", "1", "--config", "fast.toml", "--no-trace"]),
}


@pytest.fixture
def workdir(fake_workdir):
    return fake_workdir


def run(command: str, capsys) -> tuple[int, list[str], float]:
    import importlib

    module, argv = COMMANDS[command]
    started = time.monotonic()
    code = importlib.import_module(module).main(list(argv))
    return code, capsys.readouterr().err.strip().splitlines(), time.monotonic() - started


def assert_refused(code: int, err: list[str], seconds: float, engine, *words: str) -> None:
    assert code == 2, err
    assert len(err) == 1 and err[0].startswith("error: "), err
    assert all(w in err[0] for w in words), err
    assert "Traceback" not in err[0]
    assert engine.calls == []  # no model call: nothing ran
    assert seconds < 10


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize("cache", ["a-file", "a-file/sub"])
def test_a_cache_folder_that_is_a_file_stops_the_command_before_any_work(workdir, monkeypatch, capsys, command, cache):
    tmp_path, engine = workdir
    monkeypatch.setenv(CACHE, str(tmp_path / cache))
    code, err, seconds = run(command, capsys)
    assert_refused(code, err, seconds, engine, CACHE, str(tmp_path / "a-file"))
    assert not (tmp_path / "runs").exists() and not (tmp_path / "artifacts").exists()


@pytest.mark.parametrize("command", ["evaluate", "compile"])
@pytest.mark.parametrize("wait", ["nan", "-1", "abc", "inf"])
def test_a_bad_store_wait_stops_a_tracked_command_before_any_work(workdir, monkeypatch, capsys, command, wait):
    _, engine = workdir
    monkeypatch.setenv(STORE_WAIT, wait)
    code, err, seconds = run(command, capsys)
    assert_refused(code, err, seconds, engine, STORE_WAIT, repr(wait))


def test_a_bad_store_wait_is_not_read_when_nothing_is_tracked(workdir, monkeypatch, capsys):
    _, engine = workdir
    monkeypatch.setenv(STORE_WAIT, "abc")
    from trace_dspy.cli.evaluate import main

    assert main([*COMMANDS["evaluate"][1], "--no-mlflow"]) == 0
    assert engine.calls  # it ran
