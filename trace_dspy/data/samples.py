"""One item of data, and the error every reader raises.

A :class:`Sample` is the conversation so far (ending on the speaker) and the gold reply; the readers in
:mod:`trace_dspy.data.sources` and :mod:`trace_dspy.data.ed_csv` make them.
"""

from __future__ import annotations

import csv
import os
from dataclasses import dataclass

import dspy

from trace_dspy.core.dialogue import LISTENER, SPEAKER, Turn, render_dialogue
from trace_dspy.core.files import FileCheckError, MiB, TextLines

# Bounds on a data file read as text: the whole file, and one line of a CSV (a JSONL line has its own).
MAX_DATA_BYTES = 512 * MiB
MAX_CSV_LINE_BYTES = 1 * MiB


class DataError(ValueError):
    """A data source is missing or malformed; the message names file and line."""


def open_lines(path: str | os.PathLike, *, what: str = "data file", max_bytes: int = MAX_DATA_BYTES,
               max_line_bytes: int = MAX_CSV_LINE_BYTES, universal: bool = True) -> TextLines:
    """The checked, bounded lines of a data file (:class:`~trace_dspy.core.files.TextLines`; ``universal``
    line ends, as a CSV needs). A file that is missing, not a regular file (a FIFO, a device) or too large is
    a DataError naming it; ``what`` names the file in the "not found" message."""
    try:
        return TextLines(path, max_bytes=max_bytes, max_line_bytes=max_line_bytes, universal=universal)
    except FileCheckError as exc:
        if exc.missing:
            raise DataError(f"{path}: {what} not found") from None
        raise DataError(str(exc)) from None


def csv_columns(reader, path, columns, *, what: str = "file") -> tuple[list[str], list[int]]:
    """Read the header row of a ``csv.reader`` over ``path``: the header and the positions of ``columns``.

    An empty file, an unreadable header or a missing column is a DataError naming the file and line 1;
    ``what`` names the file in those messages.
    """
    try:
        header = next(reader)
    except StopIteration:
        raise DataError(f"{path}: {what} is empty") from None
    except FileCheckError as exc:  # a line too long or not UTF-8: the message names its line
        raise DataError(str(exc)) from None
    except (csv.Error, UnicodeDecodeError) as exc:
        raise DataError(f"{path}:1: cannot read the header: {exc}") from None
    missing = [c for c in columns if c not in header]
    if missing:
        raise DataError(f"{path}:1: header lacks column(s) {', '.join(missing)}; expected {','.join(columns)}, "
                        f"got {','.join(header)}")
    return header, [header.index(c) for c in columns]


def csv_rows(lines, path, columns, *, what: str = "file", strict: bool = False):
    """The rows of a CSV file as (line number, the values of ``columns``), blank lines skipped; ``lines`` are
    its text lines, as :func:`open_lines` reads them (``.text()``).

    A malformed row or one with a different number of fields than the header is a DataError naming the
    file and line; ``strict`` makes an unclosed quote one too instead of a field that runs to the end.
    """
    reader = csv.reader(lines, strict=strict)  # file-audit: parses lines that open_lines read (checked, bounded)
    header, at = csv_columns(reader, path, columns, what=what)
    while True:
        try:
            row = next(reader)
        except StopIteration:
            return
        except (csv.Error, UnicodeDecodeError) as exc:
            raise DataError(f"{path}:{reader.line_num}: malformed CSV: {exc}") from None
        except FileCheckError as exc:
            raise DataError(str(exc)) from None
        if not row:
            continue
        if len(row) != len(header):
            raise DataError(f"{path}:{reader.line_num}: expected {len(header)} fields, found {len(row)}")
        yield reader.line_num, [row[i] for i in at]


@dataclass(frozen=True)
class Sample:
    """One item: the conversation so far (ending on the speaker) and the gold reply."""

    sample_id: str
    conversation_id: str
    turns: tuple[str, ...]  # speaker first, alternating, ending on the speaker
    emotion: str
    response: str
    situation: str | None = None
    # Samples with the same split_key always land on the same side of a split.
    # It is coarser than conversation_id where the source has near-duplicates.
    split_key: str = ""

    def __post_init__(self) -> None:
        if not self.split_key:
            object.__setattr__(self, "split_key", self.conversation_id)

    @property
    def dialogue(self) -> str:
        n = len(self.turns)
        return render_dialogue(
            [Turn(SPEAKER if (n - 1 - i) % 2 == 0 else LISTENER, t) for i, t in enumerate(self.turns)]
        )

    def to_example(self) -> dspy.Example:
        """A ``dspy.Example`` with ``dialogue`` as its input and the labels beside it."""
        return dspy.Example(
            dialogue=self.dialogue,
            emotion=self.emotion,
            response=self.response,
            situation=self.situation,
            conversation_id=self.conversation_id,
            sample_id=self.sample_id,
        ).with_inputs("dialogue")


__all__ = ["DataError", "MAX_CSV_LINE_BYTES", "MAX_DATA_BYTES", "Sample", "open_lines"]
