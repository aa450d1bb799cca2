"""The champion moves only on a fair comparison: the same dev items under the same metric.

A fake LM writes three kinds of reply: a warm one with a question (every program, while the first champion
is compiled), a plain one (the program without the cause stage, later) and a bare "ok, ..." (the full program,
later). So the first champion's recorded score is high, but on later dev sets it scores lowest.
"""

from __future__ import annotations

import json

import pytest
from conftest import offline_workdir
from mlflow import MlflowClient

from trace_dspy.cli.compile import config_from_args
from trace_dspy.store.registry import champion, promote_if_better
from trace_dspy.testing.fakes import fake_lm
from trace_dspy.workflows.compiling import run_compile

PHASE = {"later": False}
FULL = '[metric]\nsimilarity_kind = "token_f1"\n[program]\nprior_k = 0\nbest_of = 1\n'
NO_CAUSE = FULL + 'disabled = ["analyze_cause"]\n'


def reply_for(outputs, inputs):
    if "response" not in outputs:
        return {}
    words = " ".join(inputs["dialogue"].split()[-3:])
    if not PHASE["later"]:
        return {"response": f"Oh, that sounds so hard; {words} how are you holding up?"}
    if "cause_summary" in inputs:  # the full program, later: a bare acknowledgement
        return {"response": f"ok, {words}."}
    return {"response": f"I hear you about {words}."}


@pytest.fixture
def compile_with(monkeypatch, tmp_path):
    lm, _ = fake_lm(reply_for)
    offline_workdir(tmp_path, monkeypatch, lm)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    PHASE["later"] = False

    def run(config: str, seed: int):
        (tmp_path / "c.toml").write_text(config)
        cfg = config_from_args(["--optimizer", "labeled", "--max-labeled", "1", "--train", "3", "--dev", "3",
                                "--threads", "1", "--seed", str(seed), "--tracking-uri", uri, "--no-trace",
                                "--config", str(tmp_path / "c.toml")])
        return run_compile(cfg)

    return run, uri


def _tags(uri: str, version: int) -> dict:
    return MlflowClient(tracking_uri=uri).get_model_version("trace-dspy", str(version)).tags


def test_the_champion_is_scored_again_on_another_dev_set(compile_with):
    run, uri = compile_with
    first = run(FULL, seed=0)
    assert first.promoted and first.manifest.get("champion") is None  # no champion to beat
    recorded = first.after["empathy"]

    PHASE["later"] = True
    second = run(NO_CAUSE, seed=1)  # other dev items
    plain = second.after["empathy"]
    assert plain < recorded  # on the raw scores the first champion would stay
    comparison = second.manifest["champion"]
    assert comparison["rescored"] and comparison["version"] == 1
    assert comparison["recorded_score"] == pytest.approx(recorded)
    assert comparison["score"] < plain  # on these dev items it only says ok
    assert comparison["dev_fingerprint"] == first.manifest["data"]["dev_fingerprint"]
    assert comparison["new_dev_fingerprint"] == second.manifest["data"]["dev_fingerprint"] != \
        comparison["dev_fingerprint"]
    assert second.promoted and champion(tracking_uri=uri) == (2, pytest.approx(plain))
    tags = _tags(uri, 2)  # both scores and both fingerprints on the registered version
    assert float(tags["dev_empathy"]) == pytest.approx(plain)
    assert float(tags["champion_dev_empathy"]) == pytest.approx(comparison["score"])
    assert tags["dev_fingerprint"] == comparison["new_dev_fingerprint"]
    assert tags["champion_dev_fingerprint"] == comparison["dev_fingerprint"]
    saved = json.loads((second.artifact / "manifest.json").read_text())
    assert saved["champion"] == comparison

    # The same dev items again: the champion's recorded score is the comparison, and "ok, ..." does not beat it.
    third = run(FULL, seed=1)
    assert third.manifest["data"]["dev_fingerprint"] == second.manifest["data"]["dev_fingerprint"]
    assert third.manifest["champion"]["rescored"] is False
    assert not third.promoted and champion(tracking_uri=uri)[0] == 2


def test_promotion_refuses_a_score_on_other_dev_items(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    from trace_dspy.store.registry import register_version

    for n in (1, 2, 3):
        register_version(f"run{n}", "file:///nowhere", 0.5, tracking_uri=uri, tags={"dev_fingerprint": f"dev:{n}"})
    assert promote_if_better(1, 0.5, tracking_uri=uri, dev_fingerprint="dev:1")
    # a higher score on other items, with no score of the champion on them: the champion stays
    assert not promote_if_better(2, 0.9, tracking_uri=uri, dev_fingerprint="dev:2")
    # the champion scored on those items: the comparison decides, strictly
    assert not promote_if_better(2, 0.9, tracking_uri=uri, dev_fingerprint="dev:2",
                                 comparison={"version": 1, "score": 0.9})
    assert promote_if_better(2, 0.9, tracking_uri=uri, dev_fingerprint="dev:2",
                             comparison={"version": 1, "score": 0.7})
    # a comparison with a version that is no longer the champion does not count
    assert not promote_if_better(3, 0.95, tracking_uri=uri, dev_fingerprint="dev:3",
                                 comparison={"version": 1, "score": 0.1})
    assert champion(tracking_uri=uri)[0] == 2
