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

from trace_dspy.bench.validity_study import run_validity
from trace_dspy.cli.common import add_model_args, command_parser, fail, settings_from_args, setup_logging
from trace_dspy.core.console import out


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    parser = command_parser("metric_validity", __doc__, prog)
    parser.add_argument("--epitome", help="EPITOME folder (default: $TRACE_DSPY_EPITOME)")
    parser.add_argument("--data", help="ED data (default: $TRACE_DSPY_DATA)")
    parser.add_argument("--limit", type=int, default=500, help="ED test items (default 500)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--search", action="store_true", help="grid-search the reference-free weights")
    parser.add_argument("--output", type=Path, help="write the results as JSON")
    parser.add_argument("--reply-guards", action="store_true",
                        help="score with the reply reward's extra guards on (what they cost in validity)")
    add_model_args(parser)
    return parser


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser(prog).parse_args(argv)
    setup_logging()
    settings_from_args(args)
    try:
        from trace_dspy.workflows.preflight import check_output_file

        check_output_file(args.output, "--output")  # before the scoring, which takes minutes
        text = run_validity(epitome=args.epitome, data=args.data, limit=args.limit, seed=args.seed,
                            search=args.search, reply_guards=args.reply_guards, output=args.output,
                            command="python -m trace_dspy.metric_validity " + shlex.join(argv))
    except ValueError as exc:
        return fail(str(exc))
    out(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
