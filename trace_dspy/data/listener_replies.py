"""Human listener replies from the EmpatheticDialogues pool, written as prose: training data for a reply writer.

Each conversation of the pool (the ED *valid* split; its *test* split is never read here) gives one
:class:`ListenerReply`: the speaker's first turn and the listener's first reply, with the conversation's
emotion label and, where the source has one, the speaker's situation prompt (the preprocessed ED CSVs have
none; the JSONL and hub layouts may). The preprocessed ED text is tokenized and lower-cased
("i 'm so sorry to hear that . did you call the police ?"); :func:`clean_text` writes it as a person
would ("I'm so sorry to hear that. Did you call the police?") and the raw text is kept beside it.

Cleaning is two steps, each conservative:

- :func:`detokenize` joins what the tokenizer split: ``_comma_`` markers, contractions (``n't 's 're 've
  'll 'd 'm``, also with a curly apostrophe), ``gon na``/``wan na``/``got ta``, punctuation (no space before
  ``. , ! ? ; : % )`` and no space after ``( $ #``) and emoticons (``: )`` becomes ``:)``);
- :func:`truecase` capitalises the first letter of each sentence (after ``.``, ``!`` or ``?`` and a space),
  the pronoun I (``I'm``, ``I've``, ``I'll``, ``I'd``) and a small closed list of names: the days, the months
  but May and March (also verbs) and four holidays (:data:`PROPER_NAMES`). Every other word keeps its case: no
  guessing of people's or places' names.

A pair is skipped, and counted, when the speaker's turn has no word, when the reply has no word or fewer
than :data:`MIN_REPLY_WORDS` words, or when the same cleaned (speaker, reply) pair came earlier (the corpus
has near-duplicate conversations).
"""

from __future__ import annotations

import os
import random
import re
import statistics
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path

from trace_dspy.core import env
from trace_dspy.core.text import words
from trace_dspy.data.ed_csv import read_ed_csv
from trace_dspy.data.samples import DataError, Sample
from trace_dspy.data.sources import HUB_PREFIX, DataSource, read_jsonl

# A reply with fewer words than this ("ok .", "wow !") teaches the writer nothing.
MIN_REPLY_WORDS = 2
# The pool's files in a data folder, in the order they are looked for; the test files are never named here.
POOL_FILES = ("valid.csv", "valid.jsonl")

_CONTRACTIONS = frozenset({"n't", "'s", "'re", "'ve", "'ll", "'d", "'m"})
# Words the ED tokenizer cut in two (NLTK's treebank rules): joined back.
_SPLIT_WORDS = {("gon", "na"): "gonna", ("wan", "na"): "wanna", ("got", "ta"): "gotta"}
# Tokens that stick to the token before them, and those that stick to the token after them.
_CLOSER = re.compile(r"[.,!?;:%)\]}]+|'")
_OPENERS = frozenset({"(", "[", "$", "#"})
_EMOTICON_EYES = frozenset({":", ";"})
_EMOTICON_MOUTHS = frozenset({")", "(", "p", "d"})
_CURLY_CONTRACTION = re.compile(r"\s*[’‘]\s*(s|re|ve|ll|d|m|t)\b", re.IGNORECASE)

_PRONOUN_I = re.compile(r"(?<![\w'’-])i(?=(?:['’](?:m|ve|ll|d))?(?![\w'’-]|\.\w))")
_TEXT_START = re.compile(r"^([\"'(\[]*)([a-z])")
_SENTENCE_START = re.compile(r"([.!?]+[\"')\]]*\s+[\"'(\[]*)([a-z])")
PROPER_NAMES = (
    "monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday",
    "january", "february", "april", "june", "july", "august", "september", "october", "november", "december",
    "christmas", "easter", "thanksgiving", "halloween",
)
_PROPER = re.compile(r"\b(" + "|".join(PROPER_NAMES) + r")\b")


# ---------------------------------------------------------------- cleaning


def _joins_previous(token: str) -> bool:
    """Whether ``token`` is written against the token before it: a contraction or closing punctuation."""
    if _is_emoticon(token):
        return False
    return token.lower() in _CONTRACTIONS or _CLOSER.fullmatch(token) is not None


def _is_emoticon(token: str) -> bool:
    """Whether ``token`` is an emoticon (":)", ";P"): written apart from the word before it."""
    return len(token) == 2 and token[0] in _EMOTICON_EYES and token[1].lower() in _EMOTICON_MOUTHS


def _merged_tokens(tokens: list[str]) -> Iterator[str]:
    """The tokens with the split words (``gon na``) and the emoticons (``: )``) put back together."""
    i = 0
    while i < len(tokens):
        pair = (tokens[i], tokens[i + 1]) if i + 1 < len(tokens) else None
        if pair and (pair[0].lower(), pair[1].lower()) in _SPLIT_WORDS:
            yield pair[0] + pair[1]
        elif pair and _is_emoticon(pair[0] + pair[1]):
            yield pair[0] + pair[1].upper()
        else:
            yield tokens[i]
            i += 1
            continue
        i += 2


