"""The fitted emotion prior: fitting, files without pickle, candidates in the prompt, the grammar, fallbacks."""

from __future__ import annotations

import hashlib
import json
import zipfile

import dspy
import numpy as np
import pytest

from trace_dspy import ProgramConfig, TraceProgram
from trace_dspy.core.config import ConfigError
from trace_dspy.lm.grammar import grammar_for, listed_choices, output_grammar
from trace_dspy.program import emotion_prior as ep
from trace_dspy.program.emotion_prior import (
    EmotionPrior,
    PriorError,
    TrainingSet,
    fit_prior,
    format_candidates,
)
import trace_dspy
from trace_dspy.store.artifacts import ArtifactError, save_artifact
from trace_dspy.testing.fakes import fake_lm

# Each label has its own words; a sample mixes two of them with filler, so the task is learnable, not trivial.
WORDS = {"sad": ["cried", "funeral", "miss"], "joyful": ["party", "won", "laughed"],
         "afraid": ["spider", "dark", "scream"], "proud": ["graduated", "award", "daughter"]}
FILLER = ["today", "really", "my", "the", "was", "so", "and", "we"]


def fake_encode(texts):
    """A deterministic 16-dim bag of hashed words, unit length (stands in for MiniLM)."""
    out = np.zeros((len(texts), 16), np.float32)
    for row, text in enumerate(texts):
        for w in ep.words(text):
            out[row, int(hashlib.md5(w.encode()).hexdigest(), 16) % 16] += 1
    return out / (np.linalg.norm(out, axis=1, keepdims=True) + 1e-9)


def corpus(n, seed):
    rng = np.random.default_rng(seed)
    labels, texts = [], []
    for i in range(n):
        label = list(WORDS)[i % len(WORDS)]
        picked = list(rng.choice(WORDS[label], 2)) + list(rng.choice(FILLER, 4))
        rng.shuffle(picked)
        texts.append(" ".join(picked))
        labels.append(label)
    return texts, labels


@pytest.fixture(scope="module")
def prior():
    (tt, tl), (dt, dl) = corpus(240, 0), corpus(40, 1)
    return fit_prior(TrainingSet.of(tt, tl), dt, dl, fake_encode, meta={"data_fingerprint": "sha256:test"})


def test_the_fit_learns_and_records_its_dev_accuracy(prior):
    assert prior.labels == ("afraid", "joyful", "proud", "sad")  # only labels seen in training, in label order
    assert prior.meta["dev_accuracy"] >= 0.9 and prior.meta["train_samples"] == 240
    assert prior.meta["data_fingerprint"] == "sha256:test"
    top = prior.candidates("Speaker: we went to the funeral and I cried", 2, fake_encode)
    assert top[0][0] == "sad" and top[0][1] > top[1][1] and len(top) == 2
    assert abs(sum(prior.proba_texts(["party"], fake_encode)[0]) - 1) < 1e-5


def test_too_little_data_is_refused_by_name():
    texts, labels = corpus(50, 0)
    with pytest.raises(PriorError, match="at least 200"):
        fit_prior(TrainingSet.of(texts, labels), texts[:5], labels[:5], fake_encode)


def test_the_prior_round_trips_without_pickle(prior, tmp_path):
    path = prior.save(tmp_path / ep.FILE_NAME)
    with zipfile.ZipFile(path) as zf:  # every member is a plain numeric array: nothing to unpickle
        for name in zf.namelist():
            with zf.open(name) as fh:
                header = np.lib.format.read_magic(fh) and np.lib.format.read_array_header_1_0(fh)
                assert header[2] != np.dtype(object)
    again = EmotionPrior.load(path)
    assert again.labels == prior.labels and again.vocab == prior.vocab
    assert np.array_equal(again.weights, prior.weights) and again.meta["dev_accuracy"] == prior.meta["dev_accuracy"]
    text = ["my daughter graduated"]
    assert np.allclose(again.proba_texts(text, fake_encode), prior.proba_texts(text, fake_encode))


def test_damaged_or_foreign_files_are_refused(prior, tmp_path):
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"not a zip")
    with pytest.raises(PriorError, match="damaged"):
        EmotionPrior.load(bad)
    np.savez(tmp_path / "shapes.npz", idf=np.ones(3), weights=np.ones((2, 2)), bias=np.ones(2),
             header=np.frombuffer(json.dumps({"feature_version": ep.FEATURE_VERSION, "labels": ["sad", "proud"],
                                              "vocab": ["a"]}).encode(), np.uint8))
    with pytest.raises(PriorError, match="shapes"):
        EmotionPrior.load(tmp_path / "shapes.npz")


