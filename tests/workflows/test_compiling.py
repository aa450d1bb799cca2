"""The compile workflow with fake LMs: its config, the champion rule in a run, and every load reference.

Artifacts, the registry and the optimizers on their own: tests/store/test_artifacts.py,
tests/store/test_registry.py, tests/optimize/test_optimizers.py."""

from __future__ import annotations

import json

import pytest
from conftest import compile_reply, offline_workdir

import trace_dspy
import trace_dspy.lm.specs as lms_module
from trace_dspy.cli.compile import config_from_args, main
from trace_dspy.core.config import ConfigError
from trace_dspy.optimize.optimizers import OptimizerConfig
from trace_dspy.store.artifacts import ArtifactError, versions
from trace_dspy.testing.fakes import fake_lm
from trace_dspy.workflows.compiling import run_compile

STAGES = ["recognize_emotion", "analyze_cause", "plan_strategy", "generate_response"]


@pytest.fixture
def fake_models(monkeypatch, tmp_path):
    lm, engine = fake_lm(compile_reply, new_instruction="Be warm and specific.")
    offline_workdir(tmp_path, monkeypatch, lm)
    return engine


# ---------------------------------------------------------------- config


def test_every_flag_reaches_the_config(tmp_path):
    toml = tmp_path / "c.toml"
    toml.write_text('[optimizer]\nname = "simba"\nsimba_steps = 9\n[data]\ntrain = 40\n[program]\ndisabled = ["plan_strategy"]\n')
    cfg = config_from_args(["--config", str(toml), "--optimizer", "mipro", "--max-demos", "3", "--max-labeled", "1",
                            "--mipro-candidates", "5", "--mipro-trials", "7", "--gepa-max-metric-calls", "11",
                            "--simba-bsize", "2", "--dev", "9", "--seed", "4", "--name", "mine", "--threads", "2",
                            "--artifacts-dir", "arts", "--tracking-uri", "sqlite:///x.db", "--experiment", "exp",
                            "--registered-model", "reg", "--no-mlflow", "--data", "d.jsonl", "--lm", "openai/x",
                            "--max-failure-rate", "0.1", "--opener-items", "5"])
    o = cfg.optimizer
    assert (o.name, o.max_bootstrapped_demos, o.max_labeled_demos, o.mipro_candidates, o.mipro_trials) == (
        "mipro", 3, 1, 5, 7)
    assert (o.gepa_max_metric_calls, o.simba_bsize, o.simba_steps, o.seed, o.opener_items) == (11, 2, 9, 4, 5)
    assert (cfg.data.train, cfg.data.dev, cfg.seed, cfg.name, cfg.threads, cfg.artifacts_dir) == (
        40, 9, 4, "mine", 2, "arts")
    assert (cfg.tracking_uri, cfg.experiment, cfg.registered_model, cfg.mlflow) == ("sqlite:///x.db", "exp", "reg", False)
    assert (cfg.data.source, cfg.max_failure_rate, cfg.settings.lm.default.model) == ("d.jsonl", 0.1, "openai/x")
    assert cfg.settings.program.disabled == ("plan_strategy",)
    assert cfg.record()["optimizer"] == o.settings()
    with pytest.raises(ConfigError):
        config_from_args(["--train", "0"])
    with pytest.raises(ConfigError, match="unknown keys"):
        OptimizerConfig.from_dict({"trials": 3})


def test_the_parsed_config_drives_the_run(fake_models, tmp_path):
    cfg = config_from_args(["--optimizer", "labeled", "--max-labeled", "3", "--train", "5", "--dev", "4",
                            "--seed", "2", "--name", "drive", "--no-mlflow"])
    result = run_compile(cfg)
    m = result.manifest
    assert result.artifact == tmp_path / "artifacts/drive/v0001"
    assert len(m["data"]["train_ids"]) == 5 and len(m["data"]["dev_ids"]) == 4 and result.before["n"] == 4
    assert m["optimizer"] == {"name": "labeled", "seed": 2, "max_labeled_demos": 3, "plan_items": 16}
    state = json.loads((result.artifact / "program.json").read_text())
    assert all(len(state[s]["demos"]) == 3 for s in STAGES)
    assert m["mlflow"]["run_id"] is None and m["config"]["data"]["seed"] == 2


# ---------------------------------------------------------------- the champion and every reference


def test_a_collapsed_program_never_becomes_champion(fake_models, tmp_path, monkeypatch, capsys):
    import trace_dspy.store.registry as registry

    def constant(outputs, inputs):
        return {"response": "A guy kicked his beagle because it did not come."} if "response" in outputs else {}

    lm, _ = fake_lm(constant)
    monkeypatch.setattr(lms_module, "build_lm", lambda spec: lm)
    assert main(["--optimizer", "labeled", "--max-labeled", "1", "--train", "4", "--dev", "4", "--no-trace"]) == 0
    out = capsys.readouterr().out
    assert "COLLAPSED" in out and "champion unchanged" in out
    assert registry.champion("trace-dspy", tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}") is None
    manifest = json.loads((tmp_path / "artifacts/trace-dspy/v0001/manifest.json").read_text())
    assert manifest["scores"]["dev_after"]["collapsed"] is True


