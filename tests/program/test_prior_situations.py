"""The emotion prior's situations file, its refit, the choice between the fitted and the shipped prior, and
priors saved before feature version 3."""

from __future__ import annotations

import json
from pathlib import Path

import dspy
import numpy as np
import pytest
from test_emotion_prior import corpus, fake_encode

from trace_dspy import ProgramConfig, TraceProgram
from trace_dspy.data.situations import (
    SITUATIONS_ENV,
    read_situations,
    resolve_situations,
)
from trace_dspy.data.sources import DataError, DataSource, Sample
from trace_dspy.program import emotion_prior as ep
from trace_dspy.program.emotion_prior import (
    EmotionPrior,
    FeatureSpec,
    TrainingSet,
    fit_from_source,
    fit_prior,
)
from trace_dspy.testing.fakes import fake_lm
from trace_dspy.workflows import prior as prior_choice

ROOT = Path(__file__).resolve().parents[2]


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


# -- the situations file -----------------------------------------------------------------


def test_a_situations_file_is_read_with_its_fingerprint(tmp_path):
    path = write(tmp_path / "s.csv", 'situation,emotion\n"my dog died, sadly",sad\n\nI won the race,proud\n')
    sit = read_situations(path)
    assert sit.texts == ("my dog died, sadly", "I won the race") and sit.labels == ("sad", "proud")
    assert sit.fingerprint.startswith("sha256:") and len(sit) == 2
    write(path, 'situation,emotion\n"my dog died, sadly",sad\n\nI won the race!,proud\n')
    assert read_situations(path).fingerprint != sit.fingerprint


@pytest.mark.parametrize("text, where, reason", [
    ("situation,emotion\nfine,sad\ntoo,many,fields\n", ":3:", "expected 2 fields, found 3"),
    ("situation,emotion\nfine,sad\nI passed,glad\n", ":3:", "unknown emotion 'glad'"),
    ("situation,emotion\n ,sad\n", ":2:", "empty situation"),
    ("text,label\nfine,sad\n", ":1:", "header lacks column(s) situation, emotion"),
    ('situation,emotion\n"never closed,sad\n', ":", "malformed CSV"),
    ("situation,emotion\n", "", "no rows"),
    ("", "", "empty"),
])
def test_a_malformed_situations_file_names_the_file_and_line(tmp_path, text, where, reason):
    path = write(tmp_path / "bad.csv", text)
    with pytest.raises(DataError) as info:
        read_situations(path)
    message = str(info.value)
    assert message.startswith(f"{path}{where}") and reason in message and "\n" not in message, message


def test_a_missing_situations_file_is_named(tmp_path):
    with pytest.raises(DataError, match=f"{tmp_path / 'nope.csv'}: situations file not found"):
        read_situations(tmp_path / "nope.csv")


def test_the_flag_wins_over_the_environment_and_none_ignores_it(tmp_path, monkeypatch):
    a = write(tmp_path / "a.csv", "situation,emotion\nx,sad\n")
    b = write(tmp_path / "b.csv", "situation,emotion\ny,proud\n")
    monkeypatch.delenv(SITUATIONS_ENV, raising=False)
    assert resolve_situations(None) is None
    monkeypatch.setenv(SITUATIONS_ENV, str(a))
    assert resolve_situations(None).labels == ("sad",)
    assert resolve_situations(str(b)).labels == ("proud",)
    assert resolve_situations("none") is None


