"""Refit the emotion prior shipped with the package, or write one elsewhere.

    python -m trace_dspy.fit_prior --data ../shared/data/empathetic_dialogues \
        --situations ../shared/data/empathetic_dialogues_situations/train.csv
    python -m trace_dspy.fit_prior --data ../shared/data/empathetic_dialogues --output /tmp/prior.npz

The prior is fitted on the training side of the data source's pool (never its test split) and on the
situations file, when one is named (``--situations`` or ``$TRACE_DSPY_SITUATIONS``); C and the
temperature are picked on the pool's dev side. The shipped prior is not refitted on that dev side
(``--refit-on-dev`` does it for a prior of your own), so that a compile on ED can compare it fairly with
the prior it fits. See :mod:`trace_dspy.program.emotion_prior`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from trace_dspy.cli.common import add_situations_arg, command_parser, fail
from trace_dspy.core.console import out_json
from trace_dspy.data.sources import DataError
from trace_dspy.program.emotion_prior import SHIPPED, PriorError
from trace_dspy.workflows.fits import refit_prior
from trace_dspy.workflows.preflight import PreflightError


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    parser = command_parser("fit_prior", __doc__, prog)
    parser.add_argument("--data", required=True, help="an ED folder (valid.csv, test.csv) or another data source")
    add_situations_arg(parser)
    parser.add_argument("--seed", type=int, default=0, help="the train/dev split seed (default 0)")
    parser.add_argument("--output", type=Path, default=SHIPPED, help=f"where to write it (default {SHIPPED})")
    parser.add_argument("--refit-on-dev", action=argparse.BooleanOptionalAction, default=False,
                        help="after dev picks C, refit on train and dev together (default off)")
    return parser


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    """Refit the shipped prior (or write one elsewhere) from a data source's pool and the situations."""
    args = build_parser(prog).parse_args(argv)
    try:
        shown = refit_prior(args.data, situations=args.situations, seed=args.seed, output=args.output,
                            refit_on_dev=args.refit_on_dev)
    except (DataError, PriorError, PreflightError) as exc:
        return fail(str(exc))
    except OSError as exc:
        return fail(f"cannot write {args.output}: {exc.strerror or exc}")
    out_json(shown, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
