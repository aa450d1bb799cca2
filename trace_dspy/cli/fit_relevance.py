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

from trace_dspy.cli.common import ed_refit_parser, refit_main
from trace_dspy.workflows.fits import refit_relevance


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    parser = ed_refit_parser("fit_relevance", __doc__, prog,
                             seed_help="seed for the held-out split and the fit (default 0)")
    return refit_main(argv, parser, "fit_relevance", refit_relevance)


if __name__ == "__main__":
    raise SystemExit(main())
