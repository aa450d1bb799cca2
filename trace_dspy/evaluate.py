"""``python -m trace_dspy.evaluate``: a launcher only; the command is :mod:`trace_dspy.cli.evaluate`.

``trace_dspy.evaluate.main(argv)`` runs it from Python and returns the exit code.
"""

from trace_dspy.cli.evaluate import main

__all__ = ["main"]

if __name__ == "__main__":
    raise SystemExit(main())
