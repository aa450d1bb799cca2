"""``python -m trace_dspy.respond``: a launcher only; the command is :mod:`trace_dspy.cli.respond`.

``trace_dspy.respond.main(argv)`` runs it from Python and returns the exit code.
"""

from trace_dspy.cli.respond import main

__all__ = ["main"]

if __name__ == "__main__":
    raise SystemExit(main())
