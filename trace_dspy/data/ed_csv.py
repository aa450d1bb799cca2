"""The reader of the preprocessed EmpatheticDialogues CSVs (``valid.csv``, ``test.csv``).

One row per turn: rows with the same ``dialogue_id`` form one sample, whose last turn (a listener turn) is
the gold reply. Samples are prefixes of conversations; :func:`_ed_conversations` recovers the
conversations. Errors name the file and the line.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections import defaultdict
from pathlib import Path

from trace_dspy.core.console import warn_once
from trace_dspy.core.labels import EMOTIONS
from trace_dspy.data.samples import DataError, Sample, csv_rows, open_lines

log = logging.getLogger(__name__)

COLUMNS = ("dialogue_id", "turns", "text", "dialogue_emotion")
# (turn number, text, dialogue_emotion, line) of each row, by dialogue_id
Rows = dict[str, list[tuple[int, str, str, int]]]


def read_ed_csv(path: str | os.PathLike) -> list[Sample]:
    """Read a preprocessed EmpatheticDialogues CSV into samples.

    Rows with the same ``dialogue_id`` form one sample; its last turn (a
    listener turn) is the gold reply. Samples are grouped into conversations by
    their shared first turn.
    """
    path = Path(path)
    samples, disagreeing = _samples(path, _read_rows(path))
    if disagreeing:
        _warn_disagreeing(path, disagreeing)
    return _ed_conversations(samples, path.stem)


def _read_rows(path: Path) -> Rows:
    """The file's rows by dialogue_id, in the order the ids first appear; each row checked. The file is read
    through :func:`~trace_dspy.data.samples.open_lines` (a regular file, bounded in size and line length)."""
    rows: Rows = defaultdict(list)
    with open_lines(path) as lines:
        for line, values in csv_rows(lines.text(), path, COLUMNS):
            row = dict(zip(COLUMNS, values))
            did, text, emotion = row["dialogue_id"], row["text"], row["dialogue_emotion"]
            try:
                turn = int(row["turns"])
            except ValueError:
                raise DataError(f"{path}:{line}: turns must be an integer, got {row['turns']!r}") from None
            if not text.strip():
                raise DataError(f"{path}:{line}: empty text")
            rows[did].append((turn, text.strip(), emotion, line))
    return rows


def _samples(path: Path, rows: Rows) -> tuple[list[tuple[str, tuple[str, ...], str]], list[tuple[int, str, str]]]:
    """(dialogue_id, turn texts, emotion) of each sample, and the (line, label, first label) of each later row
    whose label disagrees with its sample's first row."""
    samples = []
    disagreeing: list[tuple[int, str, str]] = []
    for did, unsorted in rows.items():
        turns = sorted(unsorted)
        first_line = turns[0][3]
        numbers = [t[0] for t in turns]
        if numbers != list(range(1, len(turns) + 1)):
            raise DataError(f"{path}:{first_line}: sample {did} has turns {numbers}; expected 1..{len(turns)}")
        if len(turns) % 2:
            raise DataError(
                f"{path}:{turns[-1][3]}: sample {did} ends on a speaker turn; its last turn must be the listener's reply"
            )
        # The conversation's label is the one on its first turn. The published
        # test.csv has one later row whose label is glued to an utterance tag
        # ('surprisedacknowledging'); such disagreeing later rows are reported,
        # not fatal, because the first row already carries the label.
        emotion = turns[0][2]
        if emotion not in EMOTIONS:
            raise DataError(f"{path}:{first_line}: unknown dialogue_emotion {emotion!r}")
        disagreeing += [(t[3], t[2], emotion) for t in turns[1:] if t[2] != emotion]
        samples.append((did, tuple(t[1] for t in turns), emotion))
    return samples, disagreeing


def _warn_disagreeing(path: Path, disagreeing: list[tuple[int, str, str]]) -> None:
    """One warning per file and process (a file is read again for each split): a count and the first row."""
    stat = path.stat()
    line, label, first = disagreeing[0]
    more = f" ({len(disagreeing)} rows; the first shown)" if len(disagreeing) > 1 else ""
    warn_once(log, ("disagreeing labels", str(path.resolve()), stat.st_size, stat.st_mtime_ns),
              "%s:%d: dialogue_emotion %r differs from the sample's first row (%r); the first row's label is used%s",
              path, line, label, first, more)


def _ed_conversations(samples: list[tuple[str, tuple[str, ...], str]], stem: str) -> list[Sample]:
    """Recover conversations from prefix samples.

    Each sample is a prefix of a conversation ending on a listener turn. A
    conversation is a chain of samples each of which is a prefix of the
    longest one; the chains are found among samples that share a first turn.
    The first turn is also the split key, so near-duplicate conversations (the
    corpus has some with the same opening) never straddle a split.
    """
    by_first: dict[str, list[int]] = defaultdict(list)
    for i, (_, texts, _) in enumerate(samples):
        by_first[texts[0]].append(i)
    conv_of: dict[int, str] = {}
    for members in by_first.values():
        heads: list[int] = []
        for i in sorted(members, key=lambda i: -len(samples[i][1])):
            texts = samples[i][1]
            head = next((h for h in heads if len(samples[h][1]) > len(texts)
                         and samples[h][1][: len(texts)] == texts), None)
            if head is None:
                heads.append(i)
                head = i
            conv_of[i] = f"{stem}:{samples[head][0]}"
    out = []
    for i, (did, texts, emotion) in enumerate(samples):
        out.append(Sample(
            sample_id=f"{stem}:{did}",
            conversation_id=conv_of[i],
            turns=texts[:-1],
            emotion=emotion,
            response=texts[-1],
            split_key=f"{stem}:" + hashlib.sha1(texts[0].encode()).hexdigest()[:12],
        ))
    return out


__all__ = ["COLUMNS", "read_ed_csv"]
