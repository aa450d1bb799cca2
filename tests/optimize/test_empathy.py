"""The learned empathy scorer, the metric parts built on it, and the collapse check."""

from __future__ import annotations

import logging

import dspy
import numpy as np
import pytest
from conftest import required
from trace_dspy.compact.guards import GUARDS
from trace_dspy.optimize.empathy import (
    NO_EMBED,
    WEIGHTS_FILE,
    EmpathyScorer,
    Head,
    ScorerError,
)
from trace_dspy.optimize.metric import (
    EmpathyMetric,
    MetricConfig,
    collapse_check,
    strategy_fit,
)

from trace_dspy import TraceProgram
from trace_dspy.testing.fakes import fake_lm
from trace_dspy.workflows.evaluation import evaluate_program

EX = dspy.Example(dialogue="Speaker: I failed my driving test again.", emotion="disappointed",
                  response="Oh no, what happened this time?").with_inputs("dialogue")


class FixedScorer:
    """Stands in for the learned scorer: fixed expected levels per reply."""

    def __init__(self, levels: dict[str, tuple[float, float, float]], default=(0.5, 0.5, 0.5)):
        self.table, self.default, self.calls = levels, default, []

    def score(self, seeker, reply):
        self.calls.append((seeker, reply))
        er, ip, ex = self.table.get(reply, self.default)
        return {"ER": er, "IP": ip, "EX": ex, "empathy": (er + ip + ex) / 6}


def free_metric(scorer, embedder=None, **weights) -> EmpathyMetric:
    base = {"emotion": 0.0, "similarity": 0.0, "rules": 0.0, "relevance": 0.0, "empathy": 0.5, "strategy_fit": 0.5}
    return EmpathyMetric(MetricConfig(**{**base, **weights}), embedder=embedder, scorer=scorer)


# ---------------------------------------------------------------- the shipped weights


def test_shipped_weights_load_without_pickle_and_name_their_data():
    head = Head.load(WEIGHTS_FILE)
    assert head.meta["data_fingerprint"].startswith("sha256:")
    assert head.weights.shape == (3, head.mean.shape[0], 3)
    for mech in ("ER", "IP", "EX", "sum"):
        assert -1 <= head.meta["dev_table"][mech]["spearman"] <= 1
    assert head.meta["dev_posts"] > 0 and head.meta["train_posts"] > 0
    assert "python -m trace_dspy.fit_empathy" in head.meta["command"]


def test_weights_that_need_pickle_or_are_damaged_are_refused(tmp_path):
    head = Head.load(WEIGHTS_FILE)
    pickled = tmp_path / "pickled.npz"
    np.savez(pickled, mean=np.array([object()], dtype=object), scale=head.scale, weights=head.weights,
             bias=head.bias, header=np.frombuffer(b"{}", dtype=np.uint8))
    with pytest.raises(ScorerError, match="damaged"):
        Head.load(pickled)
    torn = tmp_path / "torn.npz"
    torn.write_bytes(WEIGHTS_FILE.read_bytes()[:500])
    with pytest.raises(ScorerError, match="torn.npz"):
        Head.load(torn)
    with pytest.raises(ScorerError, match="fit_empathy"):
        Head.load(tmp_path / "absent.npz")
    copy = tmp_path / "copy.npz"
    head.meta["feature_version"] = 99
    head.save(copy)
    with pytest.raises(ScorerError, match="feature version"):
        Head.load(copy)


@pytest.fixture(scope="module")
def scorer():
    from trace_dspy.optimize.similarity import embedder_available

    if not embedder_available():
        required("the 'embed' extra is not installed")
    return EmpathyScorer()


