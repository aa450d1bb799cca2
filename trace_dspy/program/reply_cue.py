"""What the reply stage knows besides its signature's inputs: the tone band of the speaker's situation and the
openings of the program's recent replies.

The program sets a ``ReplyCue`` around its reply stage (``reply_cue``); the scaffolded reply's adapter reads it
(``current_cue``) to choose its openers: an acknowledgement and a question in the situation's tone where the
emotion prior is sure of it (``trace_dspy.core.openers.BAND_OPENERS``), and, with a history of openings
(``respond``, ``chat``), the option recent replies used least. A context variable keeps it per thread and per
dialogue, so the adapter, shared between programs, holds no per-call state.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from trace_dspy.core.openers import tone_band
from trace_dspy.program.reply_variety import RecentOpenings


@dataclass(frozen=True)
class ReplyCue:
    """``pleasant``: the situation's pleasantness from the emotion prior (None: no prior); ``recent``: the
    program's history of openings (None: none kept, as in evaluations and compiles)."""

    pleasant: float | None = None
    recent: RecentOpenings | None = None

    @property
    def band(self) -> str:
        """"pleasant", "unpleasant" or "mixed" (``trace_dspy.core.openers.tone_band``)."""
        return tone_band(self.pleasant)


_CUE: contextvars.ContextVar[ReplyCue | None] = contextvars.ContextVar("trace_dspy_reply_cue", default=None)


@contextmanager
def reply_cue(cue: ReplyCue) -> Iterator[ReplyCue]:
    """Make ``cue`` the reply stage's for the block (restored after it, also on an error)."""
    token = _CUE.set(cue)
    try:
        yield cue
    finally:
        _CUE.reset(token)


def current_cue() -> ReplyCue:
    """The cue set by ``reply_cue``; outside one, a cue with no tone and no history."""
    return _CUE.get() or ReplyCue()
