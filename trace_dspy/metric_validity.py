"""Does the empathy metric measure what it claims? An AUC study on ED test items.

    python -m trace_dspy.metric_validity --data ../shared/data/empathetic_dialogues --limit 500 --judge-limit 100

For each test item the gold reply is the positive. Two kinds of negative:
``mismatched`` (the gold reply of a different conversation) and ``bland``
("I see.", "That's nice." ...). For every metric component, the AUC is the
probability that the positive scores above the negative. Reference-based
components compare with the gold reply itself, so for them the positive is
the reference and their AUC is 1 by construction; they are listed for
completeness and kept apart from the reference-free components, which are the
real test. The LM judge is run on the first ``--judge-limit`` items.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

import dspy

from trace_dspy.cli import add_model_args, progress, settings_from_args, setup_logging
from trace_dspy.data import load_test
from trace_dspy.optimize.metric import EmpathyMetric, MetricConfig, weighted_mean
from trace_dspy.optimize.scorers import auc, rouge_l, sentence_bleu, token_f1

BLAND = ("I see.", "That's nice.", "Okay.", "Interesting.", "I understand.", "Cool.", "Alright then.", "Hmm, okay.")
REFERENCE_BASED = ("similarity", "token_f1", "rouge_l", "bleu2")
REFERENCE_FREE = ("rules", "relevance", "judge")


def component_scores(metric: EmpathyMetric, example: dspy.Example, reply: str, judge=None) -> dict[str, float]:
    pred = dspy.Prediction(response=reply, emotion=example.emotion)
    scored = metric.evaluate(example, pred)
    out = {k: v for k, v in scored.components.items() if v is not None and k != "emotion"}
    out.update(token_f1=token_f1(example.response, reply), rouge_l=rouge_l(example.response, reply),
               bleu2=sentence_bleu(example.response, reply, 2))
    if judge is not None:
        out["judge"] = judge(dialogue=example.dialogue, reply=reply).score
    return out


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="python -m trace_dspy.metric_validity", description=__doc__.split("\n\n")[0])
    parser.add_argument("--data")
    parser.add_argument("--limit", type=int, default=500)
    parser.add_argument("--judge-limit", type=int, default=100, help="items scored by the LM judge (0: none)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", type=Path, help="write the results as JSON")
    add_model_args(parser)
    args = parser.parse_args(argv)
    setup_logging()
    settings = settings_from_args(args)
    examples = load_test(args.data, view="trace", limit=args.limit, seed=args.seed)
    n = len(examples)
    metric = EmpathyMetric(MetricConfig())
    judge = None
    if args.judge_limit:
        from trace_dspy.lms import LMSet
        from trace_dspy.optimize.judge import EmpathyJudge

        judge = EmpathyJudge(lm=LMSet(settings.lm).role("judge"))

    conditions = {"gold": [], "mismatched": [], "bland": []}
    for i, ex in enumerate(progress(examples, desc="scoring")):
        other = examples[(i + n // 2) % n]
        use_judge = judge if i < args.judge_limit else None
        conditions["gold"].append(component_scores(metric, ex, ex.response, use_judge))
        conditions["mismatched"].append(component_scores(metric, ex, other.response, use_judge))
        conditions["bland"].append(component_scores(metric, ex, BLAND[i % len(BLAND)], use_judge))

    default_weights = {k: v for k, v in MetricConfig().weights().items() if k != "emotion"}
    free_weights = {"rules": 0.5, "relevance": 0.5}
    free_judge_weights = {"rules": 0.3, "relevance": 0.3, "judge": 0.4}
    for rows in conditions.values():
        for r in rows:
            r["composite (default weights, emotion excluded)"] = weighted_mean(r, default_weights)
            r["composite (reference-free: rules + relevance)"] = weighted_mean(r, free_weights)
            if "judge" in r:
                r["composite (reference-free with judge)"] = weighted_mean(r, free_judge_weights)

    free = [k for k in REFERENCE_FREE if judge is not None or k != "judge"]
    names = [*REFERENCE_BASED, *free, *[k for k in conditions["gold"][0] if k.startswith("composite")]]
    if judge is not None and "composite (reference-free with judge)" not in names:
        names.append("composite (reference-free with judge)")
    table = []
    for name in names:
        row = {"component": name, "kind": "reference-based" if name in REFERENCE_BASED or "default" in name
               else "reference-free"}
        for neg in ("mismatched", "bland"):
            pairs = [(g[name], b[name]) for g, b in zip(conditions["gold"], conditions[neg])
                     if g.get(name) is not None and b.get(name) is not None]
            row[f"auc_vs_{neg}"] = auc([p for p, _ in pairs], [q for _, q in pairs]) if pairs else None
            row["n"] = len(pairs)
        row["mean_gold"] = sum(g[name] for g in conditions["gold"] if g.get(name) is not None) / max(1, row["n"])
        table.append(row)

    print("| component | kind | n | AUC vs mismatched | AUC vs bland | mean (gold) |\n| --- | --- | ---: | ---: | ---: | ---: |")
    for row in table:
        cells = [f"{row[k]:.3f}" if isinstance(row.get(k), float) else "-" for k in
                 ("auc_vs_mismatched", "auc_vs_bland", "mean_gold")]
        print(f"| {row['component']} | {row['kind']} | {row['n']} | " + " | ".join(cells) + " |")
    print(f"\nsimilarity: {metric.similarity_kind}; judge LM: {settings.lm.for_role('judge').model if judge else 'none'}")
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps({
            "command": "python -m trace_dspy.metric_validity " + shlex.join(argv), "items": n,
            "judge_items": min(args.judge_limit, n), "similarity_kind": metric.similarity_kind, "table": table,
        }, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
