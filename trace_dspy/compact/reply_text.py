"""What a reply says and how it is cleaned: the plan in words, the scaffold's openers and the listener's words.

The reply stage's adapter (``trace_dspy.compact.reply_adapter``) asks the model for a reply with these; the
opener tables themselves are in ``trace_dspy.compact.openers``.
"""

from __future__ import annotations

import hashlib
import re

from trace_dspy.compact.openers import (
    BAND_ACKNOWLEDGEMENTS,
    BAND_OPENERS,
    SCAFFOLD_OPENERS,
    emotion_valence,
    scaffold_kinds,
)
from trace_dspy.core.text import loop_start, sentences, words

# How each planned mechanism is asked for, in words a small chat model follows.
_STRATEGY_WORDS = {
    "ER": "say warmly how you feel for them",
    "IP": "show that you understand what they feel and why",
    "EX": "ask one gentle question about what happened",
}
_ROLE_PREFIX = re.compile(r"^\s*(?:(?:speaker|listener|assistant|user|reply|response)\s*(?:\(reply\))?\s*:\s*)+",
                          re.IGNORECASE)


def openers_for(inputs: dict, fitted=None, band: str = "mixed") -> dict[str, tuple[str, ...]]:
    """The openers of each mechanism for this reply: the fitted ones of the emotion's valence (then "any"),
    else the stock ``SCAFFOLD_OPENERS``; in a sure tone ``band`` ("pleasant", "unpleasant"), that band's
    acknowledgements and questions (``BAND_OPENERS``) in their place."""
    table = SCAFFOLD_OPENERS
    if fitted:
        chosen = fitted.get(emotion_valence(inputs.get("emotion"))) or fitted.get("any") or {}
        table = {kind: tuple(chosen.get(kind) or stock) for kind, stock in SCAFFOLD_OPENERS.items()}
    toned = BAND_OPENERS.get(band, {})
    return {kind: tuple(toned.get(kind) or options) for kind, options in table.items()}


def opener_offset(inputs: dict, kind: str, variety: int) -> int:
    """Which of a mechanism's first ``variety`` openers this dialogue's first reply takes: a stable hash of
    the speaker's last turn (the same message always gets the same opener, in any process; different
    messages spread over them). 0 with ``variety`` 1 or less."""
    if variety <= 1:
        return 0
    from trace_dspy.core.dialogue import last_speaker_turn

    try:
        said = last_speaker_turn(str(inputs.get("dialogue") or ""))
    except ValueError:
        said = str(inputs.get("dialogue") or "")
    digest = hashlib.sha256(f"{kind}|{' '.join(said.lower().split())}".encode()).digest()
    return int.from_bytes(digest[:4], "big") % variety


def scaffold_openers(inputs: dict, candidate: int = 0, openers=None, variety: int = 1, recent=None) -> list[str]:
    """The openers of a scaffolded reply's two sentences, for candidate ``candidate`` (0: the first reply).

    ``openers`` maps each mechanism to its openers, best first (default ``SCAFFOLD_OPENERS``; see
    ``openers_for``). The first reply's acknowledgement (ER) is, where the openers are a tone band's, any of
    them; otherwise, with ``recent`` (a ``RecentOpenings`` history, kept by ``respond`` and ``chat``), one of
    the first ``variety``, and without a history the best. Among those, with ``recent`` the one recent replies
    opened with least, counted from this message's place (``opener_offset``); without, that place. The other
    mechanisms take their best opener. Candidate c takes the c-th after the first reply's, coming round again
    past the last; a tone band's acknowledgement stays the first reply's (they are alike by design, and the
    reward would otherwise pick the one its heads happen to like best every time, whatever the history says).
    """
    return [options[index] for options, index in _opener_choices(inputs, candidate, openers, variety, recent)]


def spare_openers(inputs: dict, candidate: int = 0, openers=None, variety: int = 1, recent=None) -> list[str]:
    """The opener to try in each sentence's place where the model does not go on from the one
    ``scaffold_openers`` gives: the next candidate's, or for a tone band's acknowledgement the next one."""
    spares = []
    for options, index in _opener_choices(inputs, candidate + 1, openers, variety, recent):
        band = options[index] in BAND_ACKNOWLEDGEMENTS
        spares.append(options[(index + 1) % len(options)] if band else options[index])
    return spares


def _opener_choices(inputs: dict, candidate: int, openers, variety: int, recent) -> list[tuple[tuple[str, ...], int]]:
    """Each sentence's openers and the index of the one it takes (see ``scaffold_openers``)."""
    openers = openers or SCAFFOLD_OPENERS
    kinds = scaffold_kinds(inputs)
    chosen = []
    for slot, kind in enumerate(kinds):
        options = openers[kind]
        repeat = slot > 0 and kind == kinds[0]  # the second sentence of a one-mechanism plan: the next opener
        # Only the acknowledgement varies. Read side by side, "What happened to the doctor?" and "How did you miss
        # him?" were worse than the best-ranked question. A model-continued acknowledgement varies only where a
        # person reads the replies one after another (a history): on 200 ED items, rotating it cost composite
        # score, as the other plan's reply then won more often (docs/results/replies.md, "Tone bands").
        start = 0
        band = all(o in BAND_ACKNOWLEDGEMENTS for o in options)
        if kind == "ER":
            count = len(options) if band else min(variety, len(options)) if recent is not None else 1
            start = opener_offset(inputs, kind, count)
            if recent is not None and count > 1:
                ordered = [options[(start + i) % count] for i in range(count)]
                start = (start + recent.least_used(ordered)) % count
        step = 0 if band else candidate
        chosen.append((options, (start + step + repeat) % len(options)))
    return chosen


