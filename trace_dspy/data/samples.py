"""One item of data, and the error every reader raises.

A :class:`Sample` is the conversation so far (ending on the speaker) and the gold reply; the readers in
:mod:`trace_dspy.data.sources` and :mod:`trace_dspy.data.ed_csv` make them.
"""

from __future__ import annotations

from dataclasses import dataclass

import dspy

from trace_dspy.core.dialogue import LISTENER, SPEAKER, Turn, render_dialogue


class DataError(ValueError):
    """A data source is missing or malformed; the message names file and line."""


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


__all__ = ["DataError", "Sample"]
