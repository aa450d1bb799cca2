"""Listener replies for the reply writer's fine-tuning: ED text cleaned into prose, the valid split alone read,
every conversation kept or counted as skipped, a seeded draw that is the same each time."""

from __future__ import annotations

import csv
import io
import json

import pytest

import trace_dspy.data.samples as samples_module
from trace_dspy.data.listener_replies import (
    MIN_REPLY_WORDS,
    before_after,
    clean_text,
    detokenize,
    listener_replies,
    reply_lengths,
    truecase,
)
from trace_dspy.data.samples import DataError
from trace_dspy.data.sources import resolve_source

MARKER = "zzmarkerfromthetestsplit"


def _write_ed(path, samples) -> None:
    """An ED-format CSV: one row per turn of each (dialogue_id, turns, emotion) sample."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["", "dialogue_id", "turns", "text", "emotion", "dialogue_emotion"])
    row = 0
    for did, texts, emotion in samples:
        for turn, text in enumerate(texts, 1):
            writer.writerow([row, did, turn, text, "neutral", emotion])
            row += 1
    path.write_text(out.getvalue(), encoding="utf-8")


def _simple(n: int, start: int = 1):
    """``n`` two-turn conversations with distinct openings and replies of several words."""
    return [(i, (f"my dog number {i} ran away .", f"oh no , did you find dog {i} ?"), "sad")
            for i in range(start, start + n)]


@pytest.mark.parametrize("raw, expected", [
    ("i 'm so sorry to hear that . did you call the police ?", "i'm so sorry to hear that. did you call the police?"),
    ("i have n't seen it _comma_ but she 's gon na love it !", "i haven't seen it, but she's gonna love it!"),
    ("we 're late , you 've said , they 'll go , he 'd know", "we're late, you've said, they'll go, he'd know"),
    ("no . . . that is long ! ! what ? ?", "no... that is long!! what??"),
    ("that ’ s a bummer", "that's a bummer"),
    ("it cost $ 100 ( or 50 % ) : wow ; ok", "it cost $100 (or 50%): wow; ok"),
    ("glad you are well ! : ) bye : (", "glad you are well! :) bye :("),
    ("my parents ' house", "my parents' house"),
    ("  spaced   out  ", "spaced out"),
    ("Already prose, isn't it? Yes: it's fine (really).", "Already prose, isn't it? Yes: it's fine (really)."),
])
def test_detokenize_joins_what_the_ed_tokenizer_split_and_keeps_case(raw, expected):
    assert detokenize(raw) == expected


@pytest.mark.parametrize("text, expected", [
    ("i'm so sorry. did you call the police?", "I'm so sorry. Did you call the police?"),
    ("it is what i said: i've, i'll, i'd. is it?", "It is what I said: I've, I'll, I'd. Is it?"),
    # "i" inside a word, a hyphenated word or a possessive is left alone
    ("it is in italy with wi-fi and i-95; this is his", "It is in italy with wi-fi and i-95; this is his"),
    ("wow!! really? yes... ok", "Wow!! Really? Yes... Ok"),
    # the closed list of names (no May, no March: they are also verbs); other words keep their case
    ("on friday in december, christmas! you may march on.", "On Friday in December, Christmas! You may march on."),
    ("my iPhone and NASA", "My iPhone and NASA"),
    ("\"i won\" she said", "\"I won\" she said"),
])
def test_truecase_capitalises_sentence_starts_the_pronoun_and_a_closed_list_only(text, expected):
    assert truecase(text) == expected


def test_clean_text_writes_ed_text_as_prose_and_is_stable_on_prose():
    raw = "i 'm so sorry to hear that . did you call the police ?"
    assert clean_text(raw) == "I'm so sorry to hear that. Did you call the police?"
    assert clean_text(clean_text(raw)) == clean_text(raw)
    assert clean_text("that is terrible _comma_ i would be furious") == "That is terrible, I would be furious"


def test_only_the_valid_split_is_read(tmp_path, monkeypatch):
    _write_ed(tmp_path / "valid.csv", _simple(3))
    # a test split that breaks any reader and carries a marker
    (tmp_path / "test.csv").write_text(f"not,an,ed,file\n{MARKER} {MARKER}\n\"unclosed", encoding="utf-8")
    opened = []

    class Spy(samples_module.TextLines):
        def __init__(self, path, *args, **kwargs):
            opened.append(str(path))
            super().__init__(path, *args, **kwargs)

    monkeypatch.setattr(samples_module, "TextLines", Spy)
    result = listener_replies(tmp_path)
    assert opened == [str(tmp_path / "valid.csv")]
    assert result.location == str(tmp_path / "valid.csv") and len(result) == 3
    assert MARKER not in repr([vars(r) for r in result])
    # a folder with no test split at all is fine (the loader of both splits would refuse it)
    (tmp_path / "test.csv").unlink()
    assert len(listener_replies(tmp_path)) == 3


def test_a_loaded_source_gives_its_pool_never_its_test_part(tmp_path):
    _write_ed(tmp_path / "valid.csv", _simple(2))
    _write_ed(tmp_path / "test.csv", [(900, (f"{MARKER} happened .", f"oh , {MARKER} indeed ."), "sad")])
    result = listener_replies(resolve_source(tmp_path))
    assert [r.conv_id for r in result] == ["valid:1", "valid:2"]
    assert MARKER not in repr([vars(r) for r in result])


def test_every_conversation_is_kept_or_counted_under_one_reason(tmp_path):
    convs = [
        (10, ("i lost my job .", "oh no , what happened ?", "they closed .", "that is awful ."), "sad"),
        (11, ("i lost my job .", "oh no , what happened ?"), "sad"),  # a prefix of 10: the same conversation
        (12, ("i won the lottery !", "congrats !"), "joyful"),  # one word
        (13, ("my cat is sick .", ". . ."), "sad"),  # no word
        (14, ("? ?", "what do you mean ?"), "sad"),  # the speaker says no word
        (15, ("my car broke .", "that is bad ."), "annoyed"),
        (16, ("my car broke .", "that is bad ."), "annoyed"),  # the same opening and reply again
    ]
    _write_ed(tmp_path / "valid.csv", convs)
    result = listener_replies(tmp_path)
    c = result.counts
    assert (c.conversations, c.kept, c.sampled) == (6, 2, 2)
    assert (c.empty_speaker, c.empty_reply, c.short_reply, c.duplicate) == (1, 1, 1, 1)
    assert c.conversations == c.kept + c.skipped and c.as_dict()["skipped"] == 4
    first, second = result.items
    # the first listener reply, not the conversation's last turn
    assert (first.conv_id, first.speaker, first.reply) == ("valid:10", "I lost my job.", "Oh no, what happened?")
    assert (first.raw_speaker, first.raw_reply, first.emotion) == ("i lost my job .", "oh no , what happened ?", "sad")
    assert first.situation is None and first.raw_situation is None  # the ED CSVs carry no situation
    assert second.conv_id == "valid:15" and all(r.reply_words >= MIN_REPLY_WORDS for r in result)


def test_conversations_come_in_numeric_id_order(tmp_path):
    _write_ed(tmp_path / "valid.csv", [*_simple(1, start=100), *_simple(1, start=9), *_simple(1, start=10)])
    assert [r.conv_id for r in listener_replies(tmp_path)] == ["valid:9", "valid:10", "valid:100"]


def test_a_limit_draws_the_same_sample_for_the_same_seed(tmp_path):
    _write_ed(tmp_path / "valid.csv", _simple(30))
    ids = lambda **kw: [r.conv_id for r in listener_replies(tmp_path, **kw)]  # noqa: E731
    drawn = ids(limit=5, seed=3)
    assert len(drawn) == 5 and drawn == ids(limit=5, seed=3)
    assert drawn == sorted(drawn, key=lambda c: int(c.split(":")[1]))
    assert ids(limit=5, seed=4) != drawn
    assert ids(limit=100) == ids() and len(ids()) == 30
    counts = listener_replies(tmp_path, limit=5, seed=3).counts
    assert (counts.kept, counts.sampled, counts.conversations) == (30, 5, 30)
    with pytest.raises(ValueError, match="non-negative"):
        listener_replies(tmp_path, limit=-1)


def test_a_jsonl_pool_gives_the_situation_cleaned_beside_the_raw_one(tmp_path):
    record = {"turns": ["i lost my job _comma_ sadly ."], "emotion": "sad", "reply": "i 'm sorry . what now ?",
              "conversation_id": "c1", "situation": "i got fired on monday"}
    (tmp_path / "valid.jsonl").write_text(json.dumps(record) + "\n", encoding="utf-8")
    (reply,) = listener_replies(tmp_path).items
    assert (reply.speaker, reply.reply) == ("I lost my job, sadly.", "I'm sorry. What now?")
    assert (reply.situation, reply.raw_situation) == ("I got fired on Monday", "i got fired on monday")


def test_data_mistakes_are_one_clear_error(tmp_path, monkeypatch):
    monkeypatch.delenv("TRACE_DSPY_DATA", raising=False)
    with pytest.raises(DataError, match="TRACE_DSPY_DATA"):
        listener_replies()
    with pytest.raises(DataError, match="no valid.csv or valid.jsonl"):
        listener_replies(tmp_path)
    _write_ed(tmp_path / "valid.csv", _simple(1))
    with pytest.raises(DataError, match="not a folder"):
        listener_replies(tmp_path / "valid.csv")
    with pytest.raises(DataError, match="resolve_source"):
        listener_replies("hf:some/dataset")
    monkeypatch.setenv("TRACE_DSPY_DATA", str(tmp_path))
    assert len(listener_replies()) == 1


def test_before_after_and_lengths_for_the_documentation(tmp_path):
    _write_ed(tmp_path / "valid.csv", _simple(12))
    result = listener_replies(tmp_path)
    pairs = before_after(result, 4, seed=1)
    assert len(pairs) == 4 and pairs == before_after(result, 4, seed=1)
    assert all(raw.startswith("oh no , did") and clean.startswith("Oh no, did") for raw, clean in pairs)
    assert before_after(result, 2, part="speaker")[0][1].startswith("My dog number")
    stats = reply_lengths(result)
    assert (stats["count"], stats["median"], stats["p90"]) == (12, 7, 7)
    assert reply_lengths([]) == {"count": 0}


def test_the_real_pool(ed_dir):
    result = listener_replies(ed_dir)
    c = result.counts
    assert result.location.endswith("valid.csv")
    assert (c.conversations, c.kept, c.short_reply, c.duplicate) == (2762, 2750, 12, 0)
    assert all(r.conv_id.startswith("valid:") for r in result)
    assert not any(" ." in r.reply or " n't" in r.reply or r.reply[0].islower() for r in result if r.reply[0].isalpha())
