"""``python -m trace_dspy.inspect``: a launcher only; the command is :mod:`trace_dspy.cli.inspect_artifact`.

This folder has no ``__init__.py`` on purpose: it is a namespace package, so a checkout's ``trace_dspy/`` on
``sys.path`` (running a file from inside the folder) cannot shadow the standard library's ``inspect`` module,
which a module ``trace_dspy/inspect.py`` did.
"""

from trace_dspy.cli.inspect_artifact import main

raise SystemExit(main())
