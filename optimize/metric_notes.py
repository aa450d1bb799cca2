"""The empathy metric's notes on a scored reply: what to fix, in words.

``EmpathyMetric`` joins them into its feedback, and hands a reflecting optimizer
(GEPA) only the kinds of note the stage it reflects on can act on.
"""

from __future__ import annotations

from typing import Any

from trace_dspy.core.labels import EMOTION_TO_GROUP, STRATEGIES
from trace_dspy.optimize.scorers import sentence_count
from trace_dspy.optimize.tokens import content_words

_MISSING = {
    "ER": "shows no warmth or concern (no emotional reaction)",
    "IP": "shows no understanding of what the speaker feels or went through (no interpretation)",
    "EX": "asks nothing (no gentle question about their experience)",
}
# Below this expected level (of 2) a planned mechanism counts as missing from the reply.
MISSING_LEVEL = 0.8


def prediction_field(pred, name):
    """A field of a prediction, read as a key or an attribute; None when it has neither."""
    try:
        return pred[name]
    except (KeyError, TypeError, AttributeError):
        return getattr(pred, name, None)


def reply_notes(example, pred, speaker: str, components: dict[str, float | None],
                rules: dict[str, bool], details: dict[str, Any]) -> list[tuple[str, str]]:
    """What the reply should fix, as (kind, text) pairs: the emotion, a copy or parrot, a situation that is not
    the speaker's, a planned mechanism the reply lacks, length, detail, advice, distance from the gold reply
    and the judge's word, each from the scores and details ``EmpathyMetric.evaluate`` worked out."""
    notes: list[tuple[str, str]] = []
    gold, predicted = example.get("emotion"), prediction_field(pred, "emotion")
    if gold and predicted != gold:
        same_group = EMOTION_TO_GROUP.get(predicted) == EMOTION_TO_GROUP.get(gold)
        notes.append(("emotion", f"Wrong emotion: predicted '{predicted}' but the speaker feels '{gold}'"
                     + (" (same Ekman group, half credit)." if same_group else
                        f" (group {EMOTION_TO_GROUP.get(gold)}, not {EMOTION_TO_GROUP.get(predicted)}).")))
    reply = prediction_field(pred, "response") or ""
    if not rules["not_parroting"]:
        notes.append(("parrot", "The reply repeats the speaker's words; answer them as the listener instead."))
    if details.get("repeats_listener"):
        notes.append(("copy", f"The reply says again what the listener said before (\"{details['copied'][:80]}\"); "
                              "answer the speaker's new words."))
    elif "copied" in details:
        notes.append(("copy", f"The reply copies an example's reply (\"{details['copied'][:80]}\"); "
                              "write new words for this speaker's situation."))
    if "brings_in" in details:
        notes.append(("unrelated", f"The reply speaks of \"{details['brings_in']}\", whom the dialogue never "
                                   "mentions; talk about the speaker's own situation."))
    if "takes_theirs" in details:
        notes.append(("unrelated", f"The reply says \"{details['takes_theirs']}\" of what the speaker spoke of as "
                                   "someone else's; say whose it is as they did."))
    if components.get("grounded") is not None and 0 < components["grounded"] < 1:
        notes.append(("unrelated", "The reply is not about what the speaker said; refer to their situation."))
    levels = details.get("levels")
    if levels:
        planned = (prediction_field(pred, "strategy"), prediction_field(pred, "secondary_strategy"))
        plan = [s for s in planned if s in STRATEGIES]
        for mech in dict.fromkeys(plan):
            if levels[mech] < MISSING_LEVEL:
                notes.append(("strategy", f"The plan said {mech} but the reply {_MISSING[mech]}."))
        if not plan and components.get("empathy") is not None and components["empathy"] < 0.2:
            weakest = min(STRATEGIES, key=levels.get)
            notes.append(("empathy", f"Little empathy: the reply {_MISSING[weakest]}."))
    if not rules["brief"]:
        notes.append(("length", f"Length: the reply has {sentence_count(reply)} sentences; use one or two short ones."))
    if not rules["reuses_detail"]:
        words = sorted(content_words(speaker))[:5]
        notes.append(("detail", "Missing detail: reuse a concrete detail from the speaker's words"
                      + (f" (for example: {', '.join(words)})." if words else ".")))
    if not rules["no_advice"]:
        notes.append(("advice", "Unsolicited advice: do not tell the speaker what to do; respond to the feeling."))
    sim = components.get("similarity")
    if sim is not None and sim < 0.3 and example.get("response"):
        notes.append(("similarity", f"Far from a good reference reply such as: \"{example.response}\""))
    if "judge" in details:
        notes.append(("judge", f"Judge: {details['judge']['justification']}"))
    return notes
