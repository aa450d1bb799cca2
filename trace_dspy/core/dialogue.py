"""The dialogue input: parse, validate and render it in one canonical form.

A dialogue reaches the program either as a list of turns or as a string with
one ``Speaker:`` / ``Listener:`` line per turn. Inside the program it is
always the canonical string, so that prompts, caches and saved demos see one
spelling.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

SPEAKER = "Speaker"
LISTENER = "Listener"
_ROLE_ALIASES = {
    "speaker": SPEAKER, "seeker": SPEAKER, "user": SPEAKER,
    "listener": LISTENER, "responder": LISTENER, "assistant": LISTENER,
}
_PREFIX = re.compile(r"^\s*(speaker|listener|seeker|responder|user|assistant)\s*:\s?(.*)$", re.IGNORECASE)

# A single message longer than this is refused rather than sent to a model
# whose context it could never fit (SmolLM2 reads 8k tokens).
MAX_DIALOGUE_CHARS = 20_000
_SURROGATE = re.compile("[\ud800-\udfff]")

# What draws nothing on a screen: whitespace and the characters of these Unicode categories (format
# characters such as zero-width spaces, joiners, bidi controls and the BOM; space, line and paragraph
# separators; controls), and the few letters and marks that render blank (Hangul fillers, the blank Braille
# pattern, the combining grapheme joiner, variation selectors).
_INVISIBLE_CATEGORIES = frozenset({"Cf", "Zs", "Zl", "Zp", "Cc"})
_BLANK = frozenset("\u034f\u115f\u1160\u180b\u180c\u180d\u180f\u2800\u3164\uffa0"
                   + "".join(map(chr, [*range(0xFE00, 0xFE10), *range(0xE0100, 0xE01F0)])))


class DialogueError(ValueError):
    """The dialogue given to the program cannot be used as it is."""


@dataclass(frozen=True)
class Turn:
    role: str  # SPEAKER or LISTENER
    text: str


def _clean(text: str) -> str:
    return " ".join(text.split())


def is_invisible(text: str) -> bool:
    """Whether ``text`` shows nothing (empty, whitespace, zero-width spaces, bidi controls, a BOM...): such a
    message says nothing, so it is refused before any model is asked (and paid) to answer it."""
    return all(c.isspace() or c in _BLANK or unicodedata.category(c) in _INVISIBLE_CATEGORIES for c in text)


def _empty(what: str, text: str) -> DialogueError:
    hidden = " (it holds only invisible characters, such as zero-width spaces or direction marks)" if text else ""
    return DialogueError(f"{what}{hidden}")


def parse_dialogue(dialogue: str | Sequence[str] | Sequence[Mapping[str, str]]) -> list[Turn]:
    """Turn any accepted input form into a validated list of turns.

    - a string with ``Speaker:`` / ``Listener:`` prefixed lines (lines without a
      prefix continue the previous turn); a string with no prefix at all is one
      speaker message;
    - a list of strings: roles alternate and the last one is the speaker's;
    - a list of ``{"role": ..., "text": ...}`` mappings.

    The last turn must be the speaker's: the program answers as the listener.
    """
    if isinstance(dialogue, str):
        turns = _parse_string(dialogue)
    elif isinstance(dialogue, Sequence) and not isinstance(dialogue, (bytes, bytearray)):
        turns = _parse_list(dialogue)
    else:
        raise DialogueError(
            f"dialogue must be a string or a list of turns, not {type(dialogue).__name__}"
        )
    turns = [Turn(t.role, _clean(t.text)) for t in turns]
    if not turns or all(is_invisible(t.text) for t in turns):
        raise _empty("dialogue is empty: give at least one speaker message", "".join(t.text for t in turns))
    for i, turn in enumerate(turns, 1):
        if is_invisible(turn.text):
            raise _empty(f"turn {i} ({turn.role}) is empty", turn.text)
        if _SURROGATE.search(turn.text):
            # Undecodable bytes (decoded with surrogateescape) or a lone surrogate escape in JSON: no model takes it.
            raise DialogueError(f"turn {i} ({turn.role}) is not valid UTF-8 text; is it binary data?")
    if turns[-1].role != SPEAKER:
        raise DialogueError(
            "the last turn must be the speaker's: the program writes the listener's next reply"
        )
    total = sum(len(t.text) for t in turns)
    if total > MAX_DIALOGUE_CHARS:
        raise DialogueError(
            f"dialogue is {total} characters long; the limit is {MAX_DIALOGUE_CHARS}"
        )
    return turns


def _parse_string(text: str) -> list[Turn]:
    if "\x00" in text:
        raise DialogueError("dialogue contains a NUL character; is it binary data?")
    lines = [line for line in text.splitlines() if line.strip()]
    if not any(_PREFIX.match(line) for line in lines):
        return [Turn(SPEAKER, text)]
    turns: list[Turn] = []
    for n, line in enumerate(lines, 1):
        m = _PREFIX.match(line)
        if m:
            turns.append(Turn(_ROLE_ALIASES[m.group(1).lower()], m.group(2)))
        elif turns:
            turns[-1] = Turn(turns[-1].role, turns[-1].text + " " + line)
        else:
            raise DialogueError(
                f"line {n} of the dialogue has no 'Speaker:' or 'Listener:' prefix and no turn to continue"
            )
    return turns


def _parse_list(items: Sequence) -> list[Turn]:
    if not items:
        return []
    if all(isinstance(x, str) for x in items):
        # Alternate roles backwards from the final speaker turn.
        n = len(items)
        return [Turn(SPEAKER if (n - 1 - i) % 2 == 0 else LISTENER, x) for i, x in enumerate(items)]
    if any(isinstance(x, str) for x in items):
        # A list of strings with something else among them: name that turn (counted from 1), not the first.
        i, odd = next((i, x) for i, x in enumerate(items, 1) if not isinstance(x, str))
        shown = "null" if odd is None else f"{odd!r:.80}"
        raise DialogueError(f"turn {i}: expected a string like the other turns, got {shown}")
    turns = []
    for i, item in enumerate(items, 1):
        if not isinstance(item, Mapping) or "text" not in item or "role" not in item:
            raise DialogueError(
                f"turn {i}: expected a string or a mapping with 'role' and 'text', got {item!r:.80}"
            )
        role = _ROLE_ALIASES.get(str(item["role"]).lower())
        if role is None:
            raise DialogueError(f"turn {i}: unknown role {item['role']!r}; use speaker or listener")
        if not isinstance(item["text"], str):
            raise DialogueError(f"turn {i}: text must be a string")
        turns.append(Turn(role, item["text"]))
    return turns


def render_dialogue(turns: Sequence[Turn]) -> str:
    """The canonical form: one ``Role: text`` line per turn."""
    return "\n".join(f"{t.role}: {t.text}" for t in turns)


def normalize_dialogue(dialogue) -> str:
    """Parse any accepted form and return the canonical string."""
    return render_dialogue(parse_dialogue(dialogue))


def speaker_turns(dialogue: str) -> list[str]:
    """The speaker's turns of a dialogue, in order."""
    return [t.text for t in parse_dialogue(dialogue) if t.role == SPEAKER]


