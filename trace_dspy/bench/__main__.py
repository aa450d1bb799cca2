"""``python -m trace_dspy.bench``: a launcher only; the command is :mod:`trace_dspy.cli.bench`.

The benchmark library is this package (``trace_dspy.bench.suite``, ``.local``, ``.metric_validity``), so the
launcher is its ``__main__`` module; ``trace_dspy.cli.bench.main(argv)`` runs the command from Python.
"""

from trace_dspy.cli.bench import main

raise SystemExit(main())
