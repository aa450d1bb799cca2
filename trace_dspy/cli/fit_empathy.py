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
import shlex
import sys
from pathlib import Path

from trace_dspy.cli.common import fail, print_refit, setup_logging
from trace_dspy.workflows.fits import refit_empathy


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m trace_dspy.fit_empathy", description=__doc__.split("\n\n")[0])
    parser.add_argument("--epitome", help="folder with the EPITOME Reddit CSVs (default: $TRACE_DSPY_EPITOME)")
    parser.add_argument("--seed", type=int, default=0, help="seed for the split by post (default 0)")
    parser.add_argument("--dev-fraction", type=float, default=0.25, help="share of posts held out (default 0.25)")
    parser.add_argument("--limit", type=int, help="fit on a seeded sample of posts holding about this many pairs")
    parser.add_argument("--l2", type=float, help="L2 strength (default: chosen by cross-validation)")
    parser.add_argument("--output", type=Path, help="where to write the weights (default: the packaged file)")
    parser.add_argument("--json", type=Path, help="also write the dev table and settings as JSON")
    parser.add_argument("--check", action="store_true",
                        help="refit without writing; exit 1 unless the dev table matches the weights at --output")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    setup_logging()
    command = "python -m trace_dspy.fit_empathy " + shlex.join(a for a in argv if a not in ("--check",))
    try:
        refit = refit_empathy(args.epitome, seed=args.seed, dev_fraction=args.dev_fraction, limit=args.limit,
                              l2=args.l2, output=args.output, check=args.check, json_path=args.json, command=command)
    except ValueError as exc:
        return fail(str(exc))
    return print_refit(refit)


if __name__ == "__main__":
    sys.exit(main())
