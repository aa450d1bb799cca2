"""Refit the reply reward's tone head on the EmpatheticDialogues pool.

    python -m trace_dspy.fit_tone --data ../shared/data/empathetic_dialogues

Every pool sample with a reply gives one (reply, valence of its conversation's emotion) row. A seeded fifth
of the conversations is held out for the dev table: the AUC of P(pleasant) between pleasant and unpleasant
replies, and of a reply's tone agreement against a swapped-tone reply's. The weights go to ``--output``
(default: the packaged trace_dspy/optimize/tone_head.npz) with the data fingerprint, the dev table, the dev
table of a refit on a seeded subset (``--limit 400``, which tests replay) and the scores of fixed probe
replies. ``--check`` refits without writing and compares with the weights at ``--output``.
The ED test split is never read.
"""

from __future__ import annotations

import argparse
import sys

from trace_dspy.cli.common import add_refit_args, command_parser, refit_main
from trace_dspy.workflows.fits import refit_tone


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    parser = command_parser("fit_tone", __doc__, prog)
    parser.add_argument("--data", help="ED folder with valid.csv and test.csv (default: $TRACE_DSPY_DATA)")
    parser.add_argument("--seed", type=int, default=0, help="seed for the held-out split (default 0)")
    parser.add_argument("--limit", type=int, help="fit on a seeded sample of about this many pool rows")
    add_refit_args(parser)
    return parser


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    return refit_main(argv, build_parser(prog), "fit_tone", refit)


def refit(args, command: str):
    return refit_tone(args.data, seed=args.seed, limit=args.limit, output=args.output, check=args.check,
                      json_path=args.json, command=command)


if __name__ == "__main__":
    sys.exit(main())
