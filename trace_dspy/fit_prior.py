"""``python -m trace_dspy.fit_prior``: a launcher only; the command is :mod:`trace_dspy.cli.fit_prior`.

``trace_dspy.fit_prior.main(argv)`` runs it from Python and returns the exit code.
"""

from trace_dspy.cli.fit_prior import main

__all__ = ["main"]

if __name__ == "__main__":
    raise SystemExit(main())
