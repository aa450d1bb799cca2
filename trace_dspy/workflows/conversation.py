"""One conversation with a program: the turns so far, the next reply, and a transcript that can be saved."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dspy

from trace_dspy.core.jsonl import atomic_write_lines
from trace_dspy.workflows.batch import stage_outputs


@dataclass
class Exchange:
    """One speaker turn and the program's answer to it."""

    speaker: str
    reply: str
    emotion: str
    stages: dict[str, Any]


@dataclass
class ChatSession:
    """The conversation so far and what the program said at each step."""

    program: dspy.Module
    lm: dspy.LM | None = None
    show_stages: bool = False
    exchanges: list[Exchange] = field(default_factory=list)
    conversation_id: str = field(default_factory=lambda: f"chat-{uuid.uuid4().hex[:8]}")

    def turns(self) -> list[str]:
        """The dialogue as alternating turns, speaker first."""
        out: list[str] = []
        for ex in self.exchanges:
            out += [ex.speaker, ex.reply]
        return out

    def say(self, text: str) -> Exchange:
        """Answer the speaker's next turn. On any error the conversation is left as it was."""
        if self.lm is not None:
            with dspy.context(lm=self.lm):
                pred = self.program(dialogue=[*self.turns(), text])
        else:
            pred = self.program(dialogue=[*self.turns(), text])
        # The program collapses whitespace in turns; store them the same way.
        exchange = Exchange(" ".join(text.split()), " ".join(str(pred.response).split()), str(pred.get("emotion", "")),
                            stage_outputs(pred))
        self.exchanges.append(exchange)
        return exchange

    def reset(self) -> None:
        self.exchanges.clear()
        self.conversation_id = f"chat-{uuid.uuid4().hex[:8]}"

    def records(self) -> list[dict[str, Any]]:
        """One dataset record per exchange (the project's JSONL format, see docs/guide/config.md, 'Data')."""
        out, turns = [], []
        for n, ex in enumerate(self.exchanges, 1):
            turns = [*turns, ex.speaker]
            out.append({"id": f"{self.conversation_id}-{n}", "conversation_id": self.conversation_id,
                        "turns": list(turns), "emotion": ex.emotion, "reply": ex.reply})
            turns.append(ex.reply)
        return out

    def save(self, path: str | Path) -> Path:
        path = Path(path).expanduser()
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_lines(path, self.records())
        return path
