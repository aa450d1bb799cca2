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
from trace_dspy.core.labels import EMOTIONS
from trace_dspy.data.samples import csv_rows
from trace_dspy.data.sources import DataError, _fingerprint

SITUATIONS_ENV = env.SITUATIONS
NONE = "none"
COLUMNS = ("situation", "emotion")


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
    """Read a situations CSV; a missing or malformed file is a DataError naming the file and line."""
    path = Path(path)
    try:
        fh = open(path, newline="", encoding="utf-8")
    except FileNotFoundError:
        raise DataError(f"{path}: situations file not found") from None
    except OSError as exc:
        raise DataError(f"{path}: cannot open the situations file: {exc.strerror}") from None
    texts: list[str] = []
    labels: list[str] = []
    with fh:
        # strict: an unclosed quote is an error, not a field that runs to the end of the file
        for line, (text, emotion) in csv_rows(fh, path, COLUMNS, what="the situations file", strict=True):
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


__all__ = ["SITUATIONS_ENV", "Situations", "read_situations", "resolve_situations"]
