"""The learned relevance head, its refit command, and scoring stored rows again under a new metric."""

from __future__ import annotations

import dspy
import numpy as np
import pytest
from conftest import required
from trace_dspy.optimize.metric import EmpathyMetric, MetricConfig
from trace_dspy.optimize.relevance import (
    WEIGHTS_FILE,
    RelevanceError,
    RelevanceHead,
    RelevanceScorer,
    contrastive_step,
    fit_calibration,
)

from trace_dspy import TraceProgram
from trace_dspy.testing.fakes import fake_lm
from trace_dspy.workflows.evaluation import evaluate_program


def test_shipped_head_loads_without_pickle_and_names_its_data(tmp_path):
    head = RelevanceHead.load(WEIGHTS_FILE)
    assert head.meta["data_fingerprint"].startswith("sha256:")
    assert head.A.shape == head.B.shape == head.C.shape == (384, head.meta["rank"])
    table = head.meta["dev_table"]
    assert table["auc_head"] > table["auc_cosine"]  # the reason the head exists
    assert "python -m trace_dspy.fit_relevance" in head.meta["command"]
    pickled = tmp_path / "pickled.npz"
    np.savez(pickled, A=np.array([object()], dtype=object), B=head.B, C=head.C, w=head.w,
             calibration=head.calibration, header=np.frombuffer(b"{}", dtype=np.uint8))
    with pytest.raises(RelevanceError, match="damaged"):
        RelevanceHead.load(pickled)
    torn = tmp_path / "torn.npz"
    torn.write_bytes(WEIGHTS_FILE.read_bytes()[:400])
    with pytest.raises(RelevanceError, match="torn.npz"):
        RelevanceHead.load(torn)
    with pytest.raises(RelevanceError, match="fit_relevance"):
        RelevanceHead.load(tmp_path / "absent.npz")
    head.meta["feature_version"] = 99
    head.save(tmp_path / "v99.npz")
    with pytest.raises(RelevanceError, match="feature version"):
        RelevanceHead.load(tmp_path / "v99.npz")


def test_contrastive_gradients_match_finite_differences():
    rng = np.random.default_rng(3)

    def unit(n):
        x = rng.normal(size=(n, 6))
        return x / np.linalg.norm(x, axis=1, keepdims=True)

    s, last, r = unit(5), unit(5), unit(5)
    params = {k: rng.normal(scale=0.3, size=(6, 3)) for k in ("A", "B", "C")}
    params["w"] = np.array([0.7, 0.2])
    _, grads = contrastive_step(params, s, last, r)
    for key in ("A", "B", "C", "w"):
        flat = params[key].reshape(-1)
        for i in range(0, flat.size, max(1, flat.size // 5)):
            old = flat[i]
            flat[i] = old + 1e-6
            up, _ = contrastive_step(params, s, last, r)
            flat[i] = old - 1e-6
            down, _ = contrastive_step(params, s, last, r)
            flat[i] = old
            assert grads[key].reshape(-1)[i] == pytest.approx((up - down) / 2e-6, rel=1e-4, abs=1e-7), key


def test_calibration_recovers_a_known_logistic():
    rng = np.random.default_rng(0)
    z = rng.normal(size=4000)
    y = (rng.random(4000) < 1 / (1 + np.exp(-(2.0 * z - 0.5)))).astype(float)
    a, b = fit_calibration(z, y)
    assert a == pytest.approx(2.0, abs=0.2) and b == pytest.approx(-0.5, abs=0.15)


@pytest.fixture(scope="module")
def relevance():
    from trace_dspy.optimize.similarity import embedder_available

    if not embedder_available():
        required("the 'embed' extra is not installed")
    return RelevanceScorer()


def test_head_reproduces_its_probes_and_prefers_the_fitting_reply(relevance, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    probes = relevance.meta["probes"]
    got = relevance.score_batch([p["speaker"] for p in probes], [p["speaker"] for p in probes],
                                [p["reply"] for p in probes])
    assert got == pytest.approx([p["p"] for p in probes], abs=1e-5)
    assert all(0 < p < 1 for p in got)
    failed = "I failed my driving test again."
    assert relevance.score(failed, failed, "Oh no, that test again? What went wrong?") > \
        relevance.score(failed, failed, "Congratulations on the new puppy!") + 0.3


def test_metric_uses_the_head_and_a_callers_embedder_gets_cosine(relevance):
    ex = dspy.Example(dialogue="Speaker: My dog died yesterday.", emotion="sad",
                      response="I'm so sorry.").with_inputs("dialogue")
    metric = EmpathyMetric()
    fits = metric.evaluate(ex, dspy.Prediction(response="I'm so sorry about your dog. How old was he?"))
    generic = metric.evaluate(ex, dspy.Prediction(response="that is great . maybe you will get a raise too"))
    assert fits.details["relevance_kind"] == "learned"
    assert fits.components["relevance"] > generic.components["relevance"] + 0.3
    assert generic.components["grounded"] < 1.0

    class Cosine:
        def similarity(self, a, b):
            return 0.5

    own = EmpathyMetric(MetricConfig(), embedder=Cosine(), scorer=None)
    assert own.relevance is None and own.relevance_kind == "semantic"
    assert own.evaluate(ex, dspy.Prediction(response="Oh no.")).components["relevance"] == 0.5


def test_rows_from_an_earlier_metric_are_scored_again_without_rerunning_the_program(tmp_path):
    def reply(outputs, inputs):
        return {"response": "Oh no, your driving test? What went wrong?"} if "response" in outputs else {}

    examples = [dspy.Example(dialogue=f"Speaker: I failed my driving test, try {i}.", emotion="sad",
                             response="That is rough.", sample_id=f"s{i}").with_inputs("dialogue")
                for i in range(3)]
    path = tmp_path / "rows.jsonl"
    plain = MetricConfig(emotion=1.0, similarity=0.0, empathy=0.0, relevance=0.0, rules=0.0, strategy_fit=0.0)
    lm, engine = fake_lm(reply)
    calls = engine.calls
    first = evaluate_program(TraceProgram(), examples, EmpathyMetric(plain, embedder=None, scorer=None), lm=lm,
                             results_path=path)
    n_calls = len(calls)
    assert n_calls > 0
    rules_only = MetricConfig(emotion=0.0, similarity=0.0, empathy=0.0, relevance=0.0, rules=1.0, strategy_fit=0.0)
    again = evaluate_program(TraceProgram(), examples, EmpathyMetric(rules_only, embedder=None, scorer=None),
                             lm=lm, results_path=path)
    assert len(calls) == n_calls  # nothing was generated again
    assert [r["prediction"]["response"] for r in again.rows] == [r["prediction"]["response"] for r in first.rows]
    assert [r["score"] for r in again.rows] == [r["components"]["rules"] for r in again.rows]
    assert again.rows[0]["metric_signature"] != first.rows[0]["metric_signature"]


@pytest.mark.slow
def test_refit_reproduces_the_recorded_subset_table(relevance, ed_dir, capsys):
    from trace_dspy.cli import fit_relevance

    limit = str(relevance.meta["reproduce"]["limit"])
    assert fit_relevance.main(["--data", str(ed_dir), "--limit", limit, "--check"]) == 0
    assert "matches" in capsys.readouterr().out
    assert fit_relevance.main(["--data", str(ed_dir), "--limit", limit, "--check", "--seed", "1"]) == 1
