"""Does the empathy metric measure empathy? The validity study behind its weights.

    python -m trace_dspy.metric_validity --epitome ../shared/data/epitome \\
        --data ../shared/data/empathetic_dialogues --limit 500 --output docs/metric_validity.json

Three parts:

1. **Human ratings.** On the EPITOME posts held out from the scorer's fit (its
   recorded seed and split), every reference-free component is correlated
   (Spearman) with the human ER, IP and EX levels and their sum.
   ``strategy_fit`` is read with the plan set to the mechanism of the column.
2. **The scorer as a classifier** per mechanism: accuracy and macro-F1 next to
   the majority class and the published RoBERTa bi-encoder.
3. **Real against wrong replies on EmpatheticDialogues.** Each test item's gold
   reply is the positive; the negatives are a bland reply, another
   conversation's gold reply (mismatched), the speaker's own last turn
   (parroted), one reply given to every item (constant: the gold reply of a
   pool conversation), and that same reply when the metric knows it as a demo
   (copied). AUC is the chance that the positive scores higher.

``--search`` also grid-searches the reference-free weights (empathy,
relevance, rules, in steps of 0.1) and the relevance floor. Mixes that reach
AUC 0.90 against every negative come first, ranked by their Spearman with the
human EPITOME sum; without one, the nearest (largest min(worst AUC / 0.90,
Spearman / 0.55)). The defaults in MetricConfig come from that search; a run
with another ``--seed`` (other ED items, another constant reply) checks them
on items the search did not see.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from trace_dspy.bench.metric_validity import (
    NEGATIVES,
    OLD_FREE,
    OLD_NAME,
    auc_table,
    ed_part,
    epitome_part,
    free_weights,
    search_weights,
)
from trace_dspy.cli.common import (
    add_model_args,
    fail,
    settings_from_args,
    setup_logging,
)
from trace_dspy.core.tables import markdown_table
from trace_dspy.optimize.metric import EmpathyMetric, MetricConfig


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="python -m trace_dspy.metric_validity", description=__doc__.split("\n\n")[0])
    parser.add_argument("--epitome", help="EPITOME folder (default: $TRACE_DSPY_EPITOME)")
    parser.add_argument("--data", help="ED data (default: $TRACE_DSPY_DATA)")
    parser.add_argument("--limit", type=int, default=500, help="ED test items (default 500)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--search", action="store_true", help="grid-search the reference-free weights")
    parser.add_argument("--output", type=Path, help="write the results as JSON")
    parser.add_argument("--reply-guards", action="store_true",
                        help="score with the reply reward's extra guards on (what they cost in validity)")
    add_model_args(parser)
    args = parser.parse_args(argv)
    setup_logging()
    settings_from_args(args)
    from trace_dspy.core.jsonl import atomic_write_json
    from trace_dspy.data.epitome import EpitomeError, load_epitome, split_by_post
    from trace_dspy.data.sources import load_splits, load_test
    from trace_dspy.optimize.empathy_fit import PUBLISHED

    config = MetricConfig()
    metric = EmpathyMetric(config, reply_guards=args.reply_guards)
    if metric.scorer is None:
        return fail("the validity study needs the learned scorer, which needs the 'embed' extra")
    meta = metric.scorer.meta
    try:
        epitome = load_epitome(args.epitome)
    except EpitomeError as exc:
        return fail(str(exc))
    if epitome.fingerprint != meta.get("data_fingerprint"):
        print(f"NOTE: EPITOME files {epitome.fingerprint} differ from the scorer's {meta.get('data_fingerprint')}; "
              "the held-out split may overlap its training posts", file=sys.stderr)
    _, dev = split_by_post(epitome.pairs, dev_fraction=meta.get("dev_fraction", 0.25), seed=meta.get("seed", 0))
    from trace_dspy.data.sources import DataError, resolve_source

    try:
        source = resolve_source(args.data, seed=args.seed, announce_seed=False)
    except DataError as exc:
        return fail(str(exc))
    if source.is_seed:
        return fail("the validity study needs EmpatheticDialogues (--data or TRACE_DSPY_DATA), not the seed set")
    examples = load_test(source, view="trace", limit=args.limit, seed=args.seed)
    pool = load_splits(source, seed=args.seed).train
    constant = pool[0].response
    weights = {**free_weights(config), "strategy_fit": config.strategy_fit}  # reference-free
    default_weights = config.weights()

    ep = epitome_part(metric, dev, weights)
    ed = ed_part(metric, examples, constant)
    names = ["empathy", "ER", "IP", "EX", "relevance", "cosine", "rules", "composite"]
    ed_table = auc_table(ed, names, weights)
    # The default composite also holds reference-based parts (similarity to the gold reply, emotion),
    # which are 1.0 on the positive by construction here; listed so that nobody mistakes it for evidence.
    ed_table["composite (default, with reference parts)"] = auc_table(ed, ["composite"], default_weights)["composite"]
    ed_table[OLD_NAME] = auc_table(ed, ["old"], OLD_FREE)["old"]
    search = search_weights(ed, ep["rows"], [sum(p.levels) for p in dev]) if args.search else None

    print(f"## EPITOME held-out posts ({ep['pairs']} pairs, {ep['posts']} posts): Spearman with human levels\n")
    print(markdown_table(["component", "ER", "IP", "EX", "sum"], [
        [name, *(f"{row[c]:.3f}" if c in row else "-" for c in ("ER", "IP", "EX", "sum"))]
        for name, row in ep["spearman"].items()]))
    print("\n## The scorer as a classifier (EPITOME held-out posts)\n")
    print(markdown_table(
        ["mechanism", "accuracy", "macro-F1", "majority acc", "majority macro-F1", "published acc",
         "published macro-F1"],
        [[mech, *(f"{meta['dev_table'][mech][k]:.3f}" for k in ("accuracy", "macro_f1", "majority_accuracy",
                                                                 "majority_macro_f1")),
          f"{PUBLISHED[mech]['accuracy']:.2f}", f"{PUBLISHED[mech]['macro_f1']:.2f}"] for mech in ("ER", "IP", "EX")]))
    print(f"\n## EmpatheticDialogues test ({len(examples)} items): AUC of gold against each negative\n")
    print(markdown_table(["component", *NEGATIVES, "mean on gold"], [
        [name, *(f"{row[k]:.3f}" if row[k] is not None else "-" for k in (*NEGATIVES, "mean_gold"))]
        for name, row in ed_table.items()]))
    if search:
        print("\n## Weight search (top 5: mixes with AUC >= 0.90 on every negative first, by EPITOME sum Spearman)\n")
        for r in search[:5]:
            print(f"- {r['weights']}, relevance_floor {r['relevance_floor']}: worst AUC {r['worst_auc']:.3f}, EPITOME sum rho {r['epitome_sum_spearman']:.3f}")
    if args.output:
        atomic_write_json(args.output, {
            "command": "python -m trace_dspy.metric_validity " + shlex.join(argv),
            "ed_items": len(examples), "constant_reply": constant, "reference_free_weights": weights,
            "default_weights": default_weights,
            "metric_config": config.to_dict(), "scorer_fingerprint": meta.get("data_fingerprint"),
            "epitome": {k: v for k, v in ep.items() if k != "rows"}, "classifier": meta["dev_table"],
            "published": PUBLISHED, "ed_auc": ed_table, "search": search,
        })
    return 0


if __name__ == "__main__":
    sys.exit(main())
