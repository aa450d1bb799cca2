"""trace-dspy: TRACE empathetic response generation as a compiled DSPy program.

Importing this package has no side effects: no model is loaded, no file is
read, nothing is configured.
"""

from trace_dspy.config import ProgramConfig
from trace_dspy.program import TraceProgram

__version__ = "0.1.0"
__all__ = ["ProgramConfig", "TraceProgram", "__version__"]
