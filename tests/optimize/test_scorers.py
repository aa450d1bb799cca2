"""Pure scorers against values computed by hand."""

import math

import pytest
from trace_dspy.optimize.judge import judge_score, pairwise_rates
from trace_dspy.compact.guards import GUARDS, claims_their_own, echoed_span
from trace_dspy.optimize.scorers import (
    auc,
    bleu,
    distinct_n,
    distribution,
    ead_n,
    emotion_accuracy,
    emotion_credit,
    expectation_adjusted_distinct,
    gives_advice,
    group_accuracy,
    mean_length,
    response_rules,
    rouge_l,
    sentence_count,
    token_f1,
)


def test_emotion_accuracy_hand_computed():
    gold = ["sad", "angry", "proud", "afraid"]
    pred = ["sad", "furious", None, "afraid"]
    assert emotion_accuracy(gold, pred) == 0.5
    # furious and angry share the anger group; None stays wrong.
    assert group_accuracy(gold, pred) == 0.75


def test_group_accuracy_counts_unknown_predictions_as_wrong():
    assert group_accuracy(["sad", "sad"], ["lonely", "banana"]) == 0.5


def test_scorers_reject_mismatched_or_empty_input():
    with pytest.raises(ValueError, match="gold has 1"):
        emotion_accuracy(["sad"], [])
    with pytest.raises(ValueError, match="no items"):
        group_accuracy([], [])


def test_emotion_credit_and_distribution():
    assert emotion_credit("sad", "sad") == 1.0
    assert emotion_credit("sad", "lonely") == 0.5
    assert emotion_credit("sad", "lonely", group_credit=0.0) == 0.0
    assert emotion_credit("sad", "joyful") == 0.0
    assert emotion_credit("sad", None) == 0.0
    assert distribution(["ER", "ER", "EX", None]) == {"ER": 0.5, "EX": 0.25, "missing": 0.25}


def test_bleu_hand_computed():
    assert bleu(["the cat sat"], ["the cat sat"], 1) == pytest.approx(100.0)
    # All unigrams match; brevity penalty exp(1 - 3/2).
    assert bleu(["the cat sat"], ["the cat"], 1) == pytest.approx(100 * math.exp(-0.5))
    # Corpus level: 2 of 4 hypothesis unigrams match, no brevity penalty.
    assert bleu(["a b", "c d"], ["a x", "c y"], 1) == pytest.approx(50.0)
    with pytest.raises(ValueError):
        bleu(["a"], ["a"], 5)


def test_rouge_l_and_token_f1_hand_computed():
    assert rouge_l("a b c d", "a c d e") == pytest.approx(0.75)  # LCS a c d: P = R = 3/4
    assert rouge_l("a b", "c d") == 0.0 and rouge_l("", "a") == 0.0
    assert token_f1("a a b", "a b b") == pytest.approx(2 / 3)  # overlap 2, P = R = 2/3
    assert token_f1("a b", "c") == 0.0


def test_distinct_and_ead_hand_computed():
    assert distinct_n(["a b a", "a c"], 1) == pytest.approx(60.0)  # 3 distinct of 5
    assert distinct_n(["a b a", "a c"], 2) == pytest.approx(100.0)  # (a b) (b a) (a c)
    assert distinct_n([], 1) == 0.0
    # 2 distinct of 3 draws; expected distinct = 10 * (1 - 0.9**3) = 2.71.
    assert expectation_adjusted_distinct([1, 2, 1], 1, 10) == pytest.approx(2 / 2.71)
    assert expectation_adjusted_distinct([1, 2, 1], 2, 10) == pytest.approx(2 / (10 * (1 - 0.9 ** 2)))
    assert ead_n(["ha ha ha ha"], 1) < ead_n(["one two three four"], 1)
    assert mean_length(["a b c", "d"]) == 2.0


