"""Compile saves, then logs, then registers, then promotes: a kill between any two steps leaves a consistent state.

Each run is a real ``python -m trace_dspy.compile`` process (fake LMs, MLflow on SQLite) that SIGKILLs itself
right after one step returns, the way a power cut or an OOM kill would end it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

RUNNER = """
import json, os, signal, sys
import trace_dspy.lm.specs as specs
from trace_dspy.testing.fakes import fake_lm

def answer(outputs, inputs):  # a different reply per dialogue, so the compiled program does not look collapsed
    said = (inputs.get("dialogue") or inputs.get("message") or "").splitlines()[-1].split(":", 1)[-1].strip()
    return {"response": "That sounds hard, after " + said.lower()} if "response" in outputs else {}

lm, _ = fake_lm(answer)
specs.build_lm = lambda spec: lm
step = sys.argv[1]
import trace_dspy.store.artifacts as artifacts
import trace_dspy.store.registry as registry
import trace_dspy.workflows.compiling as workflow

def killed_after(module, name):
    real = getattr(module, name)
    def wrapper(*args, **kwargs):
        out = real(*args, **kwargs)
        with open(os.environ["ORDER_LOG"], "a") as fh:
            fh.write(name + "\\n")
        if name == step:
            os.kill(os.getpid(), signal.SIGKILL)
        return out
    setattr(module, name, wrapper)

killed_after(artifacts, "write_artifact")
killed_after(workflow, "_log_run")
killed_after(registry, "register_version")
killed_after(registry, "promote_if_better")
from trace_dspy.cli.compile import main
sys.exit(main(sys.argv[2:]))
"""
STEPS = ["write_artifact", "_log_run", "register_version", "promote_if_better"]
CONFIG = '[metric]\nsimilarity_kind = "token_f1"\n[program]\nprior_k = 0\n'


def _compile(tmp_path: Path, step: str) -> subprocess.CompletedProcess:
    (tmp_path / "runner.py").write_text(RUNNER)
    (tmp_path / "fast.toml").write_text(CONFIG)
    env = {k: v for k, v in os.environ.items() if k not in ("TRACE_DSPY_DATA", "MLFLOW_TRACKING_URI")}
    env.update(TRACE_DSPY_ARTIFACTS=str(tmp_path / "artifacts"), ORDER_LOG=str(tmp_path / "order.log"))
    argv = ["--optimizer", "labeled", "--max-labeled", "1", "--train", "4", "--dev", "3", "--threads", "1",
            "--config", "fast.toml", "--no-trace", "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}"]
    return subprocess.run([sys.executable, str(tmp_path / "runner.py"), step, *argv], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)


def _state(tmp_path: Path) -> dict:
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    folder = tmp_path / "artifacts/trace-dspy"
    saved = sorted(p.name for p in folder.glob("v*")) if folder.is_dir() else []
    try:
        versions = client.search_model_versions("name='trace-dspy'")
    except Exception:  # no registered model yet
        versions = []
    try:
        champion = str(client.get_model_version_by_alias("trace-dspy", "champion").version)
    except Exception:
        champion = None
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()],
                              filter_string="tags.`trace_dspy.kind` = 'compile'")  # not its evaluation runs
    logged = {r.info.run_id: [a.path for a in client.list_artifacts(r.info.run_id, "artifact")] for r in runs}
    return {"saved": saved, "versions": versions, "champion": champion, "logged": logged, "client": client}


@pytest.mark.parametrize("step", STEPS)
def test_a_kill_after_each_step_leaves_a_consistent_state(tmp_path, step):
    run = _compile(tmp_path, step)
    assert run.returncode == -signal.SIGKILL, run.stderr[-3000:]
    order = (tmp_path / "order.log").read_text().split()
    assert order == STEPS[: STEPS.index(step) + 1]  # the steps ran in this order, and stopped there
    state = _state(tmp_path)
    # 1. saved: always a complete version, never a half-written one
    assert state["saved"] == ["v0001"]
    manifest = json.loads((tmp_path / "artifacts/trace-dspy/v0001/manifest.json").read_text())
    assert "registry_version" not in manifest["mlflow"]
    (run_id,) = state["logged"]
    assert manifest["mlflow"]["run_id"] == run_id
    # 2. logged: the run holds the files once _log_run has returned, and not before
    logged = state["logged"][run_id]
    assert ("artifact/program.json" in logged) == (STEPS.index(step) >= 1)
    # 3. registered: a version exists only after the files are logged, and it loads
    if STEPS.index(step) >= 2:
        (version,) = state["versions"]
        assert version.run_id == run_id and version.tags["artifact_version"] == "1"
        from trace_dspy.workflows.loading import load_for_run
        from trace_dspy.workflows.settings import Settings

        loaded = load_for_run("models:/trace-dspy/1", Settings(), tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}",
                              attach_lms=False)
        assert loaded.manifest.mlflow["run_id"] == run_id
    else:
        assert state["versions"] == []
    # 4. champion only once promotion ran (the first compile always beats no champion)
    assert state["champion"] == ("1" if step == "promote_if_better" else None)


def test_the_next_compile_after_a_kill_carries_on_cleanly(tmp_path):
    assert _compile(tmp_path, "_log_run").returncode == -signal.SIGKILL  # v1 saved and logged, not registered
    run = _compile(tmp_path, "none")
    assert run.returncode == 0, run.stderr[-3000:]
    state = _state(tmp_path)
    assert state["saved"] == ["v0001", "v0002"]
    (version,) = state["versions"]  # only the finished compile is registered, as version 1 of the model
    assert version.tags["artifact_version"] == "2" and state["champion"] == "1"
