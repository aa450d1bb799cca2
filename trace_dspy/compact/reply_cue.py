"""What the reply stage knows besides its signature's inputs: the tone band of the speaker's situation and the
openings of the program's recent replies.

The compact writer passes a ``ReplyCue`` to the scaffolded reply (``trace_dspy.compact.scaffold``) with each
call, which chooses its openers by it: an acknowledgement and a question in the situation's tone where the
emotion prior is sure of it (``trace_dspy.compact.openers.BAND_OPENERS``), and, with a history of openings
(``respond``, ``chat``), the option recent replies used least.
"""

from __future__ import annotations

from dataclasses import dataclass

from trace_dspy.compact.openers import tone_band
from trace_dspy.compact.reply_variety import RecentOpenings


@dataclass(frozen=True)
class ReplyCue:
    """``pleasant``: the situation's pleasantness from the emotion prior (None: no prior); ``recent``: the
    program's history of openings (None: none kept, as in evaluations and compiles)."""

    pleasant: float | None = None
    recent: RecentOpenings | None = None

    @property
    def band(self) -> str:
        """"pleasant", "unpleasant" or "mixed" (``trace_dspy.compact.openers.tone_band``)."""
        return tone_band(self.pleasant)
