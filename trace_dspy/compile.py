"""``python -m trace_dspy.compile``: a launcher only; the command is :mod:`trace_dspy.cli.compile`.

``trace_dspy.compile.main(argv)`` runs it from Python and returns the exit code.
"""

from trace_dspy.cli.compile import main

__all__ = ["main"]

if __name__ == "__main__":
    raise SystemExit(main())
