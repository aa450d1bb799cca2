"""The tone head: its fit, its file (no pickle), the metric's tone parts and the reply reward's tone guard."""

from __future__ import annotations

import dspy
import numpy as np
import pytest
from trace_dspy.optimize.metric import EmpathyMetric, MetricConfig
from trace_dspy.optimize.tone import (
    WEIGHTS_FILE,
    ToneError,
    ToneHead,
    ToneScorer,
    agreement,
    fit_tone,
    soft_agreement,
)

from trace_dspy import ProgramConfig, TraceProgram
from trace_dspy.core.config import ConfigError
from trace_dspy.workflows.evaluation import summarize, tone_on_side

PLEASANT = ("great", "congratulations", "wonderful", "glad", "happy")


def fake_encode(texts):
    """Unit vectors: dimension 0 carries pleasant words, dimension 1 unpleasant ones, the rest the text's hash."""
    out = []
    for text in texts:
        words = text.lower().split()
        v = np.zeros(8)
        v[0] = sum(w.strip(".,!") in PLEASANT for w in words)
        v[1] = sum(w.strip(".,!") in ("sorry", "sad", "awful", "terrible", "lost") for w in words)
        rng = np.random.default_rng(abs(hash(text)) % 2**32)
        v[2:] = rng.normal(0, 0.3, 6)
        out.append(v / np.linalg.norm(v))
    return np.asarray(out)


def rows(n=120):
    out = []
    for i in range(n):
        pleasant = i % 2 == 0
        word = PLEASANT[i % 5] if pleasant else ("sorry", "sad", "awful", "terrible", "lost")[i % 5]
        out.append((f"conv{i // 2}", f"that is {word} news number {i}", int(pleasant)))
    return out


class KeywordTone:
    """A tone head stand-in: pleasant when the reply says 'great'."""

    meta = {"dev_table": {"auc": 1.0}}

    def pleasant(self, reply: str) -> float:
        return 0.95 if "great" in reply.lower() else 0.05


def test_the_fit_separates_tones_and_round_trips_without_pickle(tmp_path):
    fit = fit_tone(rows(), fake_encode, seed=0)
    assert fit.table["auc"] > 0.95 and fit.table["auc_swap"] > 0.9
    assert fit.table["mean_agreement_own"] > fit.table["mean_agreement_swapped"]
    path = fit.head.save(tmp_path / "tone.npz")
    loaded = ToneHead.load(path)
    r = fake_encode(["that is great news", "that is sad news"])
    assert np.allclose(loaded.proba(r), fit.head.proba(r))
    assert loaded.meta["dev_table"] == fit.table
    pickled = tmp_path / "pickled.npz"
    np.savez(pickled, w=np.array([object()], dtype=object), b=np.zeros(1),
             header=np.frombuffer(b"{}", dtype=np.uint8))
    with pytest.raises(ToneError, match="damaged"):
        ToneHead.load(pickled)
    with pytest.raises(ToneError, match="fit_tone"):
        ToneHead.load(tmp_path / "absent.npz")
    fit.head.meta["feature_version"] = 99
    fit.head.save(tmp_path / "v99.npz")
    with pytest.raises(ToneError, match="feature version"):
        ToneHead.load(tmp_path / "v99.npz")


def test_the_fit_refuses_data_without_both_tones():
    with pytest.raises(ValueError, match="both valences"):
        fit_tone([(f"c{i}", "that is great", 1) for i in range(40)], fake_encode)


def test_the_shipped_head_names_its_data_and_hears_the_probes():
    head = ToneHead.load(WEIGHTS_FILE)
    assert head.meta["data_fingerprint"].startswith("sha256:")
    assert "python -m trace_dspy.fit_tone" in head.meta["command"]
    assert head.meta["dev_table"]["auc"] > 0.75
    probes = {p["reply"]: p["p_pleasant"] for p in head.meta["probes"]}
    assert probes["Congratulations! How are you going to celebrate?"] > 0.5
    assert probes["Oh no, I'm so sorry. That must be so hard."] < 0.5
    scorer = ToneScorer(head, encode=lambda texts: np.zeros((len(texts), 3)))
    with pytest.raises(ToneError, match="384"):
        scorer.pleasant("hello")


def test_agreement_reads_the_valence():
    assert agreement(0.8, "positive") == pytest.approx(0.8)
    assert agreement(0.8, "negative") == pytest.approx(0.2)
    assert agreement(0.8, "any") is None


def metric(floor):
    return EmpathyMetric(MetricConfig(tone_floor=floor, similarity_kind="token_f1"), embedder=None, scorer=None,
                         relevance=None, tone=KeywordTone())


def test_a_wrong_tone_scales_the_score_only_with_a_floor():
    example = dspy.Example(dialogue="Speaker: My dog died yesterday.")
    right = dspy.Prediction(response="That is so sad about your dog. How are you holding up?", emotion="sad")
    wrong = dspy.Prediction(response="That is so great about your dog. How are you holding up?", emotion="sad")
    off = metric(0.0)
    assert off.evaluate(example, wrong).components["tone"] == pytest.approx(0.05)
    assert off.evaluate(example, wrong).score == pytest.approx(off.evaluate(example, right).score)
    on = metric(0.5)
    assert on.evaluate(example, wrong).score == pytest.approx(on.evaluate(example, right).score * 0.1)
    # No emotion, no valence: nothing to disagree with.
    assert on.evaluate(example, dspy.Prediction(response=wrong.response)).components["tone"] is None
    with pytest.raises(ConfigError, match="tone_floor"):
        EmpathyMetric(MetricConfig(tone_floor=0.5), embedder=None, scorer=None, relevance=None, tone=None)


