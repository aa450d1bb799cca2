"""What a reply says and how it is cleaned (program.reply_text): the plan in words, the scaffold's openers (by
plan, tone band, history and variety), the first sentence and the question clause kept, and the cleaning."""

from __future__ import annotations

import pytest

from trace_dspy import ProgramConfig
from trace_dspy.core.config import ConfigError
from trace_dspy.compact.openers import (
    BAND_ACKNOWLEDGEMENTS,
    BAND_OPENERS,
    PLEASANT_AT_LEAST,
    SCAFFOLD_OPENERS,
    UNPLEASANT_AT_MOST,
    tone_band,
)
from trace_dspy.compact.reply_cue import ReplyCue
from trace_dspy.compact.reply_text import (
    clean_reply,
    first_sentence,
    opener_offset,
    openers_for,
    plan_in_words,
    scaffold_openers,
    tidy_text,
)
from trace_dspy.compact.reply_variety import RecentOpenings, opening

PLAN = {"strategy": "ER", "secondary_strategy": "EX"}


def test_a_same_mechanism_plan_is_asked_once():
    assert plan_in_words({"strategy": "EX", "secondary_strategy": "EX"}).count("question") == 1
    assert plan_in_words({}) == ""


@pytest.mark.parametrize(("raw", "clean"), [
    ("Listener: That sounds awful. Did anyone help you?", "That sounds awful. Did anyone help you?"),
    ('"I am sorry." \nSpeaker: thanks', "I am sorry."),
    ("I am so sorry. I am so sorry. I am so sorry. I am", "I am so sorry."),
    ("One. Two! Three? Four.", "One. Two!"),
    ("That is hard. That is hard. Are you okay?", "That is hard. Are you okay?"),
    # A clause said again inside the sentence: the repeat and its joiner go, the sentence ends cleanly.
    ("I'm so glad you got the job, and I'm so glad you got the job!", "I'm so glad you got the job."),
    ("You must be so proud of yourself, you must be so proud!", "You must be so proud of yourself."),
    ("That sounds awful. I am sorry, that sounds awful.", "That sounds awful. I am sorry, that sounds awful."),
])
def test_clean_reply(raw, clean):
    assert clean_reply(raw) == clean


@pytest.mark.parametrize(("raw", "clean"), [
    ("That is terrible. I hope you will get them.", "That is terrible."),  # a statement after: it goes
    ("That is awesome! What kind of update is it?", "That is awesome! What kind of update is it?"),
    ("What happened? I hope you are okay.", "What happened?"),
    ("Oh no, I am so sorry.", "Oh no, I am so sorry."),
    ("That is hard. That is hard. I hope it gets better.", "That is hard."),  # the repeat goes first
])
def test_clean_reply_keeping_a_second_sentence_only_where_it_asks(raw, clean):
    assert clean_reply(raw, "question") == clean
    assert clean_reply(raw) == clean_reply(raw, "any")


@pytest.mark.parametrize(("raw", "prose"), [
    ("i 'm so sorry . what was the dog 's name ?", "I'm so sorry. What was the dog's name?"),
    ("me neither , but i really did n't think so !", "Me neither, but I really didn't think so!"),
    ("I ca n't believe it. wow", "I can't believe it. Wow"),
    ("Is it in Hawaii? That sounds lovely.", "Is it in Hawaii? That sounds lovely."),
])
def test_tidy_text(raw, prose):
    assert tidy_text(raw) == prose


@pytest.mark.parametrize(("plan", "candidate", "openers"), [
    (("EX", "ER"), 0, ["That sounds", "How are you feeling"]),  # the question goes last
    (("IP", "EX"), 0, ["You must be feeling", "How are you feeling"]),
    (("ER", "IP"), 1, ["Oh, that is", "I can imagine how"]),  # a further candidate: the next openers
    (("IP", "IP"), 0, ["You must be feeling", "I can imagine how"]),  # one mechanism: two of its sentences
    (("EX", "EX"), 0, ["That sounds", "How are you feeling"]),  # questions only: acknowledge first
    ((None, None), 2, ["Oh, wow", "How are you"]),  # no plan (strategy stage off)
    (("ER", "EX"), 3, ["That sounds", "How are you feeling"]),  # the openers come round again
])
def test_scaffold_openers_follow_the_plan(plan, candidate, openers):
    assert scaffold_openers({"strategy": plan[0], "secondary_strategy": plan[1]}, candidate) == openers


@pytest.mark.parametrize(("text", "opener", "sentence"), [
    ("That sounds awful. And then", "That sounds", "That sounds awful."),
    ("It must be hard for him, it is a lot to take care of, and it is hard to be a", "It must be",
     "It must be hard for him."),  # cut off by the token limit: up to its first comma
    ("Oh, that is a lot to carry for one", "Oh, that is", "Oh, that is a lot to carry for one."),  # no comma after
    ("You must be feeling proud, right? Anyway", "You must be feeling", "You must be feeling proud, right?"),
])
def test_first_sentence(text, opener, sentence):
    assert first_sentence(text, opener) == sentence


