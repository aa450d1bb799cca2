#!/usr/bin/env python
"""Paired comparison of two bench quality row files of the same items (``quality_rows/*.jsonl``).

Usage: compare_rows.py TREATMENT.jsonl CONTROL.jsonl OUT.json
Writes, for the composite and each metric component, the mean difference (treatment - control) with its
paired 95% bootstrap interval, and the mean seconds, LM calls and reply candidates of each side.
"""
import json
import sys

from trace_dspy.optimize.scorers import paired_bootstrap_ci


def rows(path):
    return {r["id"]: r for r in map(json.loads, open(path, encoding="utf-8")) if "score" in r}


def main(treatment_path, control_path, out_path):
    treatment, control = rows(treatment_path), rows(control_path)
    ids = sorted(set(treatment) & set(control))
    metrics = {"composite": lambda r: r["score"]}
    for name in ("empathy", "strategy_fit", "relevance", "rules", "similarity"):
        metrics[name] = lambda r, name=name: r["components"][name]
    diffs = {}
    for name, value in metrics.items():
        mean, low, high = paired_bootstrap_ci([value(treatment[i]) for i in ids], [value(control[i]) for i in ids])
        diffs[name] = {"mean": round(mean, 4), "low": round(low, 4), "high": round(high, 4)}

    def cost(side):
        n = len(ids)
        return {"seconds": round(sum(side[i]["seconds"] for i in ids) / n, 3),
                "lm_calls": round(sum(side[i]["lm_calls"] for i in ids) / n, 2),
                "candidates": round(sum(len(side[i]["prediction"].get("reply_rewards") or []) for i in ids) / n, 2)}
    record = {"command": " ".join(["python", "docs/bench/lean/compare_rows.py", *sys.argv[1:]]), "items": len(ids),
              "treatment": treatment_path, "control": control_path, "difference": diffs,
              "cost": {"treatment": cost(treatment), "control": cost(control)}}
    with open(out_path, "w", encoding="utf-8") as fh:
        json.dump(record, fh, indent=1)
    print(json.dumps(record, indent=1))


if __name__ == "__main__":
    main(*sys.argv[1:4])
