"""Closed label sets used across the program: emotions, Ekman groups, cause
categories and empathy strategies.

Everything here is plain data so that signatures, metrics and the data loader
agree on one vocabulary.
"""

from __future__ import annotations

from typing import Literal, get_args

# The 32 EmpatheticDialogues conversation labels, alphabetical.
EmotionLabel = Literal[
    "afraid", "angry", "annoyed", "anticipating", "anxious", "apprehensive",
    "ashamed", "caring", "confident", "content", "devastated", "disappointed",
    "disgusted", "embarrassed", "excited", "faithful", "furious", "grateful",
    "guilty", "hopeful", "impressed", "jealous", "joyful", "lonely",
    "nostalgic", "prepared", "proud", "sad", "sentimental", "surprised",
    "terrified", "trusting",
]
EMOTIONS: tuple[str, ...] = get_args(EmotionLabel)

EkmanGroup = Literal["anger", "fear", "disgust", "happiness", "sadness", "surprise"]
EKMAN_GROUPS: tuple[str, ...] = get_args(EkmanGroup)

# The grouping follows the TRACE code release, which leaves `prepared` out.
# We keep `prepared` and put it under happiness: in EmpatheticDialogues the
# speaker who feels prepared is describing readiness for something coming up
# (an exam, a trip, a storm) with confidence, which sits next to `confident`
# and `hopeful` (both happiness) rather than next to the fear labels, whose
# speakers are worried about the same kind of event. See docs/guide/config.md, "Labels".
EMOTION_TO_GROUP: dict[str, str] = {
    **dict.fromkeys(("angry", "furious", "annoyed", "jealous"), "anger"),
    **dict.fromkeys(("afraid", "terrified", "anxious", "apprehensive"), "fear"),
    "disgusted": "disgust",
    **dict.fromkeys(
        ("joyful", "excited", "proud", "grateful", "content", "impressed", "caring",
         "trusting", "faithful", "hopeful", "confident", "sentimental", "prepared"),
        "happiness",
    ),
    **dict.fromkeys(
        ("sad", "lonely", "disappointed", "devastated", "nostalgic", "guilty",
         "ashamed", "embarrassed"),
        "sadness",
    ),
    **dict.fromkeys(("surprised", "anticipating"), "surprise"),
}

CauseCategory = Literal[
    "Social Connection & Affection",
    "Conflict & Injustice",
    "Loss & Failure",
    "Achievement & Success",
    "Threat & Potential Danger",
    "Unexpectedness & Novelty",
]
CAUSE_CATEGORIES: tuple[str, ...] = get_args(CauseCategory)

# EPITOME communication mechanisms (Sharma et al., 2020).
Strategy = Literal["ER", "IP", "EX"]
STRATEGIES: tuple[str, ...] = get_args(Strategy)
STRATEGY_NAMES: dict[str, str] = {
    "ER": "Emotional Reaction",
    "IP": "Interpretation",
    "EX": "Exploration",
}


def ekman_group(emotion: str) -> str:
    """Map one of the 32 labels to its Ekman group; unknown labels raise."""
    try:
        return EMOTION_TO_GROUP[emotion]
    except KeyError:
        raise ValueError(
            f"unknown emotion label {emotion!r}; expected one of the 32 EmpatheticDialogues labels"
        ) from None


def check_plans(plans) -> tuple[tuple[str, str], ...]:
    """Reply plans as (primary, secondary) pairs of STRATEGIES, in order and without repeats; ValueError names
    the first bad entry. Accepts pairs or "ER+EX" strings (the manifest's spelling)."""
    if isinstance(plans, (str, bytes)) or not hasattr(plans, "__iter__"):
        raise ValueError(f"plans must be a list of (primary, secondary) pairs, not {type(plans).__name__}")
    out: list[tuple[str, str]] = []
    for entry in plans:
        pair = tuple(entry.split("+")) if isinstance(entry, str) else tuple(entry) if hasattr(entry, "__iter__") else ()
        if len(pair) != 2 or any(p not in STRATEGIES for p in pair):
            raise ValueError(f"plan {entry!r} is not a pair of {', '.join(STRATEGIES)} (e.g. \"ER+EX\")")
        if pair not in out:
            out.append(pair)
    return tuple(out)


# A fitted table of reply openers as an artifact stores it (the compact writer's, trace_dspy.compact.openers).
OPENER_VALENCES = ("positive", "negative", "any")
MAX_OPENERS = 8
MAX_OPENER_CHARS = 40


def check_openers(openers) -> dict[str, dict[str, tuple[str, ...]]]:
    """Fitted openers as stored (valence -> mechanism -> openers, best first), checked; ValueError says what
    is wrong. Mechanisms a valence leaves out keep the stock openers."""
    if not isinstance(openers, dict):
        raise ValueError(f"reply openers must be a table of valences, not {type(openers).__name__}")
    checked: dict[str, dict[str, tuple[str, ...]]] = {}
    for valence, table in openers.items():
        if valence not in OPENER_VALENCES:
            raise ValueError(f"reply openers: unknown valence {valence!r}; expected {', '.join(OPENER_VALENCES)}")
        if not isinstance(table, dict):
            raise ValueError(f"reply openers[{valence!r}] must be a table of mechanisms")
        checked[valence] = {}
        for kind, options in table.items():
            if kind not in STRATEGIES:
                raise ValueError(f"reply openers[{valence!r}]: unknown mechanism {kind!r}; expected ER, IP or EX")
            if isinstance(options, str) or not isinstance(options, (list, tuple)) \
                    or not 1 <= len(options) <= MAX_OPENERS \
                    or not all(isinstance(o, str) and o.strip() and len(o) <= MAX_OPENER_CHARS for o in options):
                raise ValueError(f"reply openers[{valence!r}][{kind!r}] must be a list of 1 to {MAX_OPENERS} "
                                 f"non-empty strings of at most {MAX_OPENER_CHARS} characters")
            checked[valence][kind] = tuple(o.strip() for o in options)
    return checked
