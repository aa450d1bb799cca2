"""Text the output grammar leaves no choice about, so that the decoder can add it without asking the model.

Under a ``sections`` constraint most of a structured reply is fixed: the ``[[ ## name ## ]]`` headers, the
blank lines between fields, the closing ``[[ ## completed ## ]]``, the rest of a label once only one label
fits what was written, and the rest of a verbatim quote once only one quote does. Greedy decoding would
spend one forward pass per token of that text and could only pick it. ``Forcing`` says, for the text written
so far, what must come next; ``trace_dspy.lm.decoding`` reads it in one batch (as a prompt is read) and
skips the closing header altogether.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

from trace_dspy.lm.constraint import OutputConstraint, OutputField
from trace_dspy.lm.grammar import MAX_LIST_ITEMS, MAX_TEXT_CHARS

COMPLETED = "\n\n[[ ## completed ## ]]"
# A run of forced pieces is joined up to this many times in one step (each piece ends a field's part).
_MAX_PIECES = 64


def _header(index: int, name: str) -> str:
    return ("" if index == 0 else "\n\n") + f"[[ ## {name} ## ]]\n"


def _rest_of(options: list[str], written: str) -> str:
    """What all ``options`` that start with ``written`` share beyond it ("" when none or they part at once)."""
    matches = [o for o in options if o.startswith(written)]
    return os.path.commonprefix(matches)[len(written):] if matches else ""


@dataclass(frozen=True)
class Forcing:
    """The forced continuations of one call's grammar (same limits, quotes and labels as the grammar)."""

    constraint: OutputConstraint
    limits: dict[str, int] = field(default_factory=dict)
    quotes: dict[str, list[str]] = field(default_factory=dict)
    choices: dict[str, list[str]] = field(default_factory=dict)

    def next_text(self, text: str) -> tuple[str, bool]:
        """The text that must follow ``text``, and whether the reply is complete after it."""
        forced = ""
        for _ in range(_MAX_PIECES):
            piece = self._piece(text + forced)
            if not piece:
                break
            forced += piece
        return forced, (text + forced).endswith(COMPLETED)

    def _piece(self, text: str) -> str:
        if self.constraint.layout != "sections":
            return ""
        pos = 0
        for index, out in enumerate(self.constraint.fields):
            header, rest = _header(index, out.name), text[pos:]
            if not rest.startswith(header):
                return header[len(rest):] if header.startswith(rest) else ""
            pos += len(header)
            end, piece = self._value(out, text[pos:])
            if end is None:
                return piece
            pos += end
        rest = text[pos:]
        return COMPLETED[len(rest):] if COMPLETED.startswith(rest) else ""

    def _value(self, out: OutputField, rest: str) -> tuple[int | None, str]:
        """Where the value at the start of ``rest`` ends (None: not yet), else what must come next in it."""
        if "\n" in rest:  # no value holds a line break: it ended there
            return rest.index("\n"), ""
        if out.kind in ("label", "bool"):
            labels = list(out.labels) if out.kind == "label" else ["True", "False"]
            narrowed = [v for v in labels if v in set(self.choices.get(out.name) or ())]
            labels = narrowed or labels
            if rest in labels and sum(v.startswith(rest) for v in labels) == 1:
                return len(rest), ""
            return None, _rest_of(labels, rest)
        if out.kind == "text":
            return (len(rest), "") if len(rest) >= self.limits.get(out.name, MAX_TEXT_CHARS) else (None, "")
        if out.kind == "list":
            return self._list(out, rest)
        return None, ""  # numbers: free

    def _list(self, out: OutputField, rest: str) -> tuple[int | None, str]:
        """A JSON list of strings: ``[`` item (``, `` item)* ``]``, items quotes when the call has them."""
        if not rest:
            return None, '["'
        quotes = [json.dumps(q) for q in self.quotes.get(out.name) or ()]
        pos, items = 1, 0
        while True:
            item = rest[pos:]
            if not item:
                return None, '"'
            done = next((q for q in quotes if item.startswith(q)), None) if quotes else _closed_string(item)
            if done is None:
                return None, _rest_of(quotes, item) if quotes else ""
            pos, items = pos + len(done), items + 1
            after = rest[pos:]
            if after.startswith("]"):
                return pos + 1, ""
            if not after:
                return None, "]" if items >= MAX_LIST_ITEMS else ""
            if not after.startswith(", "):
                return None, " " if after == "," else ""
            pos += 2


def _closed_string(item: str) -> str | None:
    """A JSON string at the start of ``item`` once its closing quote is written (items hold no escapes)."""
    end = item.find('"', 1)
    return item[: end + 1] if end > 0 else None
