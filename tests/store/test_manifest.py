"""The typed manifest: every shipped artifact's manifest migrates, loads and describes; bad fields are named."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import trace_dspy
from trace_dspy.cli.inspect_artifact import render_summary
from trace_dspy.store.artifacts import read_artifact
from trace_dspy.store.errors import ArtifactError
from trace_dspy.store.inspection import open_artifact, summary
from trace_dspy.store.manifest import MIGRATIONS, SCHEMA_VERSION, Manifest, migrate

REPO = Path(__file__).resolve().parents[2]
SHIPPED = sorted((REPO / "artifacts/trace-dspy").glob("v000[1-6]"))

# What each shipped manifest's program settings read as once migrated: v0001 predates the reply layouts,
# the prior and Best-of-N; v0002 predates the chat writer's exemplars; later ones record every setting.
EXPECTED_PROGRAM = {
    "v0001": {"reply_format": "fields", "prior_k": 0, "best_of": 1, "reply_exemplars": False},
    "v0002": {"reply_format": "auto", "prior_k": 5, "best_of": "auto", "reply_exemplars": False},
    "v0003": {"reply_format": "auto", "prior_k": 5, "best_of": "auto", "reply_exemplars": True},
    "v0004": {"reply_format": "auto", "prior_k": "auto", "best_of": "auto", "reply_exemplars": True},
    "v0005": {"reply_format": "auto", "prior_k": "auto", "best_of": "auto", "reply_exemplars": True},
    "v0006": {"reply_format": "auto", "prior_k": "auto", "best_of": "auto", "reply_exemplars": True},
}


def raw_manifest(folder: Path) -> dict:
    return json.loads((folder / "manifest.json").read_text())


def test_the_shipped_artifacts_are_the_ones_checked():
    assert [f.name for f in SHIPPED] == list(EXPECTED_PROGRAM)
    # every schema version any of them was written with has a migration
    assert {raw_manifest(f)["schema_version"] for f in SHIPPED} <= set(MIGRATIONS)
    assert set(range(min(MIGRATIONS), SCHEMA_VERSION + 1)) == set(MIGRATIONS)


@pytest.mark.parametrize("folder", SHIPPED, ids=lambda f: f.name)
def test_each_shipped_manifest_migrates_to_the_settings_it_was_compiled_with(folder):
    raw = raw_manifest(folder)
    migrated = migrate(raw)
    assert migrated["schema_version"] == SCHEMA_VERSION
    program = migrated["config"]["program"]
    for key, value in EXPECTED_PROGRAM[folder.name].items():
        assert program[key] == value, key
    # the migration only adds: every setting the file recorded is kept as it was
    assert {k: program[k] for k in raw["config"]["program"]} == raw["config"]["program"]
    manifest = Manifest.from_dict(raw, folder / "manifest.json")
    config = manifest.program_config()
    assert (config.reply_format, config.prior_k, config.best_of, config.reply_exemplars) == tuple(
        EXPECTED_PROGRAM[folder.name].values())
    # written back, it holds every field it was read with, and reads back the same
    written = manifest.to_dict()
    assert {k: written[k] for k in raw if k != "config"} == {k: v for k, v in raw.items() if k != "config"}
    assert Manifest.from_dict(written, folder / "manifest.json") == manifest
    assert manifest.label == f"trace-dspy@v{int(folder.name[1:])}"


@pytest.mark.parametrize("folder", SHIPPED, ids=lambda f: f.name)
def test_each_shipped_artifact_loads_with_its_parts_and_describes(folder):
    stored = read_artifact(folder)
    raw = raw_manifest(folder)
    assert (stored.parts["emotion_prior"] is not None) == bool((raw.get("emotion_prior") or {}).get("file"))
    assert stored.parts["retrieval"] is not None
    assert len(stored.parts["reply_plans"]) == len((raw.get("reply_plans") or {}).get("plans") or [])
    program = trace_dspy.load(str(folder), attach_lms=False)
    assert program.parts is not None and program.reply_plans == stored.parts["reply_plans"]
    # the emotion stage asks with candidates exactly when the artifact has a prior and prior_k is on
    has_candidates = "emotion_candidates" in program.recognize_emotion.signature.input_fields
    assert has_candidates == (stored.parts["emotion_prior"] is not None and stored.config.prior_k != 0)
    text = render_summary(open_artifact(str(folder)))
    for label in ("exemplars", "emotion", "openers", "plans"):
        assert any(line.strip().startswith(label) for line in text.splitlines()), label
    assert summary(open_artifact(str(folder)))["parts"]["emotion"].startswith(
        "LM alone" if folder.name == "v0001" else "the prior decides" if stored.config.prior_k == "auto" else "prior top")


def _copy(folder: Path, tmp_path: Path, **changes) -> Path:
    target = tmp_path / folder.name
    shutil.copytree(folder, target)
    raw = raw_manifest(target)
    raw.update(changes)
    (target / "manifest.json").write_text(json.dumps(raw))
    return target


@pytest.mark.parametrize(("changes", "field"), [
    ({"version": "3"}, "version"), ({"scores": []}, "scores"), ({"emotion_prior": "yes"}, "emotion_prior"),
    ({"champion": 1}, "champion"), ({"predictors": ["ok", 2]}, "predictors[1]"),
])
def test_a_field_of_the_wrong_type_is_named(tmp_path, changes, field):
    folder = _copy(SHIPPED[-1], tmp_path, **changes)
    with pytest.raises(ArtifactError) as err:
        read_artifact(folder)
    assert (err.value.file, err.value.field) == (str(folder / "manifest.json"), field)


def test_a_newer_schema_version_is_refused_and_unknown_fields_are_kept(tmp_path):
    folder = _copy(SHIPPED[-1], tmp_path, schema_version=SCHEMA_VERSION + 1)
    with pytest.raises(ArtifactError, match=f"schema version {SCHEMA_VERSION + 1} is not supported"):
        read_artifact(folder)
    folder = _copy(SHIPPED[0], tmp_path / "b", written_by="a later trace-dspy")
    manifest = read_artifact(folder).manifest
    assert manifest.extra == {"written_by": "a later trace-dspy"}
    assert manifest.to_dict()["written_by"] == "a later trace-dspy"