@pytest.mark.parametrize("command", ["fit_prior", "compile"])
def test_commands_stop_on_a_bad_situations_file_with_one_line_and_exit_2(tmp_path, capsys, command, monkeypatch):
    from trace_dspy.cli import compile as compile_cli
    from trace_dspy.cli import fit_prior as fit_cli

    monkeypatch.chdir(tmp_path)
    bad = write(tmp_path / "bad.csv", "situation,emotion\nfine,sad\nI passed,glad\n")
    if command == "fit_prior":
        rc = fit_cli.main(["--data", str(ROOT / "trace_dspy/data/seed/seed_dialogues.jsonl"), "--situations",
                           str(bad), "--output", str(tmp_path / "p.npz")])
    else:
        rc = compile_cli.main(["--situations", str(bad), "--no-mlflow", "--artifacts-dir", str(tmp_path / "a")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and err[-1].startswith("error:") and f"{bad}:3: unknown emotion 'glad'" in err[-1], err
    assert not (tmp_path / "a").exists() and not (tmp_path / "p.npz").exists()


# -- fitting with situations ---------------------------------------------------------------


def source_of(texts, labels, name="pool") -> DataSource:
    pool = [Sample(f"{name}-{i}", f"{name}-c{i}", (t,), e, "I hear you.") for i, (t, e) in enumerate(zip(texts, labels))]
    return DataSource("jsonl-file", name, pool, pool[:4], f"sha256:{name}")


class Sits:
    """Stands in for data.situations.Situations."""

    def __init__(self, texts, labels, fingerprint="sha256:sits"):
        self.texts, self.labels, self.fingerprint = tuple(texts), tuple(labels), fingerprint

    def __len__(self):
        return len(self.texts)


def test_the_refit_is_deterministic_for_a_seed_and_records_both_fingerprints():
    texts, labels = corpus(300, 0)
    source = source_of(texts, labels)
    sits = Sits(*corpus(120, 5))
    first = fit_from_source(source, situations=sits, seed=3, encode=fake_encode)
    again = fit_from_source(source, situations=sits, seed=3, encode=fake_encode)
    assert np.array_equal(first.weights, again.weights) and np.array_equal(first.bias, again.bias)
    assert first.vocab == again.vocab and first.meta["temperature"] == again.meta["temperature"]
    other = fit_from_source(source, situations=sits, seed=4, encode=fake_encode)
    assert not np.array_equal(first.weights, other.weights)  # another split, another fit
    assert first.meta["data_fingerprint"] == "sha256:pool" and first.meta["situations_fingerprint"] == "sha256:sits"
    assert first.meta["situation_samples"] == 120 and first.meta["split_seed"] == 3
    assert first.meta["train_samples"] == first.meta["dialogue_samples"] + 120
    plain = fit_from_source(source, seed=3, encode=fake_encode)
    assert "situations_fingerprint" not in plain.meta and plain.meta["situation_samples"] == 0


def test_situations_teach_labels_the_pool_lacks():
    texts, labels = corpus(300, 0)  # afraid, joyful, proud, sad
    lonely = [f"nobody called me again {w}" for w in ("today", "tonight", "this week", "at all")] * 10
    fitted = fit_from_source(source_of(texts, labels), situations=Sits(lonely, ["lonely"] * 40),
                             encode=fake_encode)
    assert "lonely" in fitted.labels
    assert fitted.candidates("Speaker: nobody called me again tonight", 1, fake_encode)[0][0] == "lonely"


def test_the_temperature_is_fitted_on_dev_and_applied():
    (tt, tl), (dt, dl) = corpus(240, 0), corpus(40, 1)
    prior = fit_prior(TrainingSet.of(tt, tl), dt, dl, fake_encode)
    t = prior.meta["temperature"]
    assert t in ep.TEMPERATURES
    raw = prior.logits(["funeral cried"], fake_encode, calibrated=False)
    assert np.allclose(prior.logits(["funeral cried"], fake_encode), raw / t)
    assert abs(prior.proba_texts(["funeral cried"], fake_encode).sum() - 1) < 1e-5


# -- fitted or shipped ---------------------------------------------------------------------


def _prior_scoring(accuracy: float, **meta) -> EmotionPrior:
    (tt, tl), (dt, dl) = corpus(240, 0), corpus(40, 1)
    prior = fit_prior(TrainingSet.of(tt, tl), dt, dl, fake_encode)
    prior.meta.update(dev_accuracy=accuracy, **meta)
    return prior


@pytest.mark.parametrize("fitted_acc, shipped_acc, kept", [(0.60, 0.55, "fitted"), (0.50, 0.55, "shipped"),
                                                           (0.55, 0.55, "fitted")])
def test_the_better_prior_on_dev_is_kept_and_the_choice_is_said(monkeypatch, fitted_acc, shipped_acc, kept):
    texts, labels = corpus(300, 0)
    source = source_of(texts, labels)
    fitted = _prior_scoring(fitted_acc)
    shipped = _prior_scoring(shipped_acc)
    monkeypatch.setattr(ep, "cached_prior", lambda *a, **k: fitted)
    monkeypatch.setattr(ep, "shipped_prior", lambda: shipped)
    monkeypatch.setattr(prior_choice, "_shipped_dev_accuracy", lambda *a: shipped_acc)
    choice = prior_choice.choose_prior(source)
    assert choice.source == kept and choice.prior is (fitted if kept == "fitted" else shipped)
    line = choice.summary()
    assert f"kept the {kept} one" in line and f"{max(fitted_acc, shipped_acc):.3f}" in line, line
    record = choice.record()
    assert record["source"] == kept and record["compared_on_dev"]["fitted"] == fitted_acc
    assert record["compared_on_dev"]["shipped"] == shipped_acc and record["compared_on_dev"]["dev_samples"] > 0


def test_the_shipped_prior_is_scored_on_the_same_dev_items(monkeypatch):
    texts, labels = corpus(300, 0)
    source = source_of(texts, labels)
    monkeypatch.setattr(ep, "default_encoder", lambda: fake_encode)
    shipped = _prior_scoring(0.0, data_fingerprint="sha256:elsewhere")
    seen = {}

    def spy(prior, texts, gold, encode, p=None):
        seen["n"] = len(texts)
        return {"accuracy": 0.25, "group_accuracy": 0.5, "top3": 0.5}

    monkeypatch.setattr(ep, "accuracy", spy)
    monkeypatch.setattr(ep, "cached_prior", lambda *a, **k: _prior_scoring(0.5))
    monkeypatch.setattr(ep, "shipped_prior", lambda: shipped)
    choice = prior_choice.choose_prior(source)
    assert choice.source == "fitted" and choice.shipped_dev == 0.25 and seen["n"] == choice.dev_samples > 0
    # The shipped prior fitted on this very pool with another split has seen dev items: the line says so.
    shipped.meta.update(data_fingerprint="sha256:pool", split_seed=7, dev_fraction=0.2)
    assert "optimistic" in prior_choice.choose_prior(source).summary()


def test_a_pool_too_small_gets_the_shipped_prior_and_prior_k_0_gets_none(monkeypatch):
    texts, labels = corpus(40, 0)
    shipped = _prior_scoring(0.5)
    monkeypatch.setattr(ep, "shipped_prior", lambda: shipped)
    choice = prior_choice.choose_prior(source_of(texts, labels))
    assert choice.prior is shipped and "fewer than the 200" in choice.summary()
    assert prior_choice.choose_prior(source_of(texts, labels), prior_k=0).record()["file"] is None


# -- priors saved before feature version 3 ---------------------------------------------------------


def _legacy_prior(tmp_path) -> Path:
    """A version-2 file as the code before version 3 wrote it: binary idf bag of words, both views x 10."""
    vocab = ["cried", "funeral", "party", "won"]
    dim = 16
    rng = np.random.default_rng(0)
    weights = rng.normal(size=(dim + len(vocab), 2)).astype(np.float32)
    header = {"feature_version": 2, "labels": ["joyful", "sad"], "vocab": vocab, "l2": 0.03,
              "dev_accuracy": 0.5, "data_fingerprint": "sha256:old"}
    path = tmp_path / ep.FILE_NAME
    np.savez_compressed(path, idf=np.array([1.0, 2.0, 0.5, 1.5], np.float32), weights=weights,
                        bias=np.array([0.1, -0.1], np.float32),
                        header=np.frombuffer(json.dumps(header).encode(), np.uint8))
    return path


def test_a_version_2_prior_predicts_as_it_did(tmp_path):
    prior = EmotionPrior.load(_legacy_prior(tmp_path))
    assert prior.spec == FeatureSpec(10.0, 10.0, 1, "binary") and prior.temperature == 1.0
    text = "funeral funeral cried party partying"
    # The old formula: 10 * [embedding | unit-length binary idf bag] @ W + b.
    bag = np.array([1.0, 2.0, 0.5, 0.0], np.float32)  # cried, funeral (once, binary), party; not "partying"
    bag /= np.linalg.norm(bag)
    expected = 10 * np.hstack([fake_encode([text])[0], bag]) @ prior.weights + prior.bias
    assert np.allclose(prior.logits([text], fake_encode)[0], expected, atol=1e-4)


def test_an_artifact_whose_prior_knows_no_situations_still_loads_and_runs(tmp_path, monkeypatch):
    from trace_dspy.lm.specs import LMConfig
    import trace_dspy
    from trace_dspy.store.artifacts import save_artifact

    path = _legacy_prior(tmp_path)
    old = EmotionPrior.load(path)
    program = TraceProgram(ProgramConfig(prior_k=2), emotion_prior=old)
    manifest = {"config": {"program": program.config.to_dict(), "lm": LMConfig().to_dict()},
                "emotion_prior": {"file": ep.FILE_NAME, "source": "fitted", **old.describe()}}
    folder = save_artifact(program, manifest, root=tmp_path / "a", extra_files={ep.FILE_NAME: path})
    monkeypatch.setattr(ep, "default_encoder", lambda: fake_encode)
    loaded = trace_dspy.load(str(folder), attach_lms=False)
    assert loaded.emotion_prior.feature_version == 2 and "situations_fingerprint" not in loaded.emotion_prior.meta
    lm, _ = fake_lm()
    with dspy.context(lm=lm):
        out = loaded(dialogue="Speaker: We went to the funeral and I cried.")
    offered = [c.split(" (")[0] for c in out.emotion_candidates.split(", ")]
    assert out.emotion_path == "prior+lm (top 2)" and sorted(offered) == ["joyful", "sad"]


def test_the_shipped_default_artifact_of_the_previous_prior_still_loads():
    folder = ROOT / "artifacts" / "trace-dspy" / "v0004"
    import trace_dspy

    prior = trace_dspy.load(str(folder), attach_lms=False).emotion_prior
    assert prior.feature_version == 2 and prior.spec.ngrams == 1 and len(prior.labels) == 32
