"""TraceProgram: the TRACE pipeline as one DSPy module.

recognize_emotion -> analyze_cause -> plan_strategy -> generate_response

Each stage is a single ``dspy.Predict`` stored under the stage's name. Step by
step reasoning is a ``reasoning`` output field added to the stage signature
(what ``dspy.ChainOfThought`` does internally), so that switching it on or off
never renames a predictor: the four names are the compiled artifact's schema.
"""

from __future__ import annotations

from collections.abc import Sequence

import dspy

from trace_dspy.config import ProgramConfig
from trace_dspy.dialogue import normalize_dialogue
from trace_dspy.labels import ekman_group
from trace_dspy.signatures import STAGE_SIGNATURES

# Inputs that exist only when the stage producing them runs.
_PRODUCED_BY = {
    "analyze_cause": ("trigger_spans", "cause_summary", "cause_category"),
    "plan_strategy": ("strategy", "secondary_strategy"),
}
_REASONING_DESC = "Think it through step by step, briefly, before answering."


def stage_signature(stage: str, config: ProgramConfig) -> type[dspy.Signature]:
    """The signature a stage uses under ``config``."""
    sig = STAGE_SIGNATURES[stage]
    for producer, names in _PRODUCED_BY.items():
        if not config.enabled(producer):
            for name in names:
                if name in sig.input_fields:
                    sig = sig.delete(name)
    if config.reasons(stage):
        sig = sig.prepend("reasoning", dspy.OutputField(desc=_REASONING_DESC), type_=str)
    return sig


class TraceProgram(dspy.Module):
    """Emotion -> cause -> strategy -> reply, one typed predictor per stage.

    Call it with ``dialogue`` (a list of turns, or a string with one
    ``Speaker:``/``Listener:`` line per turn, ending on the speaker) and
    optionally ``exemplars`` (a list of formatted example conversations).
    It returns a ``dspy.Prediction`` holding every stage's outputs.
    """

    def __init__(self, config: ProgramConfig | None = None):
        super().__init__()
        self.config = config or ProgramConfig()
        for stage in STAGE_SIGNATURES:
            predictor = dspy.Predict(stage_signature(stage, self.config)) if self.config.enabled(stage) else None
            setattr(self, stage, predictor)

    def forward(self, dialogue, exemplars: Sequence[str] | None = None) -> dspy.Prediction:
        state: dict = {"dialogue": normalize_dialogue(dialogue), "exemplars": list(exemplars or [])}
        outputs: dict = {}
        for stage in STAGE_SIGNATURES:
            predictor = getattr(self, stage)
            if predictor is None:
                continue
            sig = predictor.signature
            result = predictor(**{name: state[name] for name in sig.input_fields})
            for name in sig.output_fields:
                value = result[name]
                if name == "reasoning":
                    outputs[f"{stage}_reasoning"] = value
                else:
                    state[name] = value
                    outputs[name] = value
        outputs["emotion_group"] = ekman_group(outputs["emotion"])
        return dspy.Prediction(dialogue=state["dialogue"], exemplars=state["exemplars"], **outputs)