def test_response_rules():
    speaker = "I lost my keys at the beach."
    good = response_rules("Oh no, losing your keys at the beach sounds awful.", speaker)
    assert good == {"brief": True, "reuses_detail": True, "no_advice": True, "not_parroting": True}
    bad = response_rules("You should buy new ones. It's easy. Go now. Then relax.", speaker)
    assert bad == {"brief": False, "reuses_detail": False, "no_advice": False, "not_parroting": True}
    assert response_rules("I lost my keys at the beach.", speaker)["not_parroting"] is False
    # Speaking as the speaker: a first-person run of five or more of their words, even inside a longer reply.
    exam = "I can't sleep, I'm so nervous about my exam tomorrow."
    echo = "Oh no, I'm so nervous about my exam tomorrow too, I hope it goes well."
    assert response_rules(echo, exam, also_parrots=GUARDS.parrots)["not_parroting"] is False
    assert response_rules(echo, exam)["not_parroting"] is True  # the evaluation metric leaves the guards out
    assert echoed_span("Oh, I'm so nervous about my exam tomorrow too.", [exam])[:3] == ["i", "'m", "so"]
    # Reusing their words in the listener's own voice is not parroting.
    assert echoed_span("You must be so nervous about the exam tomorrow.", [exam]) is None
    assert response_rules("I hope your exam goes well; no wonder you are nervous.", exam, also_parrots=GUARDS.parrots)["not_parroting"]
    # "my grandma" back to a speaker who said "my grandma": the listener talks as the speaker.
    grandma = "My grandma is in the hospital."
    assert claims_their_own("My grandma, she's in the hospital. That's a sad story.", [grandma]) == "my grandma"
    assert response_rules("My grandma, she's in the hospital.", grandma, also_parrots=GUARDS.parrots)["not_parroting"] is False
    assert claims_their_own("I hope your grandma gets better soon.", [grandma]) is None
    assert claims_their_own("I love my job.", ["I got the job!!"]) is None  # the speaker never said "my job"
    # Later in the reply it is the listener's own story, which raters score as empathy.
    assert claims_their_own("I'm so sorry. I lost my grandma last year too.", [grandma]) is None
    # Calling the speaker by their own person: the listener speaks as the parent.
    son = "My son took his first steps today!"
    assert claims_their_own("Oh, that is so beautiful, and I'm so proud of you, my son.", [son]) == "my son"
    assert claims_their_own("I'm so proud of your son, my friend.", [son]) is None  # not theirs
    assert claims_their_own("I bet my son will walk soon too.", [son]) is None  # the listener's own son
    puzzle = "I finally finished the thousand-piece puzzle my grandma left me."
    assert claims_their_own("How are you feeling now, grandma?", [puzzle]) == "my grandma"
    assert claims_their_own("How are you feeling now, though?", [puzzle]) is None
    assert gives_advice("you should n't worry .") and gives_advice("Have you tried calling her?")
    assert not gives_advice("I hope you find them soon.")
    # "you must" guessing a feeling is an interpretation; "you must" telling what to do is advice.
    assert not gives_advice("You must be feeling so proud.") and not gives_advice("You must have been scared!")
    assert not gives_advice("you must feel let down .")
    assert gives_advice("You must call the bank today.") and gives_advice("you must have a plan for it.")
    assert sentence_count("Hi there. How are you? Fine") == 3


def test_auc_hand_computed():
    assert auc([0.9, 0.5], [0.5, 0.1]) == pytest.approx(3.5 / 4)  # one tie counts half
    assert auc([1, 1], [0, 0]) == 1.0 and auc([0], [1]) == 0.0
    with pytest.raises(ValueError):
        auc([], [1])


def test_judge_score_and_pairwise_rates():
    ratings = {"emotional_reaction": 2, "interpretation": 0, "exploration": 2, "relevance": 2, "fluency": 1}
    assert judge_score(ratings) == pytest.approx(0.5 + 0.25 + 0.125)
    assert judge_score(dict.fromkeys(ratings, 0)) == 0.0
    assert pairwise_rates(["win", "win", "tie", "loss"]) == {"win": 0.5, "tie": 0.25, "loss": 0.25}
    with pytest.raises(ValueError):
        pairwise_rates(["draw"])


def test_paired_bootstrap_ci():
    from trace_dspy.optimize.scorers import paired_bootstrap_ci

    assert paired_bootstrap_ci([0.5, 0.7], [0.5, 0.7]) == (0.0, 0.0, 0.0)
    # A constant shift has no spread: every resample gives the same difference.
    mean, low, high = paired_bootstrap_ci([0.6, 0.9, 0.2], [0.5, 0.8, 0.1])
    assert (mean, low, high) == pytest.approx((0.1, 0.1, 0.1))
    mean, low, high = paired_bootstrap_ci([1, 0, 1, 0, 1, 1], [0, 0, 0, 0, 0, 0], seed=3)
    assert mean == pytest.approx(4 / 6) and 0 < low < mean < high <= 1
    with pytest.raises(ValueError):
        paired_bootstrap_ci([1], [1, 2])