def test_candidate_list_format_is_what_the_grammar_reads():
    text = format_candidates([("sad", 0.412), ("lonely", 0.2)])
    assert text == "sad (41%), lonely (20%)"
    user = f"[[ ## dialogue ## ]]\nSpeaker: hi\n\n[[ ## emotion_candidates ## ]]\n{text}\n\n"
    assert listed_choices(user, "emotion_candidates") == ["sad", "lonely"]


def test_config_switch_is_checked():
    assert ProgramConfig().prior_k == "auto"
    with pytest.raises(ConfigError, match="prior_k"):
        ProgramConfig(prior_k=9)
    with pytest.raises(ConfigError, match="prior_k"):
        ProgramConfig(prior_k="most")
    with pytest.raises(ConfigError, match="prior_k"):
        ProgramConfig(prior_k=True)
    off = TraceProgram(ProgramConfig(prior_k=0))
    assert "emotion_candidates" not in off.recognize_emotion.signature.input_fields


def test_the_candidates_field_exists_only_while_a_prior_is_attached(prior):
    program = TraceProgram(ProgramConfig())
    assert "emotion_candidates" not in program.recognize_emotion.signature.input_fields  # the prompt as before
    program.emotion_prior = prior
    assert "emotion_candidates" in program.recognize_emotion.signature.input_fields
    program.emotion_prior = None
    assert "emotion_candidates" not in program.recognize_emotion.signature.input_fields


def _program_with(prior, monkeypatch, k=2):
    monkeypatch.setattr(ep, "default_encoder", lambda: fake_encode)
    return TraceProgram(ProgramConfig(prior_k=k), emotion_prior=prior)


def test_candidates_reach_the_emotion_prompt(prior, monkeypatch):
    program = _program_with(prior, monkeypatch)
    lm, engine = fake_lm()
    with dspy.context(lm=lm):
        out = program(dialogue="Speaker: We went to the funeral today and I cried so much.")
    emotion_call = next(c for c in engine.calls if "emotion" in c.outputs)
    assert emotion_call.inputs["emotion_candidates"].startswith("sad (")
    assert len(listed_choices("[[ ## emotion_candidates ## ]]\n" + emotion_call.inputs["emotion_candidates"],
                              "emotion_candidates")) == 2
    assert out.emotion_path == "prior+lm (top 2)"


def test_constrained_grammar_allows_only_the_candidates():
    system = ("Your output fields are:\n1. `emotion` (Literal['afraid', 'joyful', 'proud', 'sad']): x\n"
              "Answer with each output field under its [[ ## name ## ]] header, in order, then [[ ## completed ## ]].")
    user = "[[ ## dialogue ## ]]\nSpeaker: hi\n\n[[ ## emotion_candidates ## ]]\nproud (50%), sad (30%)\n"
    grammar = grammar_for(system, user)
    assert '"proud"' in grammar and '"sad"' in grammar
    assert '"joyful"' not in grammar and '"afraid"' not in grammar
    # Candidates that are not labels of the field are ignored, never an empty choice.
    assert '"joyful"' in output_grammar(system, choices={"emotion": ["bogus"]})
    # Without candidates the whole label set stays allowed.
    assert '"joyful"' in grammar_for(system, "[[ ## dialogue ## ]]\nSpeaker: hi\n")


def test_without_a_prior_or_the_embed_extra_the_lm_decides_and_says_so(prior, monkeypatch):
    lm, engine = fake_lm()
    with dspy.context(lm=lm):
        out = TraceProgram(ProgramConfig()).forward("Speaker: I cried at the funeral.")
        assert out.emotion == "sad" and "no fitted emotion prior" in out.emotion_path

        def missing():
            raise PriorError(ep.MISSING_EMBED)

        monkeypatch.setattr(ep, "default_encoder", missing)
        out = TraceProgram(ProgramConfig(), emotion_prior=prior).forward("Speaker: I cried at the funeral.")
        assert out.emotion == "sad" and "embed" in out.emotion_path
    assert all(c.inputs.get("emotion_candidates", "") == "" for c in engine.calls if "emotion" in c.outputs)


