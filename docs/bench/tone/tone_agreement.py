#!/usr/bin/env python
"""Tone agreement of bench quality rows: the share of replies whose tone (the shipped tone head's P(pleasant),
on which side of 0.5) is the one the gold emotion's valence asks for, and the one the predicted emotion's asks for.

Usage: tone_agreement.py OUT.json ROWS.jsonl [ROWS.jsonl ...]
Reads rows written before the tone head existed as well as after (it scores the replies itself).
"""
import json
import sys

from trace_dspy.core.openers import emotion_valence
from trace_dspy.optimize.tone import shared_tone


def agreement(path):
    rows = [r for r in map(json.loads, open(path, encoding="utf-8")) if "score" in r]
    pleasant = shared_tone().pleasant_batch([r["prediction"]["response"] for r in rows])

    def rate(valences):
        pairs = [(p, v) for p, v in zip(pleasant, valences) if v != "any"]
        return round(sum((p > 0.5) == (v == "positive") for p, v in pairs) / len(pairs), 4), len(pairs)

    gold, n_gold = rate([emotion_valence(r.get("gold_emotion")) for r in rows])
    predicted, n_pred = rate([emotion_valence(r["prediction"].get("emotion")) for r in rows])
    return {"rows": path, "gold_valence": gold, "gold_n": n_gold, "predicted_valence": predicted,
            "predicted_n": n_pred}


def main(out_path, *paths):
    record = {"command": " ".join(["python", *sys.argv]), "results": [agreement(p) for p in paths]}
    with open(out_path, "w", encoding="utf-8") as fh:
        json.dump(record, fh, indent=1)
    for r in record["results"]:
        print(r)


if __name__ == "__main__":
    main(*sys.argv[1:])