def detokenize(text: str) -> str:
    """ED's tokenized text with its tokens joined as written: ``_comma_`` markers back to commas, no space
    inside contractions or before closing punctuation, none after ``(``, ``$`` or ``#``; letters keep their
    case. Whitespace runs become one space; text that is already prose comes back unchanged."""
    text = _CURLY_CONTRACTION.sub(r"'\1", text.replace("_comma_", " , "))
    out: list[str] = []
    glue = False  # the previous token opens: the next one sticks to it
    for token in _merged_tokens(text.split()):
        if out and (glue or _joins_previous(token)):
            out[-1] += token
        else:
            out.append(token)
        glue = token in _OPENERS
    return " ".join(out)


def truecase(text: str) -> str:
    """``text`` with a capital at the start of each sentence, on the pronoun I (and I'm, I've, I'll, I'd)
    and on the closed list :data:`PROPER_NAMES`; every other letter as it was."""
    text = _PRONOUN_I.sub("I", text)
    text = _PROPER.sub(lambda m: m.group(1).capitalize(), text)
    text = _TEXT_START.sub(lambda m: m.group(1) + m.group(2).upper(), text)
    return _SENTENCE_START.sub(lambda m: m.group(1) + m.group(2).upper(), text)


def clean_text(text: str) -> str:
    """ED's preprocessed text as prose: :func:`detokenize`, then :func:`truecase`."""
    return truecase(detokenize(text))


# ---------------------------------------------------------------- the pairs


@dataclass(frozen=True)
class ListenerReply:
    """One conversation's opening: the speaker's first turn and the listener's first reply, cleaned, with the
    raw text they were cleaned from."""

    conv_id: str
    speaker: str
    reply: str
    emotion: str
    situation: str | None  # the speaker's situation prompt (the cause they describe); None where the source has none
    raw_speaker: str = field(repr=False)
    raw_reply: str = field(repr=False)
    raw_situation: str | None = field(default=None, repr=False)

    @property
    def reply_words(self) -> int:
        """How many words the cleaned reply has (runs of letters, digits and apostrophes)."""
        return len(words(self.reply))


@dataclass(frozen=True)
class ReplyCounts:
    """What became of the pool's conversations: each is kept or skipped for one reason, so that
    ``conversations == kept + skipped``; ``sampled`` of the kept ones are returned (all without a limit)."""

    conversations: int
    kept: int
    sampled: int
    empty_speaker: int = 0
    empty_reply: int = 0
    short_reply: int = 0
    duplicate: int = 0

    def __post_init__(self) -> None:
        if self.conversations != self.kept + self.skipped or not 0 <= self.sampled <= self.kept:
            raise ValueError(f"the counts do not add up: {self.as_dict()}")

    @property
    def skipped(self) -> int:
        """The conversations skipped, for any reason."""
        return self.empty_speaker + self.empty_reply + self.short_reply + self.duplicate

    def as_dict(self) -> dict[str, int]:
        """The counts by name, ``skipped`` included (for a report or a JSON file)."""
        return {**{f.name: getattr(self, f.name) for f in fields(self)}, "skipped": self.skipped}


@dataclass(frozen=True)
class ListenerReplies:
    """The pairs taken from a pool (ordered by conversation id), what was skipped, and where they came from."""

    items: tuple[ListenerReply, ...]
    counts: ReplyCounts
    location: str

    def __len__(self) -> int:
        return len(self.items)

    def __iter__(self) -> Iterator[ListenerReply]:
        return iter(self.items)


def _pool(source_or_folder: DataSource | str | os.PathLike | None) -> tuple[list[Sample], str]:
    """The pool's samples and where they were read: a loaded source's pool, or the pool file of a data folder
    (``valid.csv``, else ``valid.jsonl``); ``None`` means the folder ``$TRACE_DSPY_DATA`` names. Only that one
    file is read."""
    if isinstance(source_or_folder, DataSource):
        return source_or_folder.pool, source_or_folder.location
    spec = os.fspath(source_or_folder) if source_or_folder is not None else env.value(env.DATA)
    if spec is None:
        raise DataError(f"no data: give the folder that holds the EmpatheticDialogues valid.csv, or set {env.DATA}")
    if spec.startswith(HUB_PREFIX):
        raise DataError(f"{spec}: load a hub dataset with resolve_source and pass the DataSource it returns")
    folder = Path(spec).expanduser()
    if not folder.is_dir():
        raise DataError(f"{folder}: not a folder; give the folder that holds valid.csv (its test split is not read)")
    for name in POOL_FILES:
        if (folder / name).is_file():
            path = folder / name
            return (read_ed_csv(path) if name.endswith(".csv") else read_jsonl(path)), str(path)
    raise DataError(f"{folder}: no {' or '.join(POOL_FILES)} in this folder")


