"""``python -m trace_dspy.bench_local``: a launcher only; the command is :mod:`trace_dspy.cli.bench_local`.

``trace_dspy.bench_local.main(argv)`` runs it from Python and returns the exit code.
"""

from trace_dspy.cli.bench_local import main

__all__ = ["main"]

if __name__ == "__main__":
    raise SystemExit(main())