def test_a_candidate_with_the_wrong_tone_loses_to_one_with_the_right_tone(monkeypatch):
    """Through the program's reply reward and its Best-of-N: the LM's first reply cheers at bad news."""
    from trace_dspy.optimize import tone
    from trace_dspy.testing.fakes import fake_lm

    monkeypatch.setattr(tone, "shared_tone", lambda: KeywordTone())
    results = {}
    for floor in (0.5, 0.0):
        replies = iter(["That is great, your dog! How are you doing?", "That is sad, your dog. How are you doing?"])
        lm, _ = fake_lm(response=lambda inputs: next(replies), emotion="sad")
        # The compact writer's reward guards the tone; the fields layout lets the fake LM answer reply by reply.
        program = TraceProgram(ProgramConfig(writer="compact", reply_format="fields", best_of=2,
                                             best_of_threshold=1.0, tone_floor=floor))
        with dspy.context(lm=lm):
            results[floor] = program(dialogue="Speaker: My dog died yesterday.", exemplars=[])
    guarded, unguarded = results[0.5], results[0.0]
    assert "sad" in guarded.response
    assert guarded.reply_rewards[0] == pytest.approx(unguarded.reply_rewards[0] * 0.1)  # agreement 0.05 / floor 0.5
    assert guarded.reply_rewards[1] == pytest.approx(unguarded.reply_rewards[1])
    with pytest.raises(ConfigError, match="tone_floor"):
        ProgramConfig(tone_floor=2)


def test_the_summary_reports_tone_agreement_against_the_gold_emotion():
    ok = {"score": 0.5, "components": {"tone": 0.9}, "prediction": {"response": "Great!"}}
    rows = [{**ok, "gold_emotion": "joyful", "tone_pleasant": 0.9},
            {**ok, "gold_emotion": "sad", "tone_pleasant": 0.9},
            {**ok, "gold_emotion": "sad", "tone_pleasant": 0.2},
            {**ok, "gold_emotion": None, "tone_pleasant": 0.2}]
    assert [tone_on_side(r) for r in rows] == [1.0, 0.0, 1.0, None]
    summary = summarize(rows)
    assert summary["tone_agreement"] == pytest.approx(2 / 3)
    assert summary["tone"] == pytest.approx(0.9)


def test_an_uncertain_situation_makes_no_tone_wrong():
    """With the situation's pleasantness (the reply reward passes the prior's), agreement is the chance reply and
    situation are on the same side: a cheerful reply to a situation the prior cannot place is not penalised."""
    assert soft_agreement(0.95, 0.5) == pytest.approx(0.5)
    assert soft_agreement(0.95, 0.05) == pytest.approx(0.95 * 0.05 + 0.05 * 0.95)
    example = dspy.Example(dialogue="Speaker: My tomatoes finally came up.")
    cheerful = dspy.Prediction(response="Your tomatoes finally came up, that is so great!", emotion="annoyed")
    hard, soft = metric(0.5), metric(0.5)
    assert hard.evaluate(example, cheerful).components["tone"] == pytest.approx(0.05)  # the label's valence
    unsure = dspy.Prediction(**cheerful.toDict(), situation_pleasant=0.45)
    assert soft.evaluate(example, unsure).components["tone"] == pytest.approx(soft_agreement(0.95, 0.45))
    assert soft.evaluate(example, unsure).score > hard.evaluate(example, cheerful).score


def test_the_program_knows_how_pleasant_a_situation_is_and_a_copy_forgets_it():
    class Prior:
        def candidates(self, dialogue, k, encoder):
            return [("joyful", 0.5), ("proud", 0.2), ("sad", 0.3)]

    program = TraceProgram()
    program.emotion_prior = Prior()
    program._prior_encoder = object()
    assert program.situation_pleasant("Speaker: I got the job!") == pytest.approx(0.7)
    assert program._situations  # remembered
    assert program.deepcopy()._situations == {}
    program.emotion_prior = None  # another prior: read anew
    assert program.situation_pleasant("Speaker: I got the job!") is None


@pytest.mark.slow
def test_refit_reproduces_the_recorded_subset_table(ed_dir, capsys, tmp_path):
    from trace_dspy.cli import fit_tone

    limit = str(ToneHead.load(WEIGHTS_FILE).meta["reproduce"]["limit"])
    assert fit_tone.main(["--data", str(ed_dir), "--limit", limit, "--check"]) == 0
    assert "matches" in capsys.readouterr().out
    assert fit_tone.main(["--data", str(ed_dir), "--limit", limit, "--check", "--seed", "1"]) == 1
    # A refit to another file writes weights that load, and the seed set is refused with a clear message.
    assert fit_tone.main(["--data", str(ed_dir), "--limit", limit, "--output", str(tmp_path / "t.npz")]) == 0
    assert ToneHead.load(tmp_path / "t.npz").meta["limit"] == int(limit)
    assert fit_tone.main(["--data", str(ed_dir), "--limit", "50"]) != 0
    assert "at least 100" in capsys.readouterr().err
