"""Refit the emotion prior shipped with the package, or write one elsewhere.

    python -m trace_dspy.fit_prior --data ../shared/data/empathetic_dialogues
    python -m trace_dspy.fit_prior --data ../shared/data/empathetic_dialogues --output /tmp/prior.npz

The prior is fitted on the training side of the data source's pool (never its test split); the L2
strength is picked on the dev side. The shipped prior is then refitted on train and dev together
(``--no-refit-on-dev`` keeps the train-only fit): the programs that use it are never evaluated on
that dev side. See :mod:`trace_dspy.program.emotion_prior`.
"""

from __future__ import annotations

import json
from pathlib import Path

from trace_dspy.program.emotion_prior import SHIPPED, PriorError, fit_from_source


def main(argv: list[str] | None = None) -> int:
    """Refit the shipped prior (or write one elsewhere) from an ED folder's pool."""
    import argparse
    import sys

    from trace_dspy.data.sources import DataError, resolve_source

    parser = argparse.ArgumentParser(prog="python -m trace_dspy.fit_prior",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, help="an ED folder (valid.csv, test.csv) or another data source")
    parser.add_argument("--seed", type=int, default=0, help="the train/dev split seed (default 0)")
    parser.add_argument("--output", type=Path, default=SHIPPED, help=f"where to write it (default {SHIPPED})")
    parser.add_argument("--refit-on-dev", action=argparse.BooleanOptionalAction, default=True,
                        help="after dev picks the L2 strength, refit on train and dev together (default on)")
    args = parser.parse_args(argv)
    try:
        source = resolve_source(args.data, seed=args.seed)
        prior = fit_from_source(source, seed=args.seed, refit_on_dev=args.refit_on_dev)
    except (DataError, PriorError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    prior.save(args.output)
    print(json.dumps({"output": str(args.output), **prior.describe()}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
