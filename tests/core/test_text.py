"""The one sentence splitter and loop detector (trace_dspy.core.text) against the rules they replaced."""

from __future__ import annotations

import random
import re

import pytest

from trace_dspy.core.text import loop_start, sentence_count, sentences, split_sentences

# The rules as they were written before they shared one splitter, kept here as the reference.
_FINDALL = re.compile(r"[^.!?]*[.!?]+|[^.!?]+$")
_BREAK = re.compile(r"(?<=[.!?])\s+")
_BREAK_OR_LINE = re.compile(r"(?<=[.!?])\s+|\n+")
_COUNTED = re.compile(r"[^.!?]*[a-zA-Z][^.!?]*(?:[.!?]+|$)")
_TERMINATED = re.compile(r"[^.!?]+[.!?]")
_WORD = re.compile(r"[A-Za-z0-9']+")


def _old_repeated_tail(text):
    words = list(_WORD.finditer(text))
    low = [m.group(0).lower() for m in words]
    n = len(low)
    for size in range(2, min(12, n // 2) + 1):
        copies = 2 if size >= 4 else 3
        if n < copies * size:
            continue
        tail = low[n - size:]
        if all(low[n - (c + 1) * size:n - c * size] == tail for c in range(1, copies)):
            cut = words[n - (copies - 1) * size].start()
            stop = max(text.rfind(c, 0, cut) for c in ".!?")
            if stop > 0 and len(_WORD.findall(text[stop:cut])) < size:
                cut = stop + 1
            return cut
    found = list(_TERMINATED.finditer(text))
    if len(found) >= 2:
        last = " ".join(_WORD.findall(found[-1].group(0).lower()))
        if len(last.split()) >= 3 and text[found[-1].end():].strip() == "" and any(
                " ".join(_WORD.findall(s.group(0).lower())) == last for s in found[:-1]):
            return found[-1].start()
    return None


def _old_repeated_run(line, size=4):
    words = list(_WORD.finditer(line))
    low = [m.group(0).lower() for m in words]
    seen = {}
    for j in range(len(low) - size + 1):
        run = tuple(low[j:j + size])
        if run in seen and seen[run] + size <= j:
            return words[j].start()
        seen.setdefault(run, j)
    return None


def _texts(n=3000, seed=7):
    rng = random.Random(seed)
    pieces = ["I am so happy", "a beagle", "It", "the job", "ok", "3", "e.g", "Hi", " ", "  ", "\n", "\n\n",
              ".", "!", "?", "!!", "...", ",", " and", "'s", "\t"]
    out = ["", " ", ".", "Hi.There", "I am so happy. I am so happy", "I am so happy!! I am so happy!!",
           "A b c... A b c...", "Hi. ok\n", "Hi.\n", "x. ...Hi."]
    for _ in range(n):
        out.append("".join(rng.choice(pieces) for _ in range(rng.randint(1, 16))))
    return out


TEXTS = _texts()


def test_sentences_are_the_pieces_as_written():
    for text in TEXTS:
        assert sentences(text) == _FINDALL.findall(text), text
        assert "".join(sentences(text)) == text


def test_split_sentences_cuts_where_whitespace_follows_the_marks():
    for text in TEXTS:
        assert split_sentences(text) == _BREAK.split(text), text
        by_line = [s.strip() for line in text.split("\n") for s in split_sentences(line) if s.strip()]
        assert by_line == [s.strip() for s in _BREAK_OR_LINE.split(text) if s.strip()], text


def test_sentence_count_counts_sentences_with_letters():
    for text in TEXTS:
        assert sentence_count(text) == len([s for s in _COUNTED.findall(text) if s.strip()]), text


def test_the_loop_detector_finds_what_both_detectors_found():
    for text in TEXTS:
        assert loop_start(text) == _old_repeated_tail(text), text
        assert loop_start(text, run=4) == _old_repeated_run(text), text


@pytest.mark.parametrize(("text", "kept"), [
    ("I am so proud of them. I am so proud of them.", "I am so proud of them."),
    ("A beagle, a beagle, a beagle", "A beagle,"),
    ("It is a response to it. It is a response to it. It", "It is a response to it."),
])
def test_a_loop_at_the_end_is_cut_after_its_first_statement(text, kept):
    assert text[:loop_start(text)].strip() == kept


def test_a_repeated_run_of_words_is_found_anywhere():
    text = "I'm so glad you got the job, and I'm so glad you got the job"
    assert text[:loop_start(text, run=4)] == "I'm so glad you got the job, and "
    assert loop_start("That sounds hard, how are you holding up?", run=4) is None


@pytest.mark.parametrize(("text", "kept"), [
    ("I am so proud of them. I am so proud of them.", "I am so proud of them."),
    ("A beagle, a beagle, a beagle", "A beagle,"),
    ("The dog was a dog. The cat sat. The dog was a dog.", "The dog was a dog. The cat sat."),
    # The loop started mid-sentence: end on the sentence it interrupted.
    ("It is a response to it. It is a response to it. It", "It is a response to it."),
])
def test_loop_start_finds_where_a_loop_starts(text, kept):
    cut = loop_start(text)
    assert cut is not None and text[:cut].strip() == kept


@pytest.mark.parametrize("text", [
    "That sounds hard, how are you holding up?",
    "I am sorry. Sorry.",  # short sentences may echo
    "Very very good news, well done!",
    "",
])
def test_loop_start_leaves_ordinary_replies_alone(text):
    assert loop_start(text) is None