def test_artifacts_carry_the_prior_and_old_ones_load_without(prior, tmp_path, monkeypatch):
    program = _program_with(prior, monkeypatch)
    from trace_dspy.lm.specs import LMConfig

    manifest = {"config": {"program": program.config.to_dict(), "lm": LMConfig().to_dict()},
                "emotion_prior": {"file": ep.FILE_NAME, **prior.describe()}}
    prior.save(tmp_path / ep.FILE_NAME)
    folder = save_artifact(program, manifest, root=tmp_path / "a", extra_files={ep.FILE_NAME: tmp_path / ep.FILE_NAME})
    loaded = trace_dspy.load(str(folder), attach_lms=False)
    assert loaded.emotion_prior is not None and loaded.emotion_prior.labels == prior.labels
    lm, engine = fake_lm()
    with dspy.context(lm=lm):
        assert loaded(dialogue="Speaker: I cried at the funeral.").emotion_path.startswith("prior+lm")
    # The manifest says there is a prior but the file is gone: refused by name, not silently dropped.
    (folder / ep.FILE_NAME).unlink()
    with pytest.raises(ArtifactError, match="emotion prior"):
        trace_dspy.load(str(folder), attach_lms=False)
    # An artifact from before the prior (no prior_k in its config) loads without the candidates field and runs.
    old = {"config": {"program": {k: v for k, v in ProgramConfig(prior_k=0).to_dict().items() if k != "prior_k"},
                      "lm": LMConfig().to_dict()}}
    old_folder = save_artifact(TraceProgram(ProgramConfig(prior_k=0)), old, root=tmp_path / "b")
    old_program = trace_dspy.load(str(old_folder), attach_lms=False)
    assert old_program.config.prior_k == 0
    assert "emotion_candidates" not in old_program.recognize_emotion.signature.input_fields
    with dspy.context(lm=lm):
        assert old_program(dialogue="Speaker: I cried.").emotion_path == "lm (prior off: prior_k = 0)"


def test_auto_k_lets_the_prior_decide_on_a_constrained_model_and_hints_elsewhere(prior, monkeypatch):
    from trace_dspy.lm.specs import GrammarLM
    from trace_dspy.testing.fakes import ScriptedEngine

    monkeypatch.setattr(ep, "default_encoder", lambda: fake_encode)
    program = TraceProgram(ProgramConfig(), emotion_prior=prior)  # prior_k = "auto"
    dialogue = "Speaker: We went to the funeral today and I cried so much."
    top = prior.candidates(dialogue, 1, fake_encode)[0][0]
    lm, engine = fake_lm()
    with dspy.context(lm=lm):  # a capable (unconstrained) LM: five candidates as a hint, and the LM decides
        out = program(dialogue=dialogue)
    (emotion_call,) = [c for c in engine.calls if "emotion" in c.outputs and "response" not in c.outputs]
    offered = emotion_call.inputs["emotion_candidates"].count("%")
    assert offered == min(5, len(prior.labels)) > 1 and out.emotion_path == "prior+lm (top 5)"
    # A grammar alone does not make the writer compact: still a hint.
    engine = ScriptedEngine(responder=lambda outputs, inputs: {"emotion": "joyful"} if "emotion" in outputs else {})
    grammar_lm = GrammarLM("fake/scripted", engine=engine, cache=False)
    with dspy.context(lm=grammar_lm):
        assert str(program.emotion_path()) == "prior+lm (top 5)"
    # The compact writer on a grammar-constrained model: the one candidate is the answer, and the emotion stage
    # makes no call (the later stages run on an LM without the grammar: the fake engine takes no grammar).
    program = TraceProgram(ProgramConfig(writer="compact", best_of=1), emotion_prior=prior,
                           stage_lms={"recognize_emotion": grammar_lm})
    lm, engine = fake_lm(lambda outputs, inputs: {"emotion": "joyful"} if "emotion" in outputs else {})
    with dspy.context(lm=lm):
        out = program(dialogue=dialogue)
    assert out.emotion == top and out.emotion_path.startswith("prior (top 1")
    assert out.emotion_candidates.count("%") == 1
    assert not [c for c in engine.calls if "emotion" in c.outputs and "response" not in c.outputs]
    assert any("cause_summary" in c.outputs for c in engine.calls)  # the later stages still ran
    # With a reasoning field the stage has more to write than the label: the LM is still asked.
    reasoning = TraceProgram(ProgramConfig(writer="compact", reasoning=("recognize_emotion",)), emotion_prior=prior)
    with dspy.context(lm=grammar_lm):
        assert str(reasoning.emotion_path()) == "prior+lm (top 1)"
