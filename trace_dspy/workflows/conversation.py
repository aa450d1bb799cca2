"""One conversation with a program: the turns so far, the next reply, and a transcript that can be saved."""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dspy

from trace_dspy.core.dialogue import MAX_DIALOGUE_CHARS, DialogueError
from trace_dspy.core.jsonl import atomic_add_records, atomic_write_lines
from trace_dspy.workflows.batch import stage_outputs

# The fields of a saved exchange (``ChatSession.records``), and the conversation ids a session gives.
TRANSCRIPT_FIELDS = frozenset({"id", "conversation_id", "turns", "emotion", "reply"})
_CONVERSATION_ID = re.compile(r"chat-[0-9a-f]{8}")


class TranscriptError(ValueError):
    """A file that cannot take the conversation (not a transcript of ours, or another run is writing it);
    it is left as it is."""


def is_transcript_record(rec: Any) -> bool:
    """A record as ``ChatSession.records`` writes it: exactly its fields, a ``chat-`` conversation id, an id of
    that conversation, text turns, emotion and reply (the emotion may have been corrected by hand)."""
    if not isinstance(rec, dict) or set(rec) != TRANSCRIPT_FIELDS:
        return False
    cid, rid, turns = rec["conversation_id"], rec["id"], rec["turns"]
    return (isinstance(cid, str) and _CONVERSATION_ID.fullmatch(cid) is not None and isinstance(rid, str)
            and re.fullmatch(re.escape(cid) + r"-[1-9][0-9]*", rid) is not None and isinstance(turns, list)
            and all(isinstance(t, str) for t in turns) and isinstance(rec["emotion"], str)
            and isinstance(rec["reply"], str))


def saved_ids(path: Path) -> set[str]:
    """The record ids of the transcript at ``path``: none when it is missing or empty. Anything else (a
    link, a folder, a file with any line that is not a transcript record) is a ``TranscriptError``."""
    from trace_dspy.core.files import FileCheckError, read_bytes
    from trace_dspy.core.jsonl import MAX_RECORDS_BYTES
    from trace_dspy.core.safety import JSONLimitError, load_json

    if path.is_symlink():
        raise TranscriptError(f"{path} is a symbolic link; it was left as it is. Save to the file it points to, "
                              "or choose another file")
    if not path.exists():
        return set()
    if not path.is_file():
        raise TranscriptError(f"{path} is not a regular file; choose another file")
    try:  # checked and bounded: a FIFO or a device put there since the checks above is refused, not read
        data = read_bytes(path, max_bytes=MAX_RECORDS_BYTES, links=False)
    except FileCheckError as exc:
        raise TranscriptError(f"{exc}; it was left as it is") from None
    ids = set()
    for n, raw in enumerate(data.split(b"\n"), 1):
        if not raw.strip():
            continue
        try:
            rec = load_json(raw, f"{path}:{n}")
        except JSONLimitError:
            rec = None
        if not is_transcript_record(rec):
            raise TranscriptError(f"{path} exists and is not a chat transcript (line {n} is not one of its "
                                  "records); it was left as it is. Choose another file, or move that file away")
        ids.add(rec["id"])
    return ids


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
    # How many of the oldest exchanges the program no longer reads: a long conversation keeps going with its
    # newest exchanges, within the dialogue limit (MAX_DIALOGUE_CHARS). The transcript keeps them all.
    dropped: int = 0

    def turns(self) -> list[str]:
        """The dialogue as alternating turns, speaker first."""
        out: list[str] = []
        for ex in self.exchanges:
            out += [ex.speaker, ex.reply]
        return out

    def window_start(self, text: str) -> int:
        """The first exchange the program reads with ``text``: the newest exchanges whose turns, with ``text``,
        fit the dialogue limit; never earlier than ``dropped`` (DialogueError when ``text`` alone is too long)."""
        size = len(" ".join(text.split()))
        if size > MAX_DIALOGUE_CHARS:
            raise DialogueError(f"your message is {size:,} characters long; the limit is {MAX_DIALOGUE_CHARS:,}: "
                                "send a shorter one")
        start = len(self.exchanges)
        while start > self.dropped:
            ex = self.exchanges[start - 1]
            size += len(ex.speaker) + len(ex.reply)
            if size > MAX_DIALOGUE_CHARS:
                break
            start -= 1
        return start

    def say(self, text: str) -> Exchange:
        """Answer the speaker's next turn, the program reading the newest exchanges that fit the dialogue limit
        (``dropped`` grows as older ones stop fitting). On any error the conversation is left as it was."""
        start = self.window_start(text)
        turns = [t for ex in self.exchanges[start:] for t in (ex.speaker, ex.reply)]
        if self.lm is not None:
            with dspy.context(lm=self.lm):
                pred = self.program(dialogue=[*turns, text])
        else:
            pred = self.program(dialogue=[*turns, text])
        # The program collapses whitespace in turns; store them the same way.
        exchange = Exchange(" ".join(text.split()), " ".join(str(pred.response).split()), str(pred.get("emotion", "")),
                            stage_outputs(pred))
        self.exchanges.append(exchange)
        self.dropped = start
        return exchange

    def reset(self) -> None:
        self.exchanges.clear()
        self.dropped = 0
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
        """Add the conversation's exchanges to the transcript at ``path``, which must be missing, empty, or a
        transcript that this command saved (``TranscriptError`` otherwise, the file left as it is).

        Nothing in the file is lost: its lines stay as they are (other conversations, an earlier save of
        this one, corrected emotions), and only the exchanges it does not hold yet are added, so saving
        again after more turns, or after ``/reset``, keeps everything. The file is replaced atomically,
        under the lock that every writer of an output takes (:func:`~trace_dspy.core.locks.output_lock`).
        """
        from trace_dspy.core.jsonl import ForeignFileError
        from trace_dspy.core.locks import OutputLockError, output_lock

        path = Path(path).expanduser()
        try:
            with output_lock(path):
                held = saved_ids(path)
                new = [rec for rec in self.records() if rec["id"] not in held]
                if not path.exists():
                    atomic_write_lines(path, new)
                elif new:
                    atomic_add_records(path, new)
        except (OutputLockError, ForeignFileError) as exc:
            raise TranscriptError(str(exc)) from None
        return path
