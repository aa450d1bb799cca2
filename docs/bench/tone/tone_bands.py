"""How sure the emotion prior is of a situation's tone: precision and coverage of the tone bands.

For single-turn ED situations whose conversation emotion has a clear tone (``tone_valence``), the default
program's prior gives a pleasantness (``TraceProgram.situation_pleasant``); a band is right when its tone is
the gold emotion's. The bounds were chosen on the validation split, whose dialogues the shipped prior was
fitted on; the test split's situations are held out from it, and their precision is the one to expect.
Usage (from the repository root):

    python docs/bench/tone/tone_bands.py ../shared/data/empathetic_dialogues docs/bench/tone/tone-bands.json
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import trace_dspy
from trace_dspy.compact.openers import PLEASANT_AT_LEAST, UNPLEASANT_AT_MOST
from trace_dspy.optimize.tone import tone_valence
from trace_dspy.compact.reply_text import tidy_text

LIMIT = 700


def main(data: str, out: str) -> None:
    program = trace_dspy.load("trace-dspy@v6")
    record = {"command": f"python docs/bench/tone/tone_bands.py {data} {out}", "program": "trace-dspy@v6"}
    for split, role in (("valid", "the bounds were chosen here; the prior was fitted on these dialogues"),
                        ("test", "held out from the prior")):
        record[split] = {"role": role, **_bands(program, Path(data) / f"{split}.csv")}
    Path(out).write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps({split: record[split]["shipped"] for split in ("valid", "test")}, indent=1))


def _bands(program, path: Path) -> dict:
    with open(path, newline="", encoding="utf-8") as handle:
        rows = [r for r in csv.DictReader(handle) if r["turns"] == "1" and tone_valence(r["dialogue_emotion"]) != "any"]
    rows = rows[:LIMIT]
    scored = [(program.situation_pleasant("Speaker: " + tidy_text(r["text"])),
               tone_valence(r["dialogue_emotion"]) == "positive") for r in rows]

    def band(test, pleasant: bool) -> dict:
        hits = [gold for p, gold in scored if p is not None and test(p)]
        right = sum(gold == pleasant for gold in hits)
        return {"coverage": round(len(hits) / len(scored), 4),
                "precision": round(right / len(hits), 4) if hits else None,
                "n": len(hits)}

    return {
        "situations": len(scored),
        "pleasant_share": round(sum(g for _, g in scored) / len(scored), 4),
        "shipped": {"unpleasant_at_most": UNPLEASANT_AT_MOST, "pleasant_at_least": PLEASANT_AT_LEAST,
                    "unpleasant": band(lambda p: p <= UNPLEASANT_AT_MOST, False),
                    "pleasant": band(lambda p: p >= PLEASANT_AT_LEAST, True)},
        "unpleasant_at_most": {str(t): band(lambda p, t=t: p <= t, False) for t in (0.1, 0.15, 0.2, 0.25, 0.3, 0.35)},
        "pleasant_at_least": {str(t): band(lambda p, t=t: p >= t, True) for t in (0.6, 0.65, 0.7, 0.75, 0.8, 0.85)},
    }


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
