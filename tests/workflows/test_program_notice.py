"""When no ``--program`` is named and the default is found outside the checkout's own artifacts (a
``./artifacts`` in the working directory), one line on stderr says which program runs and where it came from."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import echo_reply, offline_workdir

from trace_dspy.testing.fakes import fake_lm

REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "artifacts" / "trace-dspy" / "v0006"


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    lm, engine = fake_lm(echo_reply)
    offline_workdir(tmp_path, monkeypatch, lm)
    return tmp_path, engine


def local_copy(tmp_path: Path, number: int) -> Path:
    """The shipped default, copied into ./artifacts/trace-dspy/vNNNN of the working directory as version ``number``."""
    folder = tmp_path / "artifacts" / "trace-dspy" / f"v{number:04d}"
    shutil.copytree(SHIPPED, folder)
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["version"] = number
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return folder


def respond(capsys, *argv: str) -> tuple[int, str, list[str]]:
    from trace_dspy.cli.respond import main

    code = main([*argv, "I lost my keys again."])
    captured = capsys.readouterr()
    return code, captured.out, captured.err.strip().splitlines()


def test_a_local_artifact_that_runs_by_default_is_named_on_stderr(workdir, monkeypatch, capsys):
    tmp_path, engine = workdir
    monkeypatch.delenv("TRACE_DSPY_ARTIFACTS")  # ./artifacts of the working directory
    local_copy(tmp_path, 7)
    code, out, err = respond(capsys)
    assert code == 0, err
    said = [line for line in err if "not the packaged default" in line]
    assert said == [f"using trace-dspy@v7 from {Path('artifacts/trace-dspy/v0007')} (not the packaged default "
                    "trace-dspy@v6; --program names another)"], err
    assert engine.calls and out.strip()  # it answered with that program


def test_a_version_compiled_into_the_checkout_is_named_too(workdir, capsys):
    """The main job compiles into the checkout's artifacts/: the newer version it saves runs by default, and
    says so."""
    from trace_dspy.store import artifacts

    number = max(artifacts.versions("trace-dspy", artifacts.CHECKOUT_ROOT)) + 1
    folder = artifacts.CHECKOUT_ROOT / "trace-dspy" / f"v{number:04d}"  # the suite's copy of the checkout's
    copied = local_copy(folder.parents[2], number)
    try:
        code, _, err = respond(capsys)
    finally:
        shutil.rmtree(copied)
    assert code == 0, err
    assert [line for line in err if "not the packaged default" in line] == [
        f"using trace-dspy@v{number} from {folder} (not the packaged default trace-dspy@v6; --program names another)"]


def test_the_checkouts_own_default_runs_without_the_notice(workdir, capsys):
    code, _, err = respond(capsys)
    assert code == 0, err
    assert not any("not the packaged default" in line for line in err), err


def test_a_named_program_runs_without_the_notice(workdir, capsys):
    tmp_path, _ = workdir
    local_copy(tmp_path, 7)
    code, _, err = respond(capsys, "--program", "trace-dspy@v7")
    assert code == 0, err
    assert not any("not the packaged default" in line for line in err), err


def test_loading_the_default_in_python_says_it_too(workdir, capsys):
    import trace_dspy

    tmp_path, _ = workdir
    local_copy(tmp_path, 8)
    trace_dspy.load(attach_lms=False)
    assert "using trace-dspy@v8 from" in capsys.readouterr().err
