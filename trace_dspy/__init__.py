"""trace-dspy: TRACE empathetic response generation as a compiled DSPy program.

Importing this package has no side effects: no model is loaded, no file is
read, nothing is configured.
"""

from trace_dspy.core.config import ProgramConfig
from trace_dspy.program.pipeline import TraceProgram

__version__ = "0.1.0"
__all__ = ["ProgramConfig", "TraceProgram", "__version__", "load"]


def load(ref: str, **kwargs):
    """Load a compiled program, ready to call: see :func:`trace_dspy.store.artifacts.load`.

    ``ref``: an artifact folder or program.json, ``NAME@vN``, ``NAME@latest``,
    ``champion``, ``models:/NAME/VERSION``, ``models:/NAME@ALIAS`` or ``runs:/RUN_ID``.
    """
    from trace_dspy.store.artifacts import load as _load

    return _load(ref, **kwargs)
