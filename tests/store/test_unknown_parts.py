"""A fitted part of a kind this version does not register (one a newer trace-dspy wrote) is not dropped without
a word: loading the artifact warns in one line that names it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import trace_dspy
from trace_dspy.store.artifacts import read_artifact

REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "artifacts" / "trace-dspy" / "v0006"


@pytest.fixture
def artifact(tmp_path) -> Path:
    folder = tmp_path / "v0006"
    shutil.copytree(SHIPPED, folder)
    return folder


def add_to_manifest(folder: Path, **fields) -> None:
    manifest = json.loads((folder / "manifest.json").read_text())
    (folder / "manifest.json").write_text(json.dumps({**manifest, **fields}, indent=2))


def warnings_in(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("warning:")]


def test_a_part_of_an_unregistered_kind_is_named_in_one_warning_line(artifact, capsys):
    add_to_manifest(artifact, tone_gate={"file": "tone_gate.npz", "threshold": 0.4, "dev_auc": 0.81})
    (artifact / "tone_gate.npz").write_bytes(b"")
    stored = read_artifact(artifact)
    said = warnings_in(capsys.readouterr().err)
    assert len(said) == 1, said
    assert "'tone_gate'" in said[0] and "kind tone_gate" in said[0] and "not registered" in said[0]
    assert str(artifact / "manifest.json") in said[0]
    assert stored.manifest.extra["tone_gate"]["threshold"] == 0.4  # kept as read, for a newer reader


def test_several_unknown_parts_are_one_line_and_loading_goes_on(artifact, capsys):
    add_to_manifest(artifact, tone_gate={"threshold": 0.4}, reply_cache={"entries": 3})
    program = trace_dspy.load(str(artifact), attach_lms=False)
    said = warnings_in(capsys.readouterr().err)
    assert len(said) == 1 and "'reply_cache'" in said[0] and "'tone_gate'" in said[0], said
    assert program.parts is not None  # the registered parts load as before


def test_known_parts_and_plain_fields_load_without_a_warning(artifact, capsys):
    add_to_manifest(artifact, note="compiled on the lab machine")
    read_artifact(artifact)
    assert warnings_in(capsys.readouterr().err) == []
