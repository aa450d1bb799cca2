"""The compile workflow, artifacts, the registry and every load reference, with fake LMs."""

from __future__ import annotations

import json
import multiprocessing
import warnings

import dspy
import pytest
from trace_dspy.optimize.metric import EmpathyMetric
from trace_dspy.optimize.optimizers import OPTIMIZERS, OptimizerConfig, compile_program

import trace_dspy
import trace_dspy.lm.specs as lms_module
from trace_dspy import ProgramConfig, TraceProgram
from trace_dspy.cli.compile import config_from_args, main
from trace_dspy.core.config import ConfigError
from trace_dspy.store.artifacts import (
    ArtifactError,
    save_artifact,
    versions,
)
from trace_dspy.store.registry import champion, promote_if_better, register_version
from trace_dspy.testing.fakes import fake_lm
from conftest import offline_workdir
from trace_dspy.workflows.compile import run_compile

STAGES = ["recognize_emotion", "analyze_cause", "plan_strategy", "generate_response"]


def reply_for(outputs, inputs):
    if "response" in outputs:
        # Distinct per dialogue, so that the collapse check stays quiet.
        words = inputs["dialogue"].split()[-3:]
        return {"response": f"Losing that at the beach sounds awful; {' '.join(words)} how are you holding up?"}
    if "emotion" in outputs and "dialogue" in inputs:  # right on some, wrong on others
        return {"emotion": "sad" if len(inputs["dialogue"]) % 2 else "joyful"}
    return {}


@pytest.fixture
def fake_models(monkeypatch, tmp_path):
    lm, engine = fake_lm(reply_for, new_instruction="Be warm and specific.")
    offline_workdir(tmp_path, monkeypatch, lm)
    return engine


def trainset(n=6):
    return [dspy.Example(dialogue=f"Speaker: I lost my ring at the beach, day {i}.", emotion="sad",
                         response="Oh no, that ring meant a lot. Did you find it?", sample_id=f"t{i}")
            .with_inputs("dialogue") for i in range(n)]


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
    assert (cfg.train, cfg.dev, cfg.seed, cfg.name, cfg.threads, cfg.artifacts_dir) == (40, 9, 4, "mine", 2, "arts")
    assert (cfg.tracking_uri, cfg.experiment, cfg.registered_model, cfg.mlflow) == ("sqlite:///x.db", "exp", "reg", False)
    assert (cfg.data, cfg.max_failure_rate, cfg.settings.lm.default.model) == ("d.jsonl", 0.1, "openai/x")
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


# ---------------------------------------------------------------- optimizers


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_each_optimizer_compiles_with_a_tiny_budget(name):
    if name == "mipro":
        pytest.importorskip("optuna")
    lm, _ = fake_lm(reply_for, new_instruction="Be warm and specific.", proposed_instruction="Be warm.")
    response_lm, response_engine = fake_lm(reply_for)
    program = TraceProgram(stage_lms={"generate_response": response_lm})
    cfg = OptimizerConfig(name=name, max_bootstrapped_demos=1, max_labeled_demos=1, mipro_candidates=2,
                          mipro_trials=2, gepa_max_metric_calls=16, gepa_minibatch=2, simba_steps=1,
                          simba_candidates=2, simba_bsize=2)
    with dspy.context(lm=lm):
        compiled = compile_program(cfg, program, EmpathyMetric(embedder=None), trainset(), trainset(3),
                                   prompt_lm=lm)
        assert isinstance(compiled, TraceProgram)
        assert [n for n, _ in compiled.named_predictors()] == STAGES
        response_engine.calls.clear()
        assert compiled(dialogue="My cat is missing.").response
    # The stage LM survived compiling: every reply call (one per plan the program writes for) went to it.
    assert set(response_engine.stage_order()) == {"generate_response"}
    assert compiled.reply_plans == compiled.deepcopy().reply_plans  # the fitted plans survive copies too


def test_gepa_without_a_reflection_lm_is_a_clear_error():
    with pytest.raises(ConfigError, match="reflection LM"):
        compile_program(OptimizerConfig(name="gepa"), TraceProgram(), EmpathyMetric(embedder=None), trainset(),
                        trainset(2), prompt_lm=None)


# ---------------------------------------------------------------- artifacts


def _save(root, name="a", program=None):
    return save_artifact(program or TraceProgram(), {"config": {"program": ProgramConfig().to_dict()}},
                         name=name, root=root)


def _save_many(root, count):
    for _ in range(count):
        _save(root)


def test_versions_are_gap_free_and_concurrent_writers_never_collide(tmp_path):
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_save_many, args=(tmp_path, 5)) for _ in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert all(p.exitcode == 0 for p in procs)
    assert versions("a", tmp_path) == list(range(1, 16))
    numbers = sorted(json.loads((tmp_path / f"a/v{v:04d}/manifest.json").read_text())["version"] for v in range(1, 16))
    assert numbers == list(range(1, 16))
    assert not list((tmp_path / "a").glob(".tmp-*"))


