"""Typed DSPy signatures, one per TRACE stage.

Installed as ``trace_dspy.signatures`` (see the package-dir mapping in
pyproject.toml). Each class docstring is the stage's instruction.
"""

from trace_dspy.signatures.stages import (
    OPTIONAL_SIGNATURES,
    STAGE_SIGNATURES,
    AnalyzeCause,
    AuditReply,
    GenerateResponse,
    InferCommonsense,
    PlanStrategy,
    RecognizeEmotion,
)

__all__ = [
    "OPTIONAL_SIGNATURES",
    "STAGE_SIGNATURES",
    "AnalyzeCause",
    "AuditReply",
    "InferCommonsense",
    "GenerateResponse",
    "PlanStrategy",
    "RecognizeEmotion",
]
