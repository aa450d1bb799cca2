"""``python -m trace_dspy.chat``: a launcher only; the command is :mod:`trace_dspy.cli.chat`.

``trace_dspy.chat.main(argv)`` runs it from Python and returns the exit code.
"""

from trace_dspy.cli.chat import main

__all__ = ["main"]

if __name__ == "__main__":
    raise SystemExit(main())
