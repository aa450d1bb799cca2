"""Metrics and optimizer support for compiling a TraceProgram.

Installed as ``trace_dspy.optimize`` (see the package-dir mapping in
pyproject.toml). Scorers here are pure functions; DSPy-shaped adapters wrap them.
"""

from trace_dspy.optimize.scorers import emotion_accuracy, group_accuracy

__all__ = ["emotion_accuracy", "group_accuracy"]
