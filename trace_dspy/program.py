"""TraceProgram: the TRACE pipeline as one DSPy module.

recognize_emotion -> analyze_cause -> plan_strategy -> generate_response

Each stage is a single ``dspy.Predict`` stored under the stage's name. Step by
step reasoning is a ``reasoning`` output field added to the stage signature
(what ``dspy.ChainOfThought`` does internally), so that switching it on or off
never renames a predictor: the four names are the compiled artifact's schema.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from contextlib import nullcontext

import dspy

from trace_dspy.adapters import choose_adapter
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

    ``stage_lms`` maps stage names to the ``dspy.LM`` that runs them; stages
    without one use the LM in ``dspy.settings``. They are applied with
    ``dspy.context`` inside ``forward`` rather than stored on the predictors,
    because optimizers reset predictor LMs when they compile.
    """

    def __init__(self, config: ProgramConfig | None = None, stage_lms: Mapping[str, dspy.LM] | None = None,
                 retriever=None):
        super().__init__()
        self.config = config or ProgramConfig()
        # An ExemplarIndex (trace_dspy.retrieval); used when exemplars are not passed in.
        self.retriever = retriever
        for stage in STAGE_SIGNATURES:
            predictor = dspy.Predict(stage_signature(stage, self.config)) if self.config.enabled(stage) else None
            setattr(self, stage, predictor)
        self._stage_lms: dict[str, dspy.LM] = {}
        self.set_stage_lms(stage_lms or {})

    def set_stage_lms(self, stage_lms: Mapping[str, dspy.LM]) -> TraceProgram:
        unknown = set(stage_lms) - set(STAGE_SIGNATURES)
        if unknown:
            raise ValueError(f"unknown stage(s) for stage_lms: {', '.join(sorted(unknown))}")
        self._stage_lms = dict(stage_lms)
        return self

    @property
    def stage_lms(self) -> dict[str, dspy.LM]:
        return dict(self._stage_lms)

    def _stage_context(self, stage: str):
        lm = self._stage_lms.get(stage)
        adapter = choose_adapter(self.config.adapter, lm or dspy.settings.lm)
        overrides = {k: v for k, v in (("lm", lm), ("adapter", adapter)) if v is not None}
        return dspy.context(**overrides) if overrides else nullcontext()

    def __deepcopy__(self, memo):
        # Optimizers deep-copy programs (student, teacher, candidates). The copies
        # share the stage LMs: an LM is a connection, not program state.
        for shared in (*self._stage_lms.values(), self.retriever):
            if shared is not None:
                memo[id(shared)] = shared
        new = self.__class__.__new__(self.__class__)
        memo[id(self)] = new
        for key, value in self.__dict__.items():
            setattr(new, key, copy.deepcopy(value, memo))
        return new

    def retrieve(self, dialogue: str, emotion: str | None) -> list[str]:
        """Exemplars for a dialogue from the retriever (empty without one)."""
        if self.retriever is None:
            return []
        from trace_dspy.retrieval import format_exemplar

        cfg = self.config.retrieval
        hits = self.retriever.search(dialogue, emotion=emotion, k=cfg.k, filter_by_group=cfg.filter_by_group)
        return [format_exemplar(h) for h in hits]

    def forward(self, dialogue, exemplars: Sequence[str] | None = None) -> dspy.Prediction:
        state: dict = {"dialogue": normalize_dialogue(dialogue), "exemplars": list(exemplars or [])}
        retrieve = exemplars is None and self.retriever is not None and self.config.retrieval.enabled
        outputs: dict = {}
        for stage in STAGE_SIGNATURES:
            if stage == "plan_strategy" and retrieve:
                # After the emotion is known: TRACE filters exemplars by its group.
                state["exemplars"] = self.retrieve(state["dialogue"], state.get("emotion"))
                retrieve = False
            predictor = getattr(self, stage)
            if predictor is None:
                continue
            sig = predictor.signature
            with self._stage_context(stage):
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
