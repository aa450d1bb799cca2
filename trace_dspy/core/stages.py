"""The one stage registry: every list of stage names, and every per-stage table, derives from ``REGISTRY``.

A new stage is one ``Stage`` row here plus its signature class in ``signatures/stages.py`` (named by
``Stage.signature``); ``tests/signatures/test_stages.py`` fails when either half is missing or the two disagree.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Stage:
    """One stage of the program, in pipeline order within ``REGISTRY``.

    - ``name``: the predictor attribute of ``TraceProgram`` and therefore the artifact's schema.
    - ``signature``: the class name of its signature in ``trace_dspy.signatures``.
    - ``core``: one of TRACE's four stages (always built); otherwise opt-in (commonsense, reflection).
    - ``optional``: an ablation may switch it off.
    - ``lm_group``: which of a split LM setup serves it (``analysis`` or ``response``).
    - ``main_output``: the output field that identifies the stage in a rendered prompt.
    - ``gates``: input fields of later stages that exist only when this stage runs.
    - ``auditable``: the reflection audit may name it as the stage to redo.
    - ``status``: what a terminal status line says while it runs.
    - ``notes``: the metric's feedback notes this stage can act on (GEPA reflects per predictor).
    - ``span``: the name of its span in an MLflow trace.
    """

    name: str
    signature: str
    core: bool
    optional: bool
    lm_group: str
    main_output: str
    gates: tuple[str, ...] = ()
    auditable: bool = False
    status: str = ""
    notes: frozenset[str] = frozenset()
    span: str = ""


REGISTRY: tuple[Stage, ...] = (
    Stage("recognize_emotion", "RecognizeEmotion", core=True, optional=False, lm_group="analysis",
          main_output="emotion", auditable=True, status="reading how they feel", notes=frozenset({"emotion"}),
          span="emotion"),
    Stage("infer_commonsense", "InferCommonsense", core=False, optional=False, lm_group="analysis",
          main_output="x_intent", status="thinking about what they need", span="commonsense"),
    Stage("analyze_cause", "AnalyzeCause", core=True, optional=True, lm_group="analysis",
          main_output="cause_summary", gates=("trigger_spans", "cause_summary", "cause_category"),
          auditable=True, status="working out why", notes=frozenset({"detail", "emotion"}), span="cause"),
    Stage("plan_strategy", "PlanStrategy", core=True, optional=True, lm_group="analysis",
          main_output="strategy", gates=("strategy", "secondary_strategy"), auditable=True,
          status="planning the reply", notes=frozenset({"strategy", "empathy", "judge", "similarity"}),
          span="strategy"),
    Stage("generate_response", "GenerateResponse", core=True, optional=False, lm_group="response",
          main_output="response", auditable=True, status="writing the reply",
          notes=frozenset({"length", "detail", "advice", "parrot", "copy", "unrelated", "strategy", "empathy",
                           "similarity", "judge", "empty"}), span="response"),
    Stage("reflect", "AuditReply", core=False, optional=False, lm_group="analysis",
          main_output="faulty_stage", status="checking the reply", span="reflection"),
)

BY_NAME: dict[str, Stage] = {s.name: s for s in REGISTRY}
# Every stage the program can run, in pipeline order.
STAGES: tuple[str, ...] = tuple(s.name for s in REGISTRY)
# TRACE's four stages; the others are opt-in.
CORE_STAGES: tuple[str, ...] = tuple(s.name for s in REGISTRY if s.core)
# Stages an ablation may switch off. Emotion and reply are the task itself.
OPTIONAL_STAGES: tuple[str, ...] = tuple(s.name for s in REGISTRY if s.optional)
# Stages the reflection audit may send back, in order.
AUDITABLE_STAGES: tuple[str, ...] = tuple(s.name for s in REGISTRY if s.auditable)
# Which stages each LM group of a split setup serves.
STAGE_GROUPS: dict[str, tuple[str, ...]] = {
    group: tuple(s.name for s in REGISTRY if s.lm_group == group)
    for group in dict.fromkeys(s.lm_group for s in REGISTRY)
}
# The stage a prompt belongs to, by its main output field.
STAGE_BY_OUTPUT: dict[str, str] = {s.main_output: s.name for s in REGISTRY}


def stage_of_outputs(outputs) -> str:
    """The stage whose main output is among ``outputs`` (field names of one prompt), or ``unknown``."""
    for name in outputs:
        if name in STAGE_BY_OUTPUT:
            return STAGE_BY_OUTPUT[name]
    return "unknown"


__all__ = ["AUDITABLE_STAGES", "BY_NAME", "CORE_STAGES", "OPTIONAL_STAGES", "REGISTRY", "STAGES", "STAGE_BY_OUTPUT",
           "STAGE_GROUPS", "Stage", "stage_of_outputs"]
