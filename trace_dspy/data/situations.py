"""Labelled situation prompts: extra training text for the emotion prior.

EmpatheticDialogues speakers wrote a short situation before each conversation.
A CSV of those prompts with their conversations' emotion labels (header
``situation,emotion``; the ED train split has 17,797 of them) is four times more
labelled text than the valid pool the program otherwise learns from. The prior
fits on it beside the pool's dialogues; nothing else reads it, and it is never
a test set.

A situations file is named by ``--situations PATH`` (``compile`` and
``fit_prior``) or the environment variable ``TRACE_DSPY_SITUATIONS``;
``--situations none`` ignores the variable. Without either, the prior learns
from the dialogues alone.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from trace_dspy.core import env
from trace_dspy.core.files import MiB
from trace_dspy.core.labels import EMOTIONS
from trace_dspy.data.samples import MAX_CSV_LINE_BYTES, csv_rows, open_lines
from trace_dspy.data.sources import DataError, _fingerprint

SITUATIONS_ENV = env.SITUATIONS
NONE = "none"
COLUMNS = ("situation", "emotion")
# The ED train split's situations are 1.7 MB; a file far larger is not a situations file.
MAX_SITUATIONS_BYTES = 64 * MiB


@dataclass(frozen=True)
class Situations:
    """Situation texts and their emotion labels, read from one CSV file."""

    location: str
    texts: tuple[str, ...] = field(repr=False)
    labels: tuple[str, ...] = field(repr=False)
    fingerprint: str = ""

    def __len__(self) -> int:
        return len(self.texts)

    def describe(self) -> dict:
        return {"location": self.location, "fingerprint": self.fingerprint, "samples": len(self.texts)}


def read_situations(path: str | os.PathLike) -> Situations:
    """Read a situations CSV; a missing or malformed file is a DataError naming the file and line.

    Only a regular file of at most ``MAX_SITUATIONS_BYTES`` is read (a FIFO or a device is refused at once),
    its lines at most ``MAX_CSV_LINE_BYTES`` each; a spreadsheet's byte-order mark is dropped.
    """
    path = Path(path)
    texts: list[str] = []
    labels: list[str] = []
    with open_lines(path, what="situations file", max_bytes=MAX_SITUATIONS_BYTES,
                    max_line_bytes=MAX_CSV_LINE_BYTES) as lines:
        # strict: an unclosed quote is an error, not a field that runs to the end of the file
        for line, (text, emotion) in csv_rows(lines.text(), path, COLUMNS, what="the situations file",
                                              strict=True):
            text, emotion = text.strip(), emotion.strip()
            if not text:
                raise DataError(f"{path}:{line}: empty situation")
            if emotion not in EMOTIONS:
                raise DataError(f"{path}:{line}: unknown emotion {emotion!r} (expected one of the 32 ED labels)")
            texts.append(text)
            labels.append(emotion)
    if not texts:
        raise DataError(f"{path}: the situations file has a header but no rows")
    return Situations(str(path), tuple(texts), tuple(labels), _fingerprint([path]))


def resolve_situations(flag: str | os.PathLike | None = None) -> Situations | None:
    """The situations named by ``flag``, else by ``$TRACE_DSPY_SITUATIONS``; None when neither names a file.

    ``flag == "none"`` ignores the environment variable.
    """
    choice = str(flag) if flag is not None else env.text(env.SITUATIONS)
    if not choice or choice.lower() == NONE:
        return None
    return read_situations(choice)


__all__ = ["MAX_SITUATIONS_BYTES", "SITUATIONS_ENV", "Situations", "read_situations", "resolve_situations"]
