"""``python -m trace_dspy.bench``: a launcher only; the command is :mod:`trace_dspy.cli.bench`.

``trace_dspy.bench.main(argv)`` runs it from Python and returns the exit code.
"""

from trace_dspy.cli.bench import main

__all__ = ["main"]

if __name__ == "__main__":
    raise SystemExit(main())