def test_scorer_reproduces_the_recorded_probe_scores_offline(scorer, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    probes = scorer.meta["probes"]
    got = scorer.score_batch([p["seeker"] for p in probes], [p["reply"] for p in probes])
    for probe, row in zip(probes, got):
        assert [row["ER"], row["IP"], row["EX"]] == pytest.approx(probe["levels"], abs=1e-4)
        assert row["empathy"] == pytest.approx(sum(probe["levels"]) / 6, abs=1e-4)
        assert all(0 <= row[m] <= 2 for m in ("ER", "IP", "EX"))
    single = scorer.score(probes[0]["seeker"], probes[0]["reply"])
    assert single == pytest.approx(got[0])


def test_scorer_tells_the_mechanisms_apart(scorer):
    post = "My dog died yesterday and the house feels empty."
    asks = scorer.score(post, "What was he like? How are you holding up?")
    warm = scorer.score(post, "I'm so sorry for your loss, that is heartbreaking.")
    flat = scorer.score(post, "The bus leaves at five.")
    assert asks["EX"] > warm["EX"] + 0.3 and asks["EX"] > flat["EX"] + 0.3
    assert warm["ER"] > flat["ER"] + 0.3
    assert flat["empathy"] < min(asks["empathy"], warm["empathy"])


@pytest.mark.slow
def test_refit_reproduces_the_recorded_subset_table(scorer, epitome_dir, capsys):
    from trace_dspy.cli import fit_empathy

    limit = str(scorer.meta["reproduce"]["limit"])
    assert fit_empathy.main(["--epitome", str(epitome_dir), "--limit", limit, "--check"]) == 0
    out = capsys.readouterr().out
    assert "matches" in out and "| EX |" in out
    # A check against a table that differs must fail.
    assert fit_empathy.main(["--epitome", str(epitome_dir), "--limit", limit, "--check", "--seed", "1"]) == 1


def test_epitome_errors_name_the_problem(tmp_path, capsys):
    from trace_dspy.cli import fit_empathy
    from trace_dspy.data.epitome import EpitomeError, load_epitome

    with pytest.raises(EpitomeError, match="lacks"):
        load_epitome(tmp_path)
    header = "sp_id,rp_id,seeker_post,response_post,level,rationales\n"
    for name in ("emotional-reactions-reddit.csv", "interpretations-reddit.csv", "explorations-reddit.csv"):
        (tmp_path / name).write_text(header + "a,b,post,reply,1,\n")
    (tmp_path / "explorations-reddit.csv").write_text(header + "a,b,post,reply,3,\n")
    with pytest.raises(EpitomeError, match=r"explorations-reddit.csv:2: level must be 0, 1 or 2"):
        load_epitome(tmp_path)
    assert fit_empathy.main(["--epitome", str(tmp_path)]) == 2
    assert "level must be" in capsys.readouterr().err


# ---------------------------------------------------------------- metric components


def test_strategy_fit_rewards_the_planned_mechanism():
    levels = {"ER": 0.2, "IP": 0.3, "EX": 1.8}
    assert strategy_fit(levels, "EX", "ER") == pytest.approx(0.6 * 0.9 + 0.2 * 0.1 + 0.2)
    assert strategy_fit(levels, "ER", "EX") < 0.3 < strategy_fit(levels, "EX", "ER")
    assert strategy_fit(levels, "EX", "EX") == pytest.approx(0.8 * 0.9 + 0.2)
    assert strategy_fit(levels, None, None) is None


def test_gepa_feedback_names_the_missing_mechanism_per_stage():
    flat = "That is a test result."
    m = free_metric(FixedScorer({flat: (1.2, 0.9, 0.05)}))
    pred = dspy.Prediction(emotion="disappointed", response=flat, strategy="EX", secondary_strategy="ER")
    for stage in ("generate_response", "plan_strategy"):
        feedback = m(EX, pred, None, stage, []).feedback
        assert "The plan said EX but the reply asks nothing" in feedback
        assert "plan said ER" not in feedback  # ER is there (1.2)
    assert "plan said" not in m(EX, pred, None, "recognize_emotion", []).feedback
    asks = "Oh no, what went wrong on the test?"
    m2 = free_metric(FixedScorer({asks: (1.2, 0.9, 1.9)}))
    good = dspy.Prediction(emotion="disappointed", response=asks, strategy="EX", secondary_strategy="ER")
    assert m2(EX, good) > m(EX, pred)
    assert "plan said" not in m2(EX, good, None, "generate_response", []).feedback


def test_copied_and_parroted_replies_score_zero():
    demo = "A guy kicked his beagle because it didn't come when he called it."
    own = "Failing the driving test again must sting, what happened this time?"
    scorer = FixedScorer({}, default=(1.5, 1.5, 1.5))
    m = free_metric(scorer, rules=0.2)
    m.add_copy_sources([demo])
    base = dict(emotion="disappointed", strategy="ER", secondary_strategy="EX")
    assert m(EX, dspy.Prediction(response=own, **base)) > 0.5
    copied = m.evaluate(EX, dspy.Prediction(response=demo.lower(), **base))
    assert copied.score == 0 and copied.components["grounded"] == 0 and "copies an example" in copied.feedback
    exemplar = "Speaker: My cat is sick.\nListener (reply): Oh no, is she going to be okay?"
    from_exemplar = m.evaluate(EX, dspy.Prediction(response="oh no , is she going to be okay ?",
                                                   exemplars=[exemplar], **base))
    assert from_exemplar.score == 0 and "copied" in from_exemplar.details
    for parrot in ("I failed my driving test again.", "Speaker: I failed my driving test again!"):
        scored = m.evaluate(EX, dspy.Prediction(response=parrot, **base))
        assert scored.score == 0 and "repeats the speaker" in scored.feedback
    # With the reply guards (the reply reward), the listener's own earlier reply is a copy source: saying it
    # again is no answer. The evaluation metric leaves it out (a few human listeners repeat a question).
    earlier = "That's a lovely story about your sister. She must be so happy."
    talk = dspy.Example(dialogue=f"Speaker: My sister got engaged!\nListener: {earlier}\nSpeaker: He proposed at the lake.",
                        emotion="joyful")
    repeat = dspy.Prediction(response="That's a wonderful story about your sister. She must be so happy.", **base)
    assert m(talk, repeat) > 0.5
    guarded = free_metric(scorer, rules=0.2)
    guarded.guards = GUARDS
    again = guarded.evaluate(talk, repeat)
    assert again.score == 0 and again.details["repeats_listener"] and "listener said before" in again.feedback
    assert guarded(talk, dspy.Prediction(response="At the lake where they met? That is so romantic.", **base)) > 0.5
    # "your dog" to the neighbour's dog: the guards zero it and say whose it is; the evaluation metric does not.
    barking = dspy.Example(dialogue="Speaker: My neighbor's dog keeps barking all night.", emotion="annoyed")
    theirs = dspy.Prediction(response="That sounds exhausting. How are you feeling about your dog?", **base)
    wrong = guarded.evaluate(barking, theirs)
    assert wrong.score == 0 and wrong.details["takes_theirs"] == "your dog" and "someone else's" in wrong.feedback
    assert m(barking, theirs) > 0.5


class FakeEmbedder:
    """Cosine 0.05 for replies containing 'weather', 0.6 otherwise."""

    def similarity(self, a, b):
        return 0.05 if "weather" in a + b else 0.6


def test_unrelated_replies_are_scaled_down_by_relevance():
    m = free_metric(FixedScorer({}, default=(1.5, 1.5, 1.5)), embedder=FakeEmbedder())
    base = dict(emotion="disappointed", strategy="ER", secondary_strategy="EX")
    on_topic = m.evaluate(EX, dspy.Prediction(response="That test sounds so frustrating.", **base))
    off_topic = m.evaluate(EX, dspy.Prediction(response="The weather is lovely today.", **base))
    assert on_topic.components["grounded"] == 1.0
    floor = m.config.relevance_floor
    assert off_topic.components["grounded"] == pytest.approx(0.05 / floor)
    assert off_topic.score == pytest.approx(on_topic.score * 0.05 / floor)
    assert "not about what the speaker said" in off_topic.feedback


def test_without_the_embed_extra_the_empathy_parts_are_off_and_said_so(monkeypatch, caplog):
    import trace_dspy.core.console as console
    import trace_dspy.optimize.empathy as empathy

    monkeypatch.setattr(empathy, "shared_scorer", lambda: None)
    monkeypatch.setattr(console, "_WARNED", set())
    with caplog.at_level(logging.WARNING):
        m1 = EmpathyMetric(embedder=None)
        EmpathyMetric(embedder=None)
    assert [r.getMessage() for r in caplog.records].count(NO_EMBED) == 1
    scored = m1.evaluate(EX, dspy.Prediction(emotion="disappointed", response="Oh no, the test again?",
                                             strategy="EX"))
    assert scored.components["empathy"] is None and scored.components["strategy_fit"] is None
    assert scored.details["empathy_kind"] == "off" and 0 < scored.score <= 1


# ---------------------------------------------------------------- collapse


def test_collapse_check_flags_few_distinct_replies_and_a_dist2_drop():
    varied = [f"Oh no, the {w} again? That sounds hard." for w in ("test", "car", "exam", "job", "rain")]
    assert collapse_check(varied)["collapsed"] is False
    same = collapse_check(["A beagle, a beagle."] * 4 + ["Oh no."])
    assert same["collapsed"] is True and "distinct" in same["collapse_reason"]
    assert collapse_check(varied, reference_dist2=200.0)["collapsed"] is True
    assert collapse_check([])["collapsed"] is False


def examples(n):
    topics = ("driving test", "lost wallet", "new puppy", "broken phone", "late train", "job offer")
    return [dspy.Example(dialogue=f"Speaker: Today my {topics[i % 6]} story number {i} happened.",
                         emotion="surprised", response=f"Wow, the {topics[i % 6]}? What happened?",
                         sample_id=f"s{i}", conversation_id=f"c{i}").with_inputs("dialogue") for i in range(n)]


def test_a_constant_reply_program_scores_below_a_diverse_one_and_is_flagged(scorer):
    def diverse(outputs, inputs):
        if "response" in outputs:
            topic = inputs["dialogue"].split("my ", 1)[1].split(" story")[0]
            return {"response": f"Oh wow, your {topic}! How did that feel?"}
        return {}

    def constant(outputs, inputs):
        return {"response": "A guy kicked his beagle because it didn't come when he called it."} \
            if "response" in outputs else {}

    metric = EmpathyMetric()
    lm_d, _ = fake_lm(diverse)
    lm_c, _ = fake_lm(constant)
    good = evaluate_program(TraceProgram(), examples(6), metric, lm=lm_d)
    bad = evaluate_program(TraceProgram(), examples(6), metric, lm=lm_c,
                           reference_dist2=good.summary["dist2"])
    assert good.summary["collapsed"] is False and bad.summary["collapsed"] is True
    assert bad.score < good.score - 0.1
    assert good.summary["empathy_learned"] > bad.summary["empathy_learned"]


def test_validity_search_ranks_weights_by_the_nearer_target():
    from trace_dspy.bench import validity as mv

    def row(emp, rel, rules, grounded=1.0):
        return {"empathy": emp, "relevance": rel, "rules": rules, "grounded": grounded}

    # On ED, relevance separates gold from every negative; empathy does not.
    ed = {"gold": [row(0.3, 0.6 + i / 100, 1.0) for i in range(10)]}
    for neg in mv.NEGATIVES:
        ed[neg] = [row(0.5, 0.2 + i / 100, 1.0, 0.0 if neg in ("parroted", "copied") else 1.0) for i in range(10)]
    # On EPITOME, empathy follows the human sum; relevance is noise.
    human = list(range(10))
    ep_rows = [row(h / 10, (h * 7 % 10) / 10, 0.5) for h in human]
    results = mv.search_weights(ed, ep_rows, human)
    best = results[0]
    reaching = [r for r in results if r["worst_auc"] >= 0.90]
    assert reaching and best["worst_auc"] >= 0.90
    assert best["epitome_sum_spearman"] == max(r["epitome_sum_spearman"] for r in reaching)
    # Empathy alone, with a floor the negatives clear, cannot tell the replies apart.
    only_empathy = next(r for r in results if r["weights"]["empathy"] == pytest.approx(1.0)
                        and r["relevance_floor"] == 0.2)
    assert only_empathy["auc_mismatched"] < 0.5 < best["auc_mismatched"]
    # Without a mix that reaches the AUC target, the nearer target decides.
    missing = sorted([{**r, "worst_auc": 0.5} for r in results[:5]], key=mv.rank_key)
    assert [r["objective"] for r in missing] == sorted((r["objective"] for r in missing), reverse=True)
    # Empathy carries the human agreement; relevance enters by its weight or by the gate.
    assert best["weights"]["empathy"] > 0
    assert best["weights"]["relevance"] > 0 or best["relevance_floor"] > 0.29
