"""python -m trace_dspy.inspect: one artifact's summary, the diff of two, JSON output, bad references."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

import trace_dspy.lm.specs as lms_module
from trace_dspy.cli.compile import config_from_args
from trace_dspy.cli.inspect_artifact import main
from trace_dspy.store.artifacts import save_artifact
from trace_dspy.workflows.loading import load_for_run
from trace_dspy.workflows.settings import Settings
from trace_dspy.testing.fakes import fake_lm
from trace_dspy.workflows.compiling import run_compile

NEW_REPLY_RULES = "Answer in one warm sentence.\nName the thing the speaker lost."


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """v1 from a real (fake-LM) compile; v2 changes one stage's instructions, adds demos, another optimizer."""
    root = tmp_path_factory.mktemp("inspect") / "artifacts"
    config = root.parent / "fast.toml"
    config.write_text('[metric]\nsimilarity_kind = "token_f1"\n')  # no sentence-embedding model to load
    lm, _ = fake_lm()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(lms_module, "build_lm", lambda spec: lm)
        mp.chdir(root.parent)
        mp.delenv("TRACE_DSPY_DATA", raising=False)
        cfg = config_from_args(["--optimizer", "labeled", "--max-labeled", "1", "--train", "3", "--dev", "2",
                                "--no-mlflow", "--threads", "1", "--artifacts-dir", str(root),
                                "--config", str(config)])
        v1 = run_compile(cfg)
        loaded = load_for_run(str(v1.artifact), Settings())
    program = loaded.program
    program.generate_response.signature = program.generate_response.signature.with_instructions(NEW_REPLY_RULES)
    program.plan_strategy.demos = program.plan_strategy.demos * 3
    keep = {k: v for k, v in loaded.manifest.to_dict().items()
            if k not in ("schema_version", "name", "version", "created", "git_commit", "packages", "predictors")}
    scores = json.loads(json.dumps(keep["scores"]))
    scores["dev_after"]["empathy"] = scores["dev_after"]["empathy"] + 0.25
    manifest = {**keep, "optimizer": {"name": "mipro", "seed": 0, "mipro_trials": 7}, "scores": scores}
    save_artifact(program, manifest, root=root)
    return root, v1.manifest, manifest


@pytest.fixture
def two_versions(built, monkeypatch, tmp_path):
    root, v1, v2 = built
    monkeypatch.setenv("TRACE_DSPY_ARTIFACTS", str(root))
    monkeypatch.chdir(tmp_path)
    return v1, v2