def test_bands_follow_the_prior_pleasantness():
    assert tone_band(None) == "mixed"
    assert tone_band(UNPLEASANT_AT_MOST) == "unpleasant" and tone_band(UNPLEASANT_AT_MOST + 0.01) == "mixed"
    assert tone_band(PLEASANT_AT_LEAST) == "pleasant" and tone_band(PLEASANT_AT_LEAST - 0.01) == "mixed"
    assert ReplyCue(pleasant=0.05).band == "unpleasant" and ReplyCue().band == "mixed"
    # A band's acknowledgements are of one tone, and no two open alike (the history tells them apart by their
    # first two words).
    for band, table in BAND_OPENERS.items():
        assert set(table["ER"]) <= BAND_ACKNOWLEDGEMENTS
        assert len({opening(o) for o in table["ER"]}) == len(table["ER"])
    assert not set(BAND_OPENERS["pleasant"]["ER"]) & set(BAND_OPENERS["unpleasant"]["ER"])
    # Mixed keeps the stock openers; a sure band replaces the acknowledgement and the question, not IP.
    assert openers_for(PLAN, band="mixed") == SCAFFOLD_OPENERS
    sad = openers_for(PLAN, band="unpleasant")
    assert sad["ER"] == BAND_OPENERS["unpleasant"]["ER"] and sad["IP"] == SCAFFOLD_OPENERS["IP"]


def test_with_a_history_the_first_reply_takes_the_least_used_opener():
    table = openers_for(PLAN, band="unpleasant")
    message = {**PLAN, "dialogue": "Speaker: My bike was stolen."}
    first = scaffold_openers(message, 0, table)[0]  # no history: this message's place
    assert first in BAND_OPENERS["unpleasant"]["ER"]
    recent = RecentOpenings(8)
    recent.add(first + " How are you?")
    again = scaffold_openers(message, 0, table, recent=recent)[0]
    assert again != first  # the opening used last gives way
    # Over a batch of sad messages every acknowledgement gets its turn before one comes round again.
    recent, seen = RecentOpenings(20), []
    for i in range(len(BAND_OPENERS["unpleasant"]["ER"])):
        lead = scaffold_openers({**PLAN, "dialogue": f"Speaker: Bad news number {i}."}, 0, table, recent=recent)[0]
        seen.append(lead)
        recent.add(lead)
    assert sorted(seen) == sorted(BAND_OPENERS["unpleasant"]["ER"])
    # Model-continued openers rotate over the first ``variety`` only, history or not.
    stock = [scaffold_openers({**PLAN, "dialogue": f"Speaker: day {i}."}, 0, SCAFFOLD_OPENERS, 1, recent)[0]
             for i in range(10)]
    assert set(stock) == {"That sounds"}
    # Only the acknowledgement varies: an IP lead is always its best opener, history or not.
    leads = {scaffold_openers({"strategy": "IP", "secondary_strategy": "EX", "dialogue": f"Speaker: day {i}."}, 0,
                              SCAFFOLD_OPENERS, 3, recent)[0] for i in range(10)}
    assert leads == {SCAFFOLD_OPENERS["IP"][0]}
    assert RecentOpenings(3).least_used([]) == 0


def test_opener_variety_spreads_messages_over_the_best_openers_and_is_stable():
    plan = {"strategy": "ER", "secondary_strategy": "EX"}
    messages = [f"Speaker: Something happened to me on day {i}." for i in range(40)]
    # With a history that stays empty (each message the first of its batch), the message's place decides.
    firsts = [scaffold_openers({**plan, "dialogue": m}, 0, variety=3, recent=RecentOpenings())[0] for m in messages]
    assert set(firsts) == set(SCAFFOLD_OPENERS["ER"][:3])  # every one of the best three is used
    assert max(firsts.count(o) for o in set(firsts)) < 25  # and none takes most of them
    # The same message always gets the same opener (no per-process salt), and variety 1 is the best one.
    assert [opener_offset({"dialogue": m}, "ER", 3) for m in messages] == \
        [opener_offset({"dialogue": m}, "ER", 3) for m in messages]
    assert {scaffold_openers({**plan, "dialogue": m}, 0, variety=1)[0] for m in messages} == {"That sounds"}
    # Further candidates go on from the dialogue's opener, so they differ from the first.
    for m in messages[:5]:
        first, second = (scaffold_openers({**plan, "dialogue": m}, c, variety=3, recent=RecentOpenings())[0]
                         for c in (0, 1))
        assert first != second
    # Without a history (evaluations, compiles) the acknowledgement is the best opener, whatever the variety.
    assert {scaffold_openers({**plan, "dialogue": m}, 0, variety=3)[0] for m in messages} == {"That sounds"}
    with pytest.raises(ConfigError, match="opener_variety"):
        ProgramConfig(opener_variety=0)