def test_a_program_worse_than_the_uncompiled_one_is_saved_but_not_champion_nor_default(fake_models, tmp_path,
                                                                                      monkeypatch, capsys):
    import trace_dspy.store.registry as registry
    import trace_dspy.workflows.compiling as workflow
    from trace_dspy.workflows.loading import default_reference

    real, calls = workflow.evaluate_program, []

    def worse_after(*args, **kwargs):  # the second evaluation (dev after) scores 0.1 below the real one
        result = real(*args, **kwargs)
        calls.append(1)
        if len(calls) == 2:
            result.summary["empathy"] -= 0.1
        return result

    monkeypatch.setattr(workflow, "evaluate_program", worse_after)
    monkeypatch.setenv("TRACE_DSPY_ARTIFACTS", str(tmp_path / "artifacts"))
    assert main(["--optimizer", "labeled", "--max-labeled", "1", "--train", "4", "--dev", "3", "--no-trace"]) == 0
    captured = capsys.readouterr()
    assert "below the uncompiled program's" in captured.out + captured.err and "champion unchanged" in captured.out
    assert registry.champion("trace-dspy", tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}") is None
    assert (tmp_path / "artifacts/trace-dspy/v0001/manifest.json").is_file()  # saved all the same
    assert default_reference() != "trace-dspy@v1"  # respond and chat do not pick it up


def test_compile_twice_then_every_reference_form(fake_models, tmp_path, capsys):
    argv = ["--optimizer", "labeled", "--max-labeled", "1", "--train", "4", "--dev", "3"]
    assert main(argv) == 0
    assert main([*argv, "--max-labeled", "2"]) == 0
    out = capsys.readouterr().out
    assert "| empathy |" in out and "trace-dspy@v2" in out
    root = tmp_path / "artifacts"
    assert versions("trace-dspy", root) == [1, 2]
    v2 = json.loads((root / "trace-dspy/v0002/manifest.json").read_text())
    # saved before it is registered: the manifest names the run; the registry version names the artifact
    assert v2["version"] == 2 and v2["mlflow"]["run_id"] and "registry_version" not in v2["mlflow"]
    from mlflow import MlflowClient

    mv = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}").get_model_version("trace-dspy", "2")
    assert mv.run_id == v2["mlflow"]["run_id"] and mv.tags["artifact_version"] == "2"
    assert v2["scores"]["dev_before"]["n"] == 3 and "empathy" in v2["scores"]["dev_after"]
    assert v2["data"]["fingerprint"].startswith("sha256:") and v2["git_commit"] != ""

    def demos(ref):
        return len(trace_dspy.load(ref).recognize_emotion.demos)

    run_id = v2["mlflow"]["run_id"]
    assert demos(str(root / "trace-dspy/v0002")) == 2
    assert demos(str(root / "trace-dspy/v0001/program.json")) == 1
    assert demos("trace-dspy@v1") == 1 and demos("trace-dspy@latest") == 2
    assert demos("models:/trace-dspy/1") == 1 and demos(f"runs:/{run_id}") == 2
    assert demos("champion") == demos("models:/trace-dspy@champion")
    for bad in ("trace-dspy@v9", "nope@latest", "models:/trace-dspy/99", "runs:/0123456789abcdef", "trace-dspy@v"):
        with pytest.raises(ArtifactError):
            trace_dspy.load(bad)
    # The loaded program answers.
    lm, _ = fake_lm(compile_reply)
    loaded = trace_dspy.load("trace-dspy@latest")  # LMs rebuilt from the manifest (faked here)
    assert set(STAGES) <= set(loaded.stage_lms)
    assert loaded(dialogue="I lost my ring.").response

    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = mlflow.search_runs(experiment_names=["trace-dspy"], output_format="list",
                              filter_string="tags.`trace_dspy.kind` = 'compile'")
    assert len(runs) == 2
    # Each compile also logged its two dev evaluations as child evaluation runs.
    children = mlflow.search_runs(experiment_names=["trace-dspy"], output_format="list",
                                  filter_string="tags.`trace_dspy.kind` = 'compile-evaluation'")
    assert sorted(r.data.tags["mlflow.parentRunId"] for r in children) == sorted(2 * [r.info.run_id for r in runs])
    metrics = runs[0].data.metrics
    assert {"dev_before/empathy", "dev_after/empathy", "dev_delta/empathy"} <= set(metrics)
    params = json.dumps(runs[0].data.params)
    assert "optimizer.name" in params and "api_key" not in params.replace("api_key_env", "")


def test_the_retrieval_pool_is_the_whole_train_partition_and_ships_with_the_artifact(fake_models, tmp_path):
    from trace_dspy.data.sources import load_splits

    cfg = config_from_args(["--optimizer", "labeled", "--train", "4", "--dev", "3", "--no-mlflow"])
    result = run_compile(cfg)
    full = load_splits(None, seed=0)
    assert result.manifest["retrieval"]["pool_items"] == len(full.train) > 4
    dev_ids = set(result.manifest["data"]["dev_ids"])
    items = json.loads((result.artifact / "index/items.json").read_text())["items"]
    assert not dev_ids & {i["id"] for i in items}  # dev never leaks into the exemplars
    loaded = trace_dspy.load(str(result.artifact))
    assert loaded.retriever is not None and len(loaded.retriever.items) == len(full.train)