def test_summary_shows_manifest_and_every_stage(two_versions, capsys):
    v1, _ = two_versions
    assert main(["trace-dspy@v1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("trace-dspy@v1")
    assert "optimizer   labeled (seed=0, max_labeled_demos=1, plan_items=16)" in out
    assert v1["data"]["fingerprint"] in out and "(3 train, 2 dev)" in out
    empathy = next(line for line in out.splitlines() if line.strip().startswith("empathy"))
    before, after = v1["scores"]["dev_before"]["empathy"], v1["scores"]["dev_after"]["empathy"]
    assert empathy.split()[1:3] == [f"{before:.3f}", f"{after:.3f}"]
    stages = out.split("\nstages\n", 1)[1]
    for name in ("recognize_emotion", "analyze_cause", "plan_strategy", "generate_response"):
        assert f"  {name}: 1 demo\n" in stages
    assert "Write the listener's next reply" in stages  # the instructions themselves
    assert stages.index("recognize_emotion") < stages.index("generate_response")  # pipeline order


def test_diff_names_what_the_optimizer_changed(two_versions, capsys):
    assert main(["trace-dspy@v1", "trace-dspy@latest"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("trace-dspy@v1 -> trace-dspy@v2")
    lines = out.splitlines()
    assert "  recognize_emotion: instructions unchanged, demos 1" in lines
    assert "  plan_strategy: instructions unchanged, demos 1 -> 3 (2 new)" in lines
    assert "  generate_response: instructions changed, demos 1" in lines
    diff = out.split("generate_response: instructions changed", 1)[1].split("\nmanifest\n", 1)[0]
    assert "--- trace-dspy@v1/generate_response" in diff and "+++ trace-dspy@v2/generate_response" in diff
    assert "    +Answer in one warm sentence." in diff and "    +Name the thing the speaker lost." in diff
    assert any(line.startswith("    -Write the listener's next reply") for line in diff.splitlines())
    manifest = out.split("\nmanifest\n", 1)[1]
    assert "optimizer.name" in manifest and "labeled -> mipro" in manifest
    assert "optimizer.mipro_trials" in manifest and "optimizer.max_labeled_demos" in manifest
    assert "config.optimizer" not in manifest  # the compile config itself did not change
    empathy = next(line for line in manifest.splitlines() if line.strip().startswith("empathy"))
    assert empathy.split()[-1] == "+0.250"


def test_json_output(two_versions, capsys):
    _, v2 = two_versions
    assert main(["--json", "trace-dspy@v2"]) == 0
    one = json.loads(capsys.readouterr().out)
    assert one["version"] == 2 and one["optimizer"]["name"] == "mipro"
    assert one["stages"]["plan_strategy"] == {"instructions": one["stages"]["plan_strategy"]["instructions"],
                                              "demos": 3}
    assert one["stages"]["generate_response"]["instructions"] == NEW_REPLY_RULES
    assert one["scores"]["dev_after"]["empathy"] == v2["scores"]["dev_after"]["empathy"]
    assert one["data"]["train"] == 3 and "train_ids" not in one["data"]
    assert main(["--json", "trace-dspy@v1", "trace-dspy@v2"]) == 0
    two = json.loads(capsys.readouterr().out)
    assert two["stages"]["generate_response"]["instructions_changed"] is True
    assert two["stages"]["analyze_cause"]["instructions_changed"] is False
    assert two["stages"]["plan_strategy"]["demos"] == [1, 3]
    assert (two["stages"]["plan_strategy"]["demos_new"], two["stages"]["plan_strategy"]["demos_dropped"]) == (2, 0)
    assert two["manifest"]["optimizer.name"] == ["labeled", "mipro"]
    assert two["same_dev_set"] is True


@pytest.mark.parametrize(("refs", "message"), [
    (["nope@v1"], "no versions of 'nope'"),
    (["trace-dspy@v7"], "has no version 7"),
    (["trace-dspy@newest"], "use trace-dspy@vN or trace-dspy@latest"),
    (["no/such/folder"], "cannot resolve program"),
    (["a@v1", "b@v1", "c@v1"], "give one reference to show, or two to diff"),
])
def test_bad_references_are_clear_errors(two_versions, capsys, refs, message):
    assert main(refs) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err


def test_damaged_artifacts_are_clear_errors(built, two_versions, tmp_path, capsys):
    folder = tmp_path / "damaged"
    shutil.copytree(built[0] / "trace-dspy/v0002", folder)
    (folder / "program.json").write_text('{"recognize_emotion": {"dem')
    assert main([str(folder)]) == 2
    assert "damaged or truncated JSON" in capsys.readouterr().err
    (folder / "manifest.json").unlink()
    assert main(["trace-dspy@v1", str(folder)]) == 2
    assert "manifest.json is missing" in capsys.readouterr().err


def test_module_runs_on_the_shipped_artifact(tmp_path):
    """``python -m trace_dspy.inspect`` works from anywhere, and the name does not hide the stdlib module."""
    run = subprocess.run([sys.executable, "-m", "trace_dspy.inspect", "--json", "trace-dspy@v1"],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path, check=False)
    assert run.returncode == 0, run.stderr
    data = json.loads(run.stdout)
    assert data["name"] == "trace-dspy" and data["version"] == 1
    assert set(data["stages"]) == {"recognize_emotion", "analyze_cause", "plan_strategy", "generate_response"}
    assert all(s["demos"] == data["optimizer"]["max_labeled_demos"] for s in data["stages"].values())
