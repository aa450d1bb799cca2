"""``python -m trace_dspy.fit_empathy``: a launcher only; the command is :mod:`trace_dspy.cli.fit_empathy`.

``trace_dspy.fit_empathy.main(argv)`` runs it from Python and returns the exit code.
"""

from trace_dspy.cli.fit_empathy import main

__all__ = ["main"]

if __name__ == "__main__":
    raise SystemExit(main())