def listener_turns(dialogue: str) -> list[str]:
    """The listener's turns of a dialogue, in order."""
    return [t.text for t in parse_dialogue(dialogue) if t.role == LISTENER]


def speaker_text(dialogue: str) -> str:
    """All of the speaker's words in a canonical dialogue, joined by spaces."""
    return " ".join(speaker_turns(dialogue))


# ---------------------------------------------------------------- exemplars

# A retrieved exemplar is shown to the stages as its dialogue, then this mark, then its gold reply.
_REPLY_MARK = "\nListener (reply): "


def format_exemplar(item) -> str:
    """An exemplar ({"dialogue", "response"}) as the text the stages see."""
    return f"{item['dialogue']}{_REPLY_MARK}{item['response']}"


def exemplar_reply(text: str) -> str | None:
    """The gold reply inside a formatted exemplar, or None if ``text`` is not one."""
    head, mark, reply = text.rpartition(_REPLY_MARK.strip())
    return reply.strip() if mark else None


def split_exemplar(text: str) -> tuple[str, str] | None:
    """(dialogue, reply) of a formatted exemplar, or None if ``text`` is not one."""
    head, mark, reply = text.rpartition(_REPLY_MARK.strip())
    return (head.strip(), reply.strip()) if mark and head.strip() and reply.strip() else None


def last_speaker_turn(dialogue) -> str | None:
    """The text of the speaker's last turn, None when no turn is the speaker's; ValueError (from
    ``parse_dialogue``) when ``dialogue`` is not a dialogue."""
    said = [t.text for t in parse_dialogue(dialogue) if t.role != LISTENER]
    return said[-1] if said else None
