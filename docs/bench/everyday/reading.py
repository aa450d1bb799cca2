"""A person's reading of the everyday replies: is each one sendable to a friend as it is, and is its tone wrong?

The verdicts are one developer's reading (written down item by item below, with the reason for each "no"); the
script joins them to the replies and counts, so that the numbers in docs/results/replies.md come from one
place. Usage (from the repository root):

    python docs/bench/everyday/reading.py docs/bench/everyday/reading.json

Standard: a reply is sendable when a friend could send it as it is without it reading as a misreading, a
non sequitur or broken English; a slightly clumsy but fitting wording passes. Wrong tone: cheering bad news or
condoling good news.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from collections import Counter
from pathlib import Path

HERE = Path(__file__).parent

# The replies read: a file that changed since is refused (its verdicts would be for other replies).
READ = {"replies-3-bands.jsonl": "7941145635242333", "replies-3-now.jsonl": "b9c0fc56f59401c7",
        "replies-4-before.jsonl": "bfae2b06ea3bce4d", "replies-4-questions.jsonl": "9006abea941bb59b",
        "replies-4-now.jsonl": "f32ab47d3e4946c6",
        "replies-5-old.jsonl": "0f893d9ffae2d2aa", "replies-5-before.jsonl": "a3daae1103e79935",
        "replies-5-now.jsonl": "41c6ba584bc265bf",
        "replies-3-threshold.jsonl": "73ec06d939d391f5", "replies-4-threshold.jsonl": "4016ac7333c245d4",
        "replies-6-old.jsonl": "339717e3d6f24c9c", "replies-6-now.jsonl": "3d65fbaca9e0e70f"}

# reply file -> {line index: (sendable, wrong tone, reason)}; lines not listed are sendable, in the right tone.
NOT_SENDABLE = {
    "replies-3-bands.jsonl": {
        0: (False, False, "asks how they did not know it would happen"),
        2: (False, False, "'proud of yourself' for adopting a puppy"),
        13: (False, False, "incoherent: 'a coworker', an idea about a guest"),
        14: (False, False, "asks about the store, not the teacher"),
        18: (False, True, "condoles a finished puzzle ('I'm so sorry to hear that')"),
    },
    "replies-3-now.jsonl": {
        0: (False, False, "asks how they did not know it would happen"),
        2: (False, False, "'proud of yourself' for adopting a puppy"),
        13: (False, False, "incoherent: 'that must be affecting you, a coworker'"),
        14: (False, False, "asks about the store, not the teacher"),
    },
    "replies-4-before.jsonl": {
        2: (False, False, "broken: 'That must be so, your daughter's first word'"),
        10: (False, True, "'That sounds amazing' to a coffee shop that closed"),
        13: (False, False, "'your dog': it is the neighbour's"),
        18: (False, False, "'What happened to it?' about a recipe that worked"),
        20: (False, True, "'That must be so frustrating' to a stranger's kindness"),
        23: (False, False, "asks about a brother's wedding nobody mentioned"),
        24: (False, True, "'I'm so sorry to hear about your sister's wedding'"),
        26: (False, False, "asks about a daughter nobody mentioned"),
        28: (False, False, "'What happened to them?' about the kids who made breakfast"),
        29: (False, False, "'nostalgic' for moving back home after losing a job"),
    },
    "replies-4-questions.jsonl": {
        1: (False, False, "a nursing career 'dedicated to your health'"),
        2: (False, False, "broken: 'That must be so, your daughter's first word'"),
        10: (False, False, "asks about 'the company', not the coffee shop"),
        13: (False, False, "'your dog': it is the neighbour's"),
        20: (False, True, "'That sounds like a really bad thing' to a stranger's kindness"),
        23: (False, False, "'How are you holding up your end?'"),
        26: (False, False, "a rambling question about luck and doing things your way"),
        29: (False, False, "'nostalgic' for moving back home after losing a job"),
    },
    "replies-4-now.jsonl": {
        1: (False, False, "a nursing career 'dedicated to your health'"),
        10: (False, False, "asks about 'the company', not the coffee shop"),
        20: (False, True, "'That must be so frustrating' to a stranger's kindness"),
        24: (False, True, "'I'm so sorry to hear about your sister's wedding'"),
        26: (False, False, "a rambling question about luck and doing things your way"),
        29: (False, False, "'nostalgic' for moving back home after losing a job"),
    },
    # Twenty messages written before the reply stage changed again, read only after the runs: the program before
    # the tone work (commit 241a2e6), at the start of the last change, and now.
    "replies-5-old.jsonl": {
        3: (False, True, "'That sounds like a nightmare' to expecting twins"),
        4: (False, False, "'What happened to those kids?' to a broken wrist"),
        5: (False, False, "asks a grandchild how many years they have been married"),
        6: (False, False, "'What happened to those keys?': they said they lost them"),
        12: (False, False, "'What happened to that project?': they said it was cancelled"),
        14: (False, False, "'What happened to those delicious turkey legs?' to a burned turkey"),
        15: (False, False, "broken: 'the letter, a lost letter?'"),
        18: (False, False, "broken: 'That sounds great, Mrs.'"),
    },
    "replies-5-before.jsonl": {
        0: (False, False, "'your car's financial struggles'"),
        1: (False, False, "'your dad's victory': the speaker won"),
        3: (False, False, "'proud of yourself' for expecting twins"),
        4: (False, False, "asks about the kids, not the broken wrist"),
        13: (False, False, "a graduation called 'your brother's career'; 'see him go'"),
        14: (False, False, "a burned turkey read as a wedding"),
        15: (False, True, "condoles a letter from an old friend; 'How did you know I'd send you a letter?'"),
        18: (False, False, "broken: 'That sounds great, Mrs.'"),
        19: (False, False, "'your team' to someone who did not make the team"),
    },
}
# The second run differs in one reply (line 14 gained "How are you holding up?"); the verdicts are the same.
NOT_SENDABLE["replies-5-now.jsonl"] = dict(NOT_SENDABLE["replies-5-before.jsonl"])
# The tuning messages with a Best-of-N threshold of 0.7 (respond_threshold.py; not kept).
NOT_SENDABLE["replies-3-threshold.jsonl"] = {
    0: (False, False, "'You must be feeling too proud, ain't ya?'"),
    4: (False, False, "'a sweet treat' for tomatoes that came up"),
    11: (False, False, "'That must be so hard on you, my cat.': speaks as the speaker"),
    13: (False, False, "incoherent: 'that must be affecting you, a coworker'"),
    14: (False, False, "'How did she remember me?': speaks as the speaker"),
}
NOT_SENDABLE["replies-4-threshold.jsonl"] = {
    0: (False, False, "a rambling question about driving three hours without a tow truck"),
    1: (False, False, "a nursing career 'dedicated to your health'"),
    3: (False, False, "'Oh, wow, wow. How did you get married?' to an ex's wedding"),
    10: (False, False, "'How are you feeling about the new one?' to a coffee shop that closed"),
    20: (False, False, "'That sounds really weird. How did you get your card?'"),
    24: (False, True, "'I'm so sorry to hear about your sister's wedding'"),
    26: (False, False, "a rambling question about luck and doing things your way"),
    29: (False, False, "'That sounds like it happened a while ago. How did you move back in?'"),
}
# Twenty more, written before a change that was then not kept, read after both runs: the program before the tone
# work (commit 241a2e6) and now.
NOT_SENDABLE["replies-6-old.jsonl"] = {
    0: (False, False, "'proud of yourself' for a daughter's job offer"),
    2: (False, True, "'I'm so sorry for your loss' to a bakery that remembered them"),
    6: (False, False, "'I'm so glad you enjoyed my chili': speaks as the speaker"),
    9: (False, False, "condoles the son's pain: he is the one bullying"),
    10: (False, False, "'How did you find me?'"),
    12: (False, False, "'a sweet treat' for a returned wallet"),
    15: (False, False, "'a tough decision' for jury duty"),
    16: (False, False, "'my dad', 'How are you feeling about me?': speaks as the speaker"),
    17: (False, False, "'so brave!' then 'that is a shame'"),
}
NOT_SENDABLE["replies-6-now.jsonl"] = {
    1: (False, False, "broken: 'a beautiful cedar cedar cedar cedar'"),
    7: (False, False, "'your roommate's situation': the rent is the speaker's problem"),
    9: (False, False, "reads the son as bullied, not bullying"),
    12: (False, False, "'nostalgic' for a returned wallet"),
    14: (False, True, "'I'm so sorry to hear about your cat' to newborn kittens"),
    16: (False, False, "'You must be feeling lost' to a father who misses them"),
}


def main(out: str) -> None:
    record = {"command": f"python docs/bench/everyday/reading.py {out}",
              "standard": __doc__.split("Standard: ")[1].strip(),
              "files": {}}
    for name, verdicts in NOT_SENDABLE.items():
        data = (HERE / name).read_bytes()
        if hashlib.sha256(data).hexdigest()[:16] != READ[name]:
            sys.exit(f"{name} is not the file that was read; read its replies again and update the verdicts")
        rows = [json.loads(line) for line in data.decode("utf-8").splitlines() if line.strip()]
        items = []
        for i, row in enumerate(rows):
            sendable, wrong_tone, reason = verdicts.get(i, (True, False, ""))
            items.append({"message": row["dialogue"].removeprefix("Speaker: "), "reply": row["response"],
                          "sendable": sendable, "wrong_tone": wrong_tone, **({"reason": reason} if reason else {})})
        openings = Counter(" ".join(re.findall(r"[a-z']+", i["reply"].lower())[:2]) for i in items)
        record["files"][name] = {"replies": len(items), "sendable": sum(i["sendable"] for i in items),
                                 "wrong_tone": sum(i["wrong_tone"] for i in items),
                                 "most_common_opening": list(openings.most_common(1)[0]), "items": items}
    Path(out).write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    for name, summary in record["files"].items():
        opening, uses = summary["most_common_opening"]
        print(f"{name}: {summary['sendable']}/{summary['replies']} sendable, "
              f"{summary['wrong_tone']} in the wrong tone, most common opening {opening!r} in {uses}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
