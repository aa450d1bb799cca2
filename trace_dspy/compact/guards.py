"""The compact writer's reply guards: a reply that speaks as the speaker, or of a situation that is not theirs.

Each guard takes the reply and the dialogue's turns and returns the words that
gave it away ("my grandma", "your brother", "your dog"), else None. They read
words only, no model. ``GUARDS`` hands them to the metric (its ``guards``): the
compact writer's reward scores a candidate they catch 0
(docs/reference/metric.md, "Guards of the reply reward").
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from trace_dspy.optimize.tokens import STOPWORDS, WORD_CHAR, tokenize

# Words that make a span the speaker's own voice when the listener repeats it ("I'm so nervous about my exam").
FIRST_PERSON = frozenset({"i", "'m", "me", "my", "mine", "myself", "we", "our", "us"})
ECHO_SPAN = 5


def _words(text: str) -> list[str]:
    """The word tokens of ``text`` (punctuation dropped; "'m" kept, it marks the first person)."""
    return [t for t in tokenize(text) if WORD_CHAR.search(t) or t == "'m"]


def echoed_span(reply: str, speaker_turns: Sequence[str], min_words: int = ECHO_SPAN) -> list[str] | None:
    """The longest run of at least ``min_words`` words that the reply repeats verbatim from a speaker turn
    and that speaks in the first person (the listener talking as the speaker), else None."""
    mine = _words(reply)
    best: list[str] | None = None
    for turn in speaker_turns:
        theirs = _words(turn)
        # Longest common contiguous run (dynamic programming over two short word lists).
        prev = [0] * (len(theirs) + 1)
        for i in range(1, len(mine) + 1):
            cur = [0] * (len(theirs) + 1)
            for j in range(1, len(theirs) + 1):
                if mine[i - 1] == theirs[j - 1]:
                    cur[j] = prev[j - 1] + 1
                    span = mine[i - cur[j]:i]
                    if cur[j] >= min_words and FIRST_PERSON & set(span) and (best is None or len(span) > len(best)):
                        best = span
            prev = cur
    return best


_VOCATIVE = re.compile(r",\s*(?:my\s+)?([a-z]+)\s*[.!?]", re.IGNORECASE)


def claims_their_own(reply: str, speaker_turns: Sequence[str]) -> str | None:
    """A reply that opens with "my grandma", or calls the speaker "my son" or "grandma" (", my son.", ", grandma?"),
    to a speaker who said "my grandma" or "my son": the listener talking as the speaker about the speaker's own
    person or thing. Returns the phrase, else None.

    Only the opening and the address count: elsewhere in a reply "my mum" is
    usually the listener's own story ("I lost my mum too"), which human raters
    score as empathy.
    """
    def pairs(tokens: list[str]) -> set[str]:
        return {f"my {w}" for a, w in zip(tokens, tokens[1:]) if a == "my" and w not in STOPWORDS}

    opening = pairs(_words(reply)[:2]) | {f"my {w.lower()}" for w in _VOCATIVE.findall(reply)}
    theirs = set().union(*(pairs(_words(t)) for t in speaker_turns))
    said = sorted(opening & theirs)
    return said[0] if said else None


# The relatives a reply may call "your ..." and the words that show the dialogue knows them: "your mom" needs a
# mother, a parent or a mom in it; "your family" any relative. A small writer brings in relatives nobody
# mentioned ("How are you feeling about your brother's wedding?" to a delayed flight). Friends, bosses and
# neighbours are left out: "your new boss" to someone starting a job assumes nothing.
_PARENTS = ("parent", "parents", "mom", "mother", "mum", "mommy", "mama", "dad", "father", "daddy", "papa")
_CHILDREN = ("child", "children", "kid", "kids", "son", "sons", "daughter", "daughters", "baby", "babies", "toddler",
             "boy", "boys", "girl", "girls", "newborn", "infant", "teen", "teenager", "pregnant", "ultrasound",
             "stepson", "stepdaughter")
_PARTNERS = ("partner", "spouse", "husband", "hubby", "wife", "boyfriend", "girlfriend", "fiance", "fiancee",
             "bf", "gf")
_GRANDPARENTS = ("grandparents", "grandma", "grandmother", "granny", "nana", "grandpa", "grandfather", "granddad")
_RELATIVES = (*_PARENTS, *_CHILDREN, *_PARTNERS, *_GRANDPARENTS, "family", "brother", "brothers", "sister",
              "sisters", "sibling", "siblings", "aunt", "uncle", "cousin", "cousins", "niece", "nephew", "relatives",
              "inlaws", "grandson", "granddaughter", "grandkids", "grandchildren")
_KNOWN_BY = {
    **{w: _PARENTS for w in ("parent", "parents")},
    **{w: ("mom", "mother", "mum", "mommy", "mama", "ma", "parent", "parents") for w in
       ("mom", "mother", "mum", "mommy", "mama")},
    **{w: ("dad", "father", "daddy", "papa", "pa", "parent", "parents") for w in ("dad", "father", "daddy", "papa")},
    **{w: _CHILDREN for w in ("child", "children", "kid", "kids", "baby")},
    "son": ("son", "sons", "boy", "boys", "child", "children", "kid", "kids", "baby", "teen", "teenager", "stepson"),
    "daughter": ("daughter", "daughters", "girl", "girls", "child", "children", "kid", "kids", "baby", "teen",
                 "teenager", "stepdaughter"),
    **{w: _PARTNERS for w in ("partner", "spouse")},
    "husband": ("husband", "hubby", "spouse", "partner"),
    "wife": ("wife", "spouse", "partner"),
    "boyfriend": ("boyfriend", "bf", "partner"),
    "girlfriend": ("girlfriend", "gf", "partner"),
    "brother": ("brother", "brothers", "bro", "sibling", "siblings"),
    "sister": ("sister", "sisters", "sis", "sibling", "siblings"),
    "grandparents": _GRANDPARENTS,
    **{w: ("grandma", "grandmother", "granny", "nana", "grandparents") for w in ("grandma", "grandmother")},
    **{w: ("grandpa", "grandfather", "granddad", "grandparents") for w in ("grandpa", "grandfather")},
    "family": _RELATIVES,
    **{w: (w,) for w in ("aunt", "uncle", "cousin", "niece", "nephew")},
}


def brings_in_relative(reply: str, turns: Sequence[str]) -> str | None:
    """A reply that speaks of "your brother" (or "your little brother") to a dialogue in which no brother, nor
    anyone who could be him, appears: the listener talking about someone else's situation. Returns the phrase,
    else None. ``turns`` are the dialogue's turns, the listener's included."""
    said = re.findall(r"[a-z]+", " ".join(turns).lower())
    known = {*said, *(w[:-1] for w in said if w.endswith("s"))}  # "my dads place", "my moms decor"
    words = re.findall(r"[a-z]+", reply.lower())
    for i, word in enumerate(words):
        if word != "your":
            continue
        for look in words[i + 1:i + 3]:  # "your brother", "your little brother"
            person = look if look in _KNOWN_BY else look[:-1] if look.endswith("s") and look[:-1] in _KNOWN_BY \
                else None
            if person is not None:
                if not known & set(_KNOWN_BY[person]):
                    return f"your {look}"
                break
    return None


# Who a thing belongs to, read from the words before it: "my old cat" is the speaker's, "my neighbor's dog" and
# "her dog" someone else's, "the dog" nobody's in particular.
_SPEAKERS_OWN = frozenset(("my", "our", "mine", "ours"))
_OTHERS_OWN = frozenset(("his", "her", "their", "its"))
_NO_OWNER = frozenset(("the", "a", "an", "this", "that", "these", "those", "some", "any", "every", "no"))
_IS_NOT_WHOSE = frozenset(("it's", "that's", "he's", "she's", "there's", "here's", "what's", "who's", "where's",
                           "let's"))
_OWNED_TOKEN = re.compile(r"[a-z]+(?:'s|s')?")


def _owned_tokens(text: str) -> list[str]:
    # ED text splits the possessive off ("neighbor 's dog"); typed text keeps it ("neighbor's dog").
    return _OWNED_TOKEN.findall(text.lower().replace("\u2019", "'").replace(" 's", "'s"))


def _owner_word(word: str) -> str:
    return word[:-2] if word.endswith("'s") else word[:-1] if word.endswith("s'") else word


def takes_theirs(reply: str, speaker_turns: Sequence[str]) -> str | None:
    """A reply that calls "your X" what the speaker spoke of only as someone else's ("How are you feeling about
    your dog?" to "My neighbor's dog keeps barking"). Returns the phrase, else None. A thing the speaker never
    named, or named once as theirs or nobody's, is left alone."""
    said = [_owned_tokens(turn) for turn in speaker_turns]
    words = _owned_tokens(reply)
    for i, word in enumerate(words[:-1]):
        if word != "your":
            continue
        thing = _owner_word(words[i + 1])
        owners = []
        for turn in said:
            for j, token in enumerate(turn):
                if _owner_word(token) not in (thing, thing + "s") and _owner_word(token) + "s" != thing:
                    continue
                owner = None
                for before in reversed(turn[max(0, j - 3):j]):  # "my neighbor's dog", "my old cat"
                    if before in _SPEAKERS_OWN or before in _NO_OWNER:
                        owner = "speaker's or nobody's"
                    elif before in _OTHERS_OWN or before != _owner_word(before) and before not in _IS_NOT_WHOSE:
                        owner = "someone else's"
                    if owner:
                        break
                owners.append(owner)
        if owners and all(owner == "someone else's" for owner in owners):
            return f"your {words[i + 1]}"
    return None


class CompactGuards:
    """The guards as the metric takes them (``trace_dspy.optimize.metric.ReplyGuards``)."""

    # What the guards check changed: 2 added the relatives a dialogue never names, 3 the things the speaker
    # spoke of as someone else's. Stored rows scored with the guards of another version are scored again.
    version = 3

    @staticmethod
    def parrots(reply: str, turns: Sequence[str]) -> bool:
        """A first-person run of the speaker's words, or an opening "my ..." of theirs."""
        return echoed_span(reply, turns) is not None or claims_their_own(reply, turns) is not None

    brings_in_relative = staticmethod(brings_in_relative)
    takes_theirs = staticmethod(takes_theirs)


GUARDS = CompactGuards()