def _conv_order(conv_id: str) -> list[tuple[int, int | str]]:
    """A sort key that orders the numbers inside an id as numbers ("valid:9" before "valid:10")."""
    return [(0, int(part)) if part.isdigit() else (1, part) for part in re.split(r"(\d+)", conv_id) if part]


def opening_exchanges(samples: Sequence[Sample]) -> list[ListenerReply]:
    """Each conversation's first speaker turn and first listener reply, cleaned, in conversation-id order.
    The longest sample of a conversation holds both (its first two turns, or its turn and reply)."""
    longest: dict[str, Sample] = {}
    for s in samples:
        if s.conversation_id not in longest or len(s.turns) > len(longest[s.conversation_id].turns):
            longest[s.conversation_id] = s
    pairs = []
    for conv_id in sorted(longest, key=_conv_order):
        s = longest[conv_id]
        raw_reply = s.turns[1] if len(s.turns) > 1 else s.response
        situation = clean_text(s.situation) if s.situation else None
        pairs.append(ListenerReply(conv_id, clean_text(s.turns[0]), clean_text(raw_reply), s.emotion, situation,
                                   s.turns[0], raw_reply, s.situation))
    return pairs


def _skip_reason(pair: ListenerReply, seen: set[tuple[str, str]]) -> str | None:
    """Why ``pair`` is left out (a :class:`ReplyCounts` field), or None to keep it; ``seen`` holds the pairs
    kept so far."""
    if not words(pair.speaker):
        return "empty_speaker"
    n = pair.reply_words
    if n == 0:
        return "empty_reply"
    if n < MIN_REPLY_WORDS:
        return "short_reply"
    if (pair.speaker, pair.reply) in seen:
        return "duplicate"
    return None


def _sample(items: list[ListenerReply], limit: int | None, seed: int) -> list[ListenerReply]:
    """``limit`` of the items, drawn with ``seed`` and kept in their order; all of them without a limit."""
    if limit is None or limit >= len(items):
        return list(items)
    if limit < 0:
        raise ValueError(f"limit must be non-negative, got {limit}")
    return [items[i] for i in sorted(random.Random(seed).sample(range(len(items)), limit))]


def listener_replies(source_or_folder: DataSource | str | os.PathLike | None = None, *,
                     limit: int | None = None, seed: int = 0) -> ListenerReplies:
    """Every pool conversation's (first speaker turn, first listener reply), cleaned, by conversation id.

    ``source_or_folder`` is a loaded :class:`~trace_dspy.data.sources.DataSource` (its pool is used) or a data
    folder, whose ``valid.csv`` (or ``valid.jsonl``) alone is read; ``None`` takes the folder from
    ``$TRACE_DSPY_DATA``. ``limit`` draws that many of the kept pairs with ``seed`` (the same draw for the
    same pool, limit and seed), in conversation-id order. A missing or malformed file is a DataError.
    """
    samples, location = _pool(source_or_folder)
    pairs = opening_exchanges(samples)
    kept: list[ListenerReply] = []
    skipped: dict[str, int] = defaultdict(int)
    seen: set[tuple[str, str]] = set()
    for pair in pairs:
        reason = _skip_reason(pair, seen)
        if reason is None:
            kept.append(pair)
            seen.add((pair.speaker, pair.reply))
        else:
            skipped[reason] += 1
    items = _sample(kept, limit, seed)
    counts = ReplyCounts(conversations=len(pairs), kept=len(kept), sampled=len(items), **skipped)
    return ListenerReplies(tuple(items), counts, location)


# ---------------------------------------------------------------- for the documentation


def before_after(replies: ListenerReplies | Sequence[ListenerReply], n: int = 10, *, seed: int = 0,
                 part: str = "reply") -> list[tuple[str, str]]:
    """``n`` (raw, cleaned) pairs of the replies' ``part`` ("reply" or "speaker"), drawn with ``seed``, in
    conversation-id order: what the cleaning did, to show in the documentation."""
    if part not in ("reply", "speaker"):
        raise ValueError(f"part must be 'reply' or 'speaker', got {part!r}")
    chosen = _sample(list(replies), n, seed)
    return [(getattr(r, f"raw_{part}"), getattr(r, part)) for r in chosen]


def reply_lengths(replies: ListenerReplies | Sequence[ListenerReply]) -> dict[str, float]:
    """The cleaned replies' lengths in words: count, min, median, 90th percentile (nearest rank) and max."""
    counts = sorted(r.reply_words for r in replies)
    if not counts:
        return {"count": 0}
    p90 = counts[max(0, -(-9 * len(counts) // 10) - 1)]
    return {"count": len(counts), "min": counts[0], "median": statistics.median(counts), "p90": p90,
            "max": counts[-1]}


__all__ = ["MIN_REPLY_WORDS", "PROPER_NAMES", "ListenerReplies", "ListenerReply", "ReplyCounts", "before_after",
           "clean_text", "detokenize", "listener_replies", "opening_exchanges", "reply_lengths", "truecase"]
