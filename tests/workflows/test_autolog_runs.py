"""A compile's children in MLflow are its own, named runs: DSPy's autologger adds no ``eval_N`` runs for the
optimizer's candidate evaluations (their scores are in the compile's output and manifest as ``selection``)."""

from __future__ import annotations

import json

import pytest

from conftest import FAST_CONFIG, echo_reply, offline_workdir
from trace_dspy.testing.fakes import fake_lm


@pytest.mark.slow
def test_a_select_compile_has_only_its_named_children(tmp_path, monkeypatch, capsys):
    import mlflow

    from trace_dspy.cli.compile import main

    lm, _ = fake_lm(echo_reply)
    offline_workdir(tmp_path, monkeypatch, lm)
    (tmp_path / "fast.toml").write_text(FAST_CONFIG)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert main(["--optimizer", "select", "--train", "4", "--dev", "3", "--val", "2", "--threads", "1",
                 "--config", "fast.toml", "--tracking-uri", uri]) == 0
    assert "selection scores: " in capsys.readouterr().err
    manifest = json.loads((tmp_path / "artifacts/trace-dspy/v0001/manifest.json").read_text())
    assert [c["candidate"] for c in manifest["optimizer"]["selection"]][1:] == ["labeled", "bootstrap"]

    mlflow.set_tracking_uri(uri)
    runs = mlflow.search_runs(experiment_names=["trace-dspy"], output_format="list")
    (compile_run,) = [r for r in runs if r.data.tags.get("trace_dspy.kind") == "compile"]
    children = {r.info.run_name for r in runs if r.data.tags.get("mlflow.parentRunId") == compile_run.info.run_id}
    assert children == {"trace-dspy dev before", "trace-dspy dev after"}
    assert not [r.info.run_name for r in runs if r.info.run_name.startswith("eval")]
    assert "eval" not in compile_run.data.metrics  # the autologger's unnamed per-candidate metric
