"""Refit the learned empathy scorer on EPITOME and print its dev table.

    python -m trace_dspy.fit_empathy --epitome ../shared/data/epitome

The split is by seeker post (seeded); the L2 strength is chosen by grouped
cross-validation on the training posts; the dev table reports Spearman
correlation with the human levels, accuracy and macro-F1 per mechanism next
to the majority class and the published RoBERTa bi-encoder. The weights go to
``--output`` (default: the file the package ships and loads,
trace_dspy/optimize/empathy_head.npz), with the data fingerprint and the dev
table inside, plus two checks that tests replay: the dev table of a refit on
a seeded subset of about 300 pairs, and the levels of a few fixed probe pairs.
``--check`` refits without writing and compares with the weights at
``--output`` (with ``--limit 300``: with the recorded subset refit).
"""

from __future__ import annotations

import argparse

from trace_dspy.cli.common import add_refit_args, command_parser, refit_main
from trace_dspy.workflows.fits import refit_empathy


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    parser = command_parser("fit_empathy", __doc__, prog)
    parser.add_argument("--epitome", help="folder with the EPITOME Reddit CSVs (default: $TRACE_DSPY_EPITOME)")
    parser.add_argument("--seed", type=int, default=0, help="seed for the split by post (default 0)")
    parser.add_argument("--dev-fraction", type=float, default=0.25, help="share of posts held out (default 0.25)")
    parser.add_argument("--limit", type=int, help="fit on a seeded sample of posts holding about this many pairs")
    parser.add_argument("--l2", type=float, help="L2 strength (default: chosen by cross-validation)")
    add_refit_args(parser)
    return parser


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    return refit_main(argv, build_parser(prog), "fit_empathy", refit_empathy)


if __name__ == "__main__":
    raise SystemExit(main())