def first_sentence(text: str, opener: str = "") -> str:
    """The first sentence of a completion that begins with ``opener``, cleaned as a reply is (one line, no
    role prefix, no loop). A sentence cut off by the token limit ends at its first comma after the opener,
    if it has one: "... hurt him, it is a lot to take care of, and it is hard to be a" keeps "... hurt him."
    Complete sentences are kept whole: cutting those over 16 words at their first comma lowered the
    composite on 100 ED items (0.5515 to 0.5440, docs/results/replies.md, "Scaffolded replies").
    """
    cleaned = clean_reply(text)
    found = sentences(cleaned)
    sentence = (found[0] if found else cleaned).strip()
    if sentence and sentence[-1] not in ".!?":
        sentence = (_before_comma(sentence, opener) or sentence).rstrip(" ,;:") + "."
    return sentence


def _before_comma(sentence: str, opener: str) -> str | None:
    """``sentence`` up to its first comma after ``opener`` (None without one), where a truncated sentence and a
    question end."""
    comma = sentence.find(",", len(opener))
    return sentence[:comma] if comma >= 0 else None


def question_clause(sentence: str, opener: str) -> str:
    """A question begun with ``opener`` ends at its first comma after it: what SmolLM2-135M adds there is
    mostly a vocative or a second thought ("How did that happen, a coworker?", "How are you holding up,
    okay?", "... to your doorstep, with your own car?"). Kept whole where the cut would leave the opener
    alone ("How are you, my friend?") or the sentence does not begin with the opener."""
    head = _before_comma(sentence, opener) if sentence.startswith(opener) else None
    cut = head.rstrip(" .!?;:") if head is not None else ""
    if len(words(cut)) <= len(words(opener)):
        return sentence
    return cut + "?"


def plan_in_words(inputs: dict) -> str:
    """The plan of the earlier stages as one plain instruction.

    Only the mechanisms are given: on the embedded model the emotion label and
    the cause summary are often wrong or copied from the message, and a small
    writer repeats them.
    """
    steps = [_STRATEGY_WORDS[s] for s in (inputs.get("strategy"), inputs.get("secondary_strategy"))
             if s in _STRATEGY_WORDS]
    steps = list(dict.fromkeys(steps))
    return ("First " + ", then ".join(steps) + ".") if steps else ""


# EmpatheticDialogues text is tokenized and lower-cased ("i 'm sorry . what happened ?"); a model shown it
# answers the same way. tidy_text writes it as a person would.
_SPACE_BEFORE_PUNCT = re.compile(r"\s+([.,!?;:])")
_SPLIT_CONTRACTION = re.compile(r"(?<=\w)\s+(n't|'s|'re|'ve|'ll|'d|'m)\b", re.IGNORECASE)
_LONE_I = re.compile(r"\bi\b")
_SENTENCE_START = re.compile(r"(^|[.!?]\s+)([a-z])")


def tidy_text(text: str) -> str:
    """Tokenized, lower-cased dataset text as written prose: no space before punctuation or inside
    contractions, a capital "I", sentences starting with a capital letter."""
    text = " ".join(str(text).split())
    text = _SPLIT_CONTRACTION.sub(r"\1", _SPACE_BEFORE_PUNCT.sub(r"\1", text))
    text = _LONE_I.sub("I", text)
    return _SENTENCE_START.sub(lambda m: m.group(1) + m.group(2).upper(), text)


_TRAILING_JOINER = re.compile(r"(?:[\s,;:-]+|\b(?:and|but|so|or|because|that)\b)+$", re.IGNORECASE)
REPEAT_RUN = 4


def _cut_repeated_run(line: str, size: int = REPEAT_RUN) -> str:
    """The line up to where it starts saying ``size`` or more of its words again.

    "I'm so glad you got the job, and I'm so glad you got the job" keeps its
    first clause; a dangling joiner ("and", a comma) goes with the repeat.
    """
    start = loop_start(line, run=size)
    if start is None:
        return line
    kept = _TRAILING_JOINER.sub("", line[:start]).rstrip()
    if kept and kept[-1] not in ".!?":
        kept += "."
    return kept


def clean_reply(text: str, second: str = "any") -> str:
    """The listener's words from a chat completion: one line, no role prefix, no loop, two sentences at most;
    with ``second="question"`` (``ProgramConfig.reply_second``) the second only where it asks."""
    line = next((ln for ln in text.strip().splitlines() if ln.strip()), "")
    line = tidy_text(_ROLE_PREFIX.sub("", line).strip().strip('"').strip())
    cut = loop_start(line)
    if cut is not None:
        line = line[:cut].rstrip(" ,;")
    line = _cut_repeated_run(line)
    kept, seen = [], set()
    for sentence in (s.strip() for s in sentences(line)):
        if sentence and sentence.lower() not in seen:
            seen.add(sentence.lower())
            kept.append(sentence)
    if second == "question" and len(kept) > 1 and not kept[1].endswith("?"):
        return kept[0]
    return " ".join(kept[:2])

