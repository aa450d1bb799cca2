"""``python -m trace_dspy.metric_validity``: a launcher only; the command is :mod:`trace_dspy.cli.metric_validity`.

``trace_dspy.metric_validity.main(argv)`` runs it from Python and returns the exit code.
"""

from trace_dspy.cli.metric_validity import main

__all__ = ["main"]

if __name__ == "__main__":
    raise SystemExit(main())
