"""Replies that do not all open alike: the openings of a program's recent replies, and the penalty they give.

A person who sends a batch of messages, or chats for a while, reads the replies one after another; a friend who
opens every answer with "That sounds" does not sound like they listened. ``RecentOpenings`` keeps the two-word
openings of the last replies a program kept (thread-safe). When the reply race chooses among its plans' replies,
and when Best-of-N keeps a sample, each candidate's reward is lowered by ``variety_penalty`` times the share of
recent replies that opened the same way; the rewards recorded with the reply are the metric's own. The
scaffolded reply's acknowledgement takes the opener recent replies used least (``least_used``). The history is
switched on by the commands a person reads (``respond``, ``chat``); evaluations and compiles leave it off, so
that a score does not depend on the order the dialogues came in.
"""

from __future__ import annotations

import re
import threading
from collections import deque

_WORD = re.compile(r"[a-z0-9']+")
DEFAULT_SIZE = 20


def opening(reply: str, words: int = 2) -> str:
    """The first ``words`` words of a reply, lowercased, without punctuation ("" for an empty reply)."""
    return " ".join(_WORD.findall(str(reply or "").lower().replace("\u2019", "'"))[:words])


class RecentOpenings:
    """The openings of the last ``size`` replies kept."""

    def __init__(self, size: int = DEFAULT_SIZE):
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            raise ValueError(f"the opening history holds at least one reply, not {size!r}")
        self._seen: deque[str] = deque(maxlen=size)
        self._lock = threading.Lock()

    def _uses(self, texts) -> tuple[list[int], int]:
        """How many recent replies opened as each of ``texts`` does (0 for one with no opening), and how many
        replies are remembered."""
        keys = [opening(t) for t in texts]
        with self._lock:
            return [sum(seen == key for seen in self._seen) if key else 0 for key in keys], len(self._seen)

    def share(self, reply: str) -> float:
        """The share of the recent replies that opened as ``reply`` does (0 with none yet)."""
        (uses,), total = self._uses([reply])
        return uses / total if total else 0.0

    def least_used(self, options) -> int:
        """The index of the first of ``options`` (replies or openers) whose opening the recent replies used
        least (0 with no options)."""
        counts, _ = self._uses(options)
        return min(range(len(counts)), key=counts.__getitem__) if counts else 0

    def add(self, reply: str) -> None:
        key = opening(reply)
        if key:
            with self._lock:
                self._seen.append(key)

    def __len__(self) -> int:
        with self._lock:
            return len(self._seen)