def test_a_failed_or_killed_write_leaves_no_version(tmp_path):
    with pytest.raises(FileNotFoundError):
        save_artifact(TraceProgram(), {"config": {}}, name="a", root=tmp_path,
                      extra_files={"x.jsonl": tmp_path / "missing.jsonl"})
    assert versions("a", tmp_path) == [] and not list((tmp_path / "a").glob(".tmp-*"))
    # A writer killed with -9 leaves its private folder behind; it is never a version,
    # and the next save removes it.
    stale = tmp_path / "a" / ".tmp-999999999-dead"
    stale.mkdir()
    (stale / "program.json").write_text("{")
    assert versions("a", tmp_path) == []
    _save(tmp_path)
    assert versions("a", tmp_path) == [1] and not stale.exists()


def test_round_trip_gives_exactly_the_compiled_outputs(tmp_path):
    lm, _ = fake_lm(reply_for)
    with dspy.context(lm=lm):
        compiled = dspy.BootstrapFewShot(metric=lambda e, p, trace=None: True, max_bootstrapped_demos=2,
                                         max_labeled_demos=1).compile(TraceProgram(), trainset=trainset())
        compiled.generate_response.signature = compiled.generate_response.signature.with_instructions("Be kind.")
    folder = save_artifact(compiled, {"config": {"program": ProgramConfig().to_dict(), "lm": {}}}, root=tmp_path)
    loaded = trace_dspy.load(str(folder), attach_lms=False)
    probe_lm, probe = fake_lm(reply_for)
    outputs = []
    for program in (compiled, loaded):
        probe.calls.clear()
        with dspy.context(lm=probe_lm):
            outputs.append(program(dialogue="My ring slipped into the sea.").toDict())
        outputs.append([(c.instructions, c.inputs) for c in probe.calls])
    assert outputs[0] == outputs[2] and outputs[1] == outputs[3]  # same outputs, same prompts
    assert loaded.generate_response.signature.instructions == "Be kind."


@pytest.mark.parametrize(("damage", "message"), [
    (lambda f: (f / "program.json").write_text('{"recognize_emotion": '), "damaged or truncated"),
    (lambda f: (f / "manifest.json").write_text("{"), "damaged or truncated"),
    (lambda f: (f / "manifest.json").unlink(), "manifest.json is missing"),
    (lambda f: _edit(f, "manifest.json", schema_version=99), "schema version 99"),
    (lambda f: _edit(f, "manifest.json", drop="predictors"), "missing predictors"),
    (lambda f: _rename_predictor(f), "do not match"),
])
def test_tampered_artifacts_give_clear_errors(tmp_path, damage, message):
    folder = _save(tmp_path)
    damage(folder)
    with pytest.raises(ArtifactError, match=message):
        trace_dspy.load(str(folder))


def _edit(folder, name, drop=None, **changes):
    data = json.loads((folder / name).read_text())
    data.update(changes)
    if drop:
        data.pop(drop)
    (folder / name).write_text(json.dumps(data))


def _rename_predictor(folder):
    data = json.loads((folder / "program.json").read_text())
    data["respond"] = data.pop("generate_response")
    (folder / "program.json").write_text(json.dumps(data))


def test_dspy_version_drift_warns(tmp_path):
    folder = _save(tmp_path)
    _edit(folder, "manifest.json", packages={"dspy": "0.0.1"})
    with pytest.warns(UserWarning, match="compiled with dspy 0.0.1"):
        trace_dspy.load(str(folder))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        trace_dspy.load(str(_save(tmp_path)))  # same version: no warning


def test_loading_never_unpickles(tmp_path):
    folder = _save(tmp_path)
    (folder / "program.pkl").write_bytes(b"\x80\x04not a real pickle")
    assert trace_dspy.load(str(folder / "program.json"))  # the pickle is never touched


# ---------------------------------------------------------------- registry and references


def test_champion_moves_only_on_a_strictly_better_score(tmp_path):
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    import mlflow

    mlflow.set_tracking_uri(uri)
    with mlflow.start_run(experiment_id=mlflow.create_experiment("champion")) as run:
        versions_ = [register_version(run.info.run_id, run.info.artifact_uri, s, tracking_uri=uri)
                     for s in (0.5, 0.4, 0.5, 0.50001)]
    assert versions_ == [1, 2, 3, 4]
    assert promote_if_better(1, 0.5, tracking_uri=uri) is True
    assert promote_if_better(2, 0.4, tracking_uri=uri) is False
    assert promote_if_better(3, 0.5, tracking_uri=uri) is False  # a tie does not move it
    assert champion(tracking_uri=uri) == (1, 0.5)
    assert promote_if_better(4, 0.50001, tracking_uri=uri) is True
    assert champion(tracking_uri=uri) == (4, 0.50001)


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
    import trace_dspy.workflows.compile as workflow
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
    lm, _ = fake_lm(reply_for)
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
