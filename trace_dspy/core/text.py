"""Sentences and loops in plain text: the one sentence splitter and the one loop detector of the package.

``sentence_spans`` cuts a text after each run of sentence marks (``.``, ``!``, ``?``); every other view of
sentences is read from those spans: ``sentences`` (the pieces as written), ``split_sentences`` (cut only
where whitespace follows the marks, the whitespace dropped), ``sentence_count``. ``loop_start`` finds where a
text starts saying again what it already said: a loop at its end (what greedy decoding of a small model
falls into), or the first run of words said again.
"""

from __future__ import annotations

import re
from typing import NamedTuple

MARKS = ".!?"
_PIECE = re.compile(r"[^.!?]*[.!?]+|[^.!?]+$")
_WORD = re.compile(r"[A-Za-z0-9']+")
_LETTER = re.compile(r"[a-zA-Z]")


class Sentence(NamedTuple):
    """Where one sentence runs in its text: ``end`` is after its marks, of which it has ``marks`` (0 for an
    unterminated last piece)."""

    start: int
    end: int
    marks: int


def sentence_spans(text: str) -> list[Sentence]:
    """The text cut after each run of sentence marks, the marks kept; the pieces join up to the whole text."""
    spans = []
    for m in _PIECE.finditer(text):
        piece = m.group(0)
        spans.append(Sentence(m.start(), m.end(), len(piece) - len(piece.rstrip(MARKS))))
    return spans


def sentences(text: str) -> list[str]:
    """The sentences as written: each with its marks (and the whitespace before it), the last one maybe
    unterminated."""
    return [text[s.start:s.end] for s in sentence_spans(text)]


def split_sentences(text: str) -> list[str]:
    """The text cut where whitespace follows sentence marks, the whitespace dropped ("e.g." or "3.5" stay
    whole). As ``re.split``: a text that ends in such whitespace gives a last empty piece."""
    parts: list[str] = []
    for s in sentence_spans(text):
        piece = text[s.start:s.end]
        stripped = piece.lstrip()
        if parts and stripped == piece:  # no whitespace after the marks: the same sentence goes on
            parts[-1] += piece
        else:
            parts.append(stripped if parts else piece)
    return parts or [text]


def sentence_count(text: str) -> int:
    """How many sentences of the text have a letter in them."""
    return sum(1 for s in sentences(text) if _LETTER.search(s))


def words(text: str) -> list[str]:
    """The words of a text: runs of letters, digits and apostrophes."""
    return _WORD.findall(text)


def loop_start(text: str, *, run: int | None = None) -> int | None:
    """Where ``text`` starts saying again what it already said (a character offset), or None.

    By default, a loop at the text's end: the same words said again straight after themselves (four words
    or more twice, or two or three words three times: "a beagle, a beagle, a beagle"), or a last sentence of
    three words or more said before. The text up to the offset says everything once.

    With ``run``, the first place anywhere where ``run`` words in a row are said again after themselves:
    "I'm so glad you got the job, and I'm so glad you got the job" starts again at the second "I'm".
    """
    found = list(_WORD.finditer(text))
    low = [m.group(0).lower() for m in found]
    if run is not None:
        seen: dict[tuple[str, ...], int] = {}
        for j in range(len(low) - run + 1):
            key = tuple(low[j:j + run])
            if key in seen and seen[key] + run <= j:
                return found[j].start()
            seen.setdefault(key, j)
        return None
    cut = _repeated_words(text, found, low)
    return cut if cut is not None else _repeated_sentence(text)


def _repeated_words(text: str, found: list, low: list[str]) -> int | None:
    n = len(low)
    for size in range(2, min(12, n // 2) + 1):
        copies = 2 if size >= 4 else 3
        if n < copies * size:
            continue
        tail = low[n - size:]
        if all(low[n - (c + 1) * size:n - c * size] == tail for c in range(1, copies)):
            cut = found[n - (copies - 1) * size].start()
            # End on the sentence that the loop interrupted rather than on its first words.
            stop = max(text.rfind(c, 0, cut) for c in MARKS)
            if stop > 0 and len(_WORD.findall(text[stop:cut])) < size:
                cut = stop + 1
            return cut
    return None


def _repeated_sentence(text: str) -> int | None:
    # Terminated sentences only, each up to its first mark: one that ends in "!!" or runs on unterminated is
    # not yet a repeat.
    ends = [(s.start, s.end - s.marks + 1) for s in sentence_spans(text) if s.marks and s.end - s.marks > s.start]
    if len(ends) < 2:
        return None
    said = [" ".join(_WORD.findall(text[a:b].lower())) for a, b in ends]
    last = said[-1]
    if len(last.split()) >= 3 and text[ends[-1][1]:].strip() == "" and last in said[:-1]:
        return ends[-1][0]
    return None
