"""The openers a scaffolded reply may begin its sentences with, and the valence of an emotion they must suit.

The stock openers, the pool a compile fits from (``trace_dspy.compact.opener_fit``), the check of a fitted
table as an artifact stores it, and which mechanisms a plan's two sentences take. The reply stage writes
with them in ``trace_dspy.compact.reply_text``; they sit below the optimizers, which fit them.
"""

from __future__ import annotations

# The scaffolded reply (reply_format "scaffold"): one sentence per planned mechanism, each begun with an
# opener the model goes on from. Asked for a whole reply, SmolLM2-135M mostly answers "I'm sorry for your
# loss." whatever happened (docs/results/replies.md, "Scaffolded replies"); begun with "You must be feeling" it
# names a fitting feeling itself ("... really disappointed." to a failed driving test). The first opener of
# each mechanism is the first reply's (in respond and chat the acknowledgement varies over the first
# ``opener_variety``); further candidates (rollout 1, 2, ...) take the next ones. No question begins "What
# happened": the speaker has just said what happened, and the model asked "What happened to them?" about a
# coffee shop that closed and "What happened to your grandma?" about her puzzle (docs/results/replies.md,
# "Questions").
SCAFFOLD_OPENERS = {
    "ER": ("That sounds", "Oh, that is", "Oh, wow"),
    "IP": ("You must be feeling", "I can imagine how", "That must be so"),
    "EX": ("How are you feeling", "How did", "How are you"),
}


# Where the emotion prior is sure of the situation's tone, the reply's acknowledgement opens in that tone and the
# model only names what it is about ("I'm so sorry to hear about" + "your cat."); its question takes that tone
# too (good news: "How does it feel" + "to win a local trivia night?"). Asked to go on from a neutral opener,
# SmolLM2-135M answers good and bad news alike with "That sounds ..."; a toned opener it goes on from freely
# ("Congratulations", "Wow, that") it often turns ("Wow, that's a shame"). The bands' bounds are the prior's
# situation pleasantness (``trace_dspy.optimize.tone.situation_pleasantness``), chosen on single-turn ED
# validation situations; on held-out test ones the bands' tone is right 95% (unpleasant) and 93% (pleasant) of
# the time (docs/results/replies.md, "Tone bands").
UNPLEASANT_AT_MOST = 0.2
PLEASANT_AT_LEAST = 0.75
BAND_OPENERS = {
    "pleasant": {
        "ER": ("That's wonderful news about", "I'm so happy to hear about", "That's great news about",
               "How lovely to hear about"),
        "EX": ("How does it feel", "How did you"),
    },
    "unpleasant": {
        "ER": ("I'm so sorry to hear about", "Oh no, I'm sorry about", "That's awful news about"),
        "EX": ("How are you feeling", "How are you holding up"),
    },
}
BAND_ACKNOWLEDGEMENTS = frozenset(o for table in BAND_OPENERS.values() for o in table["ER"])


# Question openers that are whole questions: the model is not asked to go on from them. What SmolLM2-135M added to
# "How are you holding up" mostly spoiled it ("... your end?", "... the road with that battery?", "... on the 60
# days?"; docs/results/replies.md, "Whole questions, broken openers and whose it is"); "How are you holding up?"
# is what a friend asks.
WHOLE_QUESTIONS = frozenset({"How are you holding up"})


def comma_may_follow(opener: str) -> bool:
    """May a continuation of ``opener`` begin with a comma? After an interjection ("Oh, wow" + ", that's great")
    it may; after the others the sentence breaks ("That must be so" + ", your daughter's first word, ...")."""
    last = opener.split()[-1].strip(",.!").lower() if opener.split() else ""
    return last in ("oh", "wow")


def tone_band(pleasant) -> str:
    """The tone band of a situation from its pleasantness (0 to 1; None, no prior: "mixed")."""
    if pleasant is None:
        return "mixed"
    if pleasant <= UNPLEASANT_AT_MOST:
        return "unpleasant"
    return "pleasant" if pleasant >= PLEASANT_AT_LEAST else "mixed"


# The openers a compile may choose from with --opener-items (trace_dspy.compact.opener_fit ranks them by the metric
# on training dialogues, separately for pleasant and unpleasant emotions, and stores the ranking in the
# artifact). The stock openers come first; the others range from neutral to toned, and a toned one may only
# answer its own valence (TONED_OPENERS).
OPENER_POOL = {
    "ER": ("That sounds", "Oh, that is", "Oh, wow", "I'm so", "Oh no, that sounds", "I'm so sorry", "That's so",
           "Wow, that", "I'm really glad"),
    "IP": ("You must be feeling", "I can imagine how", "That must be so", "It must be", "You must have been",
           "I know how", "That must have been"),
    "EX": ("How are you feeling", "What happened", "How did", "How are you", "What did you", "Do you",
           "How did you", "How are you holding up", "How does it feel"),
}
# Openers with a tone, and the only valence they may answer: nobody should hear "Oh no" about good news, whatever
# a metric says (the compile's first fit on ED ranked "Oh no, that sounds" first for pleasant emotions too, on
# the strength of a few dialogues). The others are neutral; the model gives them their tone.
TONED_OPENERS = {"Oh no, that sounds": "negative", "I'm so sorry": "negative",
                 "Wow, that": "positive", "I'm really glad": "positive"}


def opener_suits(opener: str, valence: str) -> bool:
    """May ``opener`` begin a reply to an emotion of ``valence`` ("any" takes neutral openers only)?"""
    tone = TONED_OPENERS.get(opener)
    return tone is None or tone == valence


# Fitted openers are kept per valence of the recognized emotion; "any" is the ranking over all dialogues, for an
# emotion outside the 32 labels.
_PLEASANT_GROUPS = ("happiness", "surprise")


def emotion_valence(emotion) -> str:
    """"positive" for the happiness and surprise groups, "negative" for the other four, "any" for no label."""
    from trace_dspy.core.labels import EMOTION_TO_GROUP

    group = EMOTION_TO_GROUP.get(str(emotion or "").strip().lower())
    if group is None:
        return "any"
    return "positive" if group in _PLEASANT_GROUPS else "negative"


def scaffold_kinds(inputs: dict) -> list[str]:
    """The mechanisms of a scaffolded reply's two sentences: the planned ones in order, the question (EX)
    last. A plan of one mechanism writes two of its sentences; a plan of questions only, or none (the
    strategy stage off), acknowledges first (ER)."""
    kinds = list(dict.fromkeys(s for s in (inputs.get("strategy"), inputs.get("secondary_strategy"))
                               if s in SCAFFOLD_OPENERS))
    if kinds in ([], ["EX"]):
        kinds = ["ER", "EX"]
    elif len(kinds) == 1:
        kinds = kinds * 2
    kinds.sort(key=lambda kind: kind == "EX")
    return kinds

