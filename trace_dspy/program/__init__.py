"""Layer 5, the program: ``TraceProgram`` (stages composed into one DSPy module) and the fitted emotion prior.

``from trace_dspy.program import TraceProgram`` is the short path.  Nothing is loaded at import.
"""

from trace_dspy.program.pipeline import TraceProgram

__all__ = ["TraceProgram"]
