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

from trace_dspy.cli.common import ed_refit_parser, refit_main
from trace_dspy.workflows.fits import refit_tone


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    parser = ed_refit_parser("fit_tone", __doc__, prog, seed_help="seed for the held-out split (default 0)")
    return refit_main(argv, parser, "fit_tone", refit_tone)


if __name__ == "__main__":
    raise SystemExit(main())
