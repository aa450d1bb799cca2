"""``python -m trace_dspy.fit_tone``: a launcher only; the command is :mod:`trace_dspy.cli.fit_tone`.

``trace_dspy.fit_tone.main(argv)`` runs it from Python and returns the exit code.
"""

from trace_dspy.cli.fit_tone import main

__all__ = ["main"]

if __name__ == "__main__":
    raise SystemExit(main())
