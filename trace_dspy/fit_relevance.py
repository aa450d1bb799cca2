"""``python -m trace_dspy.fit_relevance``: a launcher only; the command is :mod:`trace_dspy.cli.fit_relevance`.

``trace_dspy.fit_relevance.main(argv)`` runs it from Python and returns the exit code.
"""

from trace_dspy.cli.fit_relevance import main

__all__ = ["main"]

if __name__ == "__main__":
    raise SystemExit(main())
