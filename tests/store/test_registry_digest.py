"""The sha256 record of a logged model's files cannot be switched off by deleting it.

Every ``champion``, ``models:/`` and ``runs:/`` reference the project loads was logged by a compile (it has
the artifact layout: a ``manifest.json``), so each must carry the record of its files: the registry version's
and the logged model's tag, and, for the artifact folder a compile logs to its run, the run's tag. A reference
without one is refused, naming it, unless the user opts out by name (``allow_unverified=True``,
``--allow-unverified-model``), and then a warning names what was not checked.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import compile_fast
from mlflow import MlflowClient

import trace_dspy
from trace_dspy.store.errors import ArtifactError
from trace_dspy.store.registry import DIGEST_TAG

MISSING = "digest record of its files is missing"


@pytest.fixture
def registered(tmp_path, monkeypatch):
    """One compile into tmp_path (fake LMs): version 1 of ``trace-dspy``, its logged model and its run."""
    uri = compile_fast(tmp_path, monkeypatch, trace=False)
    client = MlflowClient(tracking_uri=uri)
    version = client.get_model_version("trace-dspy", "1")
    return {"uri": uri, "client": client, "version": version, "model_id": version.source[len("models:/"):],
            "run_id": version.run_id}


def _stored_model_dir(tmp_path: Path) -> Path:
    """The logged model's folder in the artifact store (mlruns beside mlflow.db)."""
    found = [p.parent for p in (tmp_path / "mlruns").rglob("pyfunc_model.py")]
    assert len(found) == 1, found
    return found[0]


def _stored_run_folder(registered) -> Path:
    """The artifact folder the compile logged to its run (``runs:/RUN_ID/artifact``)."""
    from mlflow.utils.file_utils import local_file_uri_to_path

    run = registered["client"].get_run(registered["run_id"])
    folder = Path(local_file_uri_to_path(run.info.artifact_uri)) / "artifact"
    assert (folder / "program.json").is_file(), folder
    return folder


def _delete_model_records(registered) -> None:
    """What the attack did: drop the record from the registry version and from its logged model."""
    client = registered["client"]
    client.delete_model_version_tag("trace-dspy", "1", DIGEST_TAG)
    client.delete_logged_model_tag(registered["model_id"], DIGEST_TAG)


def _edit(program_json: Path) -> None:
    """A change the loader would take without a record: one more space in program.json (still valid JSON)."""
    program_json.write_text(program_json.read_text() + " ")


def test_a_model_whose_record_was_deleted_is_refused_unless_the_user_opts_out(registered, tmp_path, capsys):
    _delete_model_records(registered)
    _edit(_stored_model_dir(tmp_path) / "artifacts/v0001/program.json")
    refs = ["models:/trace-dspy/1", f"models:/{registered['model_id']}", "models:/trace-dspy@champion",
            "champion"]
    for ref in refs:
        with pytest.raises(ArtifactError, match=MISSING) as caught:
            trace_dspy.load(ref, tracking_uri=registered["uri"])
        assert str(caught.value).startswith(f"{ref}: ") and DIGEST_TAG in str(caught.value)
        assert "--allow-unverified-model" in str(caught.value)
    capsys.readouterr()
    for ref in refs:  # opted out by name: it loads, and stderr says what was not checked
        program = trace_dspy.load(ref, tracking_uri=registered["uri"], allow_unverified=True)
        assert program is not None
        err = capsys.readouterr().err
        warnings = [line for line in err.splitlines() if line.startswith("warning:")]
        assert len(warnings) == 1 and ref in warnings[0] and "NOT verified" in warnings[0], err


def test_the_opt_out_never_lets_a_file_that_differs_from_its_record_through(registered, tmp_path):
    _edit(_stored_model_dir(tmp_path) / "artifacts/v0001/program.json")
    with pytest.raises(ArtifactError, match=r"artifacts/v0001/program\.json differs"):
        trace_dspy.load("models:/trace-dspy/1", tracking_uri=registered["uri"], allow_unverified=True)


def test_a_run_reference_is_checked_against_the_runs_record(registered, tmp_path):
    run_id, uri = registered["run_id"], registered["uri"]
    assert trace_dspy.load(f"runs:/{run_id}", tracking_uri=uri) is not None  # untouched: it loads
    _edit(_stored_run_folder(registered) / "program.json")
    for ref in (f"runs:/{run_id}", f"runs:/{run_id}/artifact", f"runs:/{run_id}/artifact/"):
        with pytest.raises(ArtifactError, match=r"program\.json differs.*refusing to load it"):
            trace_dspy.load(ref, tracking_uri=uri)
        with pytest.raises(ArtifactError, match=r"program\.json differs"):
            trace_dspy.load(ref, tracking_uri=uri, allow_unverified=True)
    tags = registered["client"].get_run(run_id).data.tags
    assert set(json.loads(tags[DIGEST_TAG])) >= {"program.json", "manifest.json"}  # recorded at logging time
    # MLflow reads runs:/RUN_ID/model as the run's logged model: it is checked against that model's record.
    assert trace_dspy.load(f"runs:/{run_id}/model", tracking_uri=uri) is not None
    _edit(_stored_model_dir(tmp_path) / "artifacts/v0001/program.json")
    with pytest.raises(ArtifactError, match=r"artifacts/v0001/program\.json differs.*refusing to load it"):
        trace_dspy.load(f"runs:/{run_id}/model", tracking_uri=uri)
    # Any other path of the run has no record: refused unless the user opts out.
    with pytest.raises(ArtifactError, match=MISSING):
        trace_dspy.load(f"runs:/{run_id}/artifact/../artifact", tracking_uri=uri)


def test_a_run_without_a_record_is_refused_unless_the_user_opts_out(registered, capsys):
    run_id, uri = registered["run_id"], registered["uri"]
    if DIGEST_TAG in registered["client"].get_run(run_id).data.tags:
        registered["client"].delete_tag(run_id, DIGEST_TAG)  # as a run logged before records were kept
    _edit(_stored_run_folder(registered) / "program.json")
    with pytest.raises(ArtifactError, match=MISSING) as caught:
        trace_dspy.load(f"runs:/{run_id}", tracking_uri=uri)
    assert str(caught.value).startswith(f"runs:/{run_id}: ")
    capsys.readouterr()
    assert trace_dspy.load(f"runs:/{run_id}", tracking_uri=uri, allow_unverified=True) is not None
    assert "NOT verified" in capsys.readouterr().err


def test_respond_refuses_a_model_without_its_record_in_one_line(registered, tmp_path, capsys):
    from trace_dspy.cli.respond import main

    _delete_model_records(registered)
    _edit(_stored_model_dir(tmp_path) / "artifacts/v0001/program.json")
    capsys.readouterr()
    code = main(["--program", "models:/trace-dspy/1", "I lost my ring at the beach."])
    captured = capsys.readouterr()
    assert code == 2, captured
    assert "Traceback" not in captured.err and captured.out == ""
    lines = [line for line in captured.err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: models:/trace-dspy/1: ") and MISSING in lines[0], lines
    # Opted out on the command line: it answers, with one warning naming what was not checked.
    code = main(["--program", "models:/trace-dspy/1", "--allow-unverified-model", "I lost my ring at the beach."])
    captured = capsys.readouterr()
    assert code == 0, captured
    assert "beach." in captured.out
    assert [line for line in captured.err.splitlines() if line.startswith("warning:")] == [
        line for line in captured.err.splitlines() if "models:/trace-dspy/1" in line and "NOT verified" in line]
