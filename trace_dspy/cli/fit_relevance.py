"""Refit the metric's learned relevance head on the EmpatheticDialogues pool.

    python -m trace_dspy.fit_relevance --data ../shared/data/empathetic_dialogues

Every pool sample gives one (speaker's words, last turn, gold reply) row. A
seeded tenth of the conversations is held out: it picks the epoch count and
fits the calibration, and the dev table reports the AUC of a real reply
against another conversation's reply for the head and for plain cosine.
The weights go to ``--output`` (default: the packaged
trace_dspy/optimize/relevance_head.npz) with the data fingerprint, the dev
table, the dev table of a refit on a seeded subset (``--limit 400``, which
tests replay) and the scores of fixed probe triples. ``--check`` refits
without writing and compares with the weights at ``--output``.
The ED test split is never read.
"""

from __future__ import annotations

import argparse
import sys

from trace_dspy.cli.common import add_refit_args, command_parser, refit_main
from trace_dspy.workflows.fits import refit_relevance


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    parser = command_parser("fit_relevance", __doc__, prog)
    parser.add_argument("--data", help="ED folder with valid.csv and test.csv (default: $TRACE_DSPY_DATA)")
    parser.add_argument("--seed", type=int, default=0, help="seed for the held-out split and the fit (default 0)")
    parser.add_argument("--limit", type=int, help="fit on a seeded sample of about this many pool rows")
    add_refit_args(parser)
    return parser


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    return refit_main(argv, build_parser(prog), "fit_relevance", refit)


def refit(args, command: str):
    return refit_relevance(args.data, seed=args.seed, limit=args.limit, output=args.output, check=args.check,
                            json_path=args.json, command=command)


if __name__ == "__main__":
    sys.exit(main())
