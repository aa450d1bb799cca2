"""The writer switch: how the program writes, ``standard`` (TRACE as published) or ``compact`` (a small model).

``ProgramConfig.writer`` chooses: ``standard``, ``compact``, or ``auto`` (the default): compact where the reply
stage runs on the embedded model (``trace_dspy.lm.kinds.is_embedded``) or the config asks for a layout only the
compact writer has (``reply_format`` chat or scaffold), standard everywhere else. ``--writer`` sets it for a
run, and ``respond --show-stages`` and ``inspect`` show which one writes.

The standard writer is TRACE's pipeline as published: four stages through DSPy's adapters, one reply, and an
optional Best-of-N by the metric (``best_of``). Everything the compact writer does lives in
``trace_dspy.compact``, which only this module imports, and only when the compact writer is chosen.
"""

from __future__ import annotations

from typing import Protocol

import dspy

from trace_dspy.lm.adapters import make_adapter
from trace_dspy.lm.kinds import is_embedded
from trace_dspy.optimize.selection import ReplySelection, reply_demos, reward_candidate

WRITERS: tuple[str, ...] = ("auto", "compact", "standard")
# prior_k = "auto" for the standard writer: the prior's top 5 as a hint the LM may follow or not.
STANDARD_PRIOR_K = 5


class Writer(Protocol):
    """What the program asks its writer (``StandardWriter`` here, ``trace_dspy.compact.writer.CompactWriter``)."""

    name: str
    exemplars_last_turn: bool

    def adapter(self, stage: str) -> dspy.Adapter | None: ...
    def stage_lm(self, program, stage: str) -> dspy.LM | None: ...
    def reply_format(self) -> str: ...
    def best_of(self) -> int: ...
    def prior_k(self) -> int: ...
    def prior_decides(self, lm, predictor) -> bool: ...
    def plan_fitted(self, first_plan, predictor) -> bool: ...
    def reward(self, program, inputs: dict, pred) -> float: ...
    def write_reply(self, program, predictor, inputs: dict, state: dict) -> dspy.Prediction: ...


def resolve_writer(config, lm) -> str:
    """``config.writer`` with ``auto`` resolved for the reply stage's ``lm``."""
    if config.writer != "auto":
        return config.writer
    if config.reply_format in ("chat", "scaffold", "briefed") or (lm is not None and is_embedded(lm)):
        return "compact"
    return "standard"


def part_fitter(cfg, metric):
    """What a compile fits before its optimizer, for ``compile_program(fit_parts=...)``: the compact writer's
    openers and plans (``trace_dspy.compact.part_fits``) where the program writes compactly; nothing otherwise."""

    def fit(program, trainset, log):
        if not (cfg.opener_items or cfg.plan_items) or not hasattr(program, "writer"):
            return None
        if program.writer().name != "compact":
            log("openers and plans: not fitted: the standard writer writes one reply, for the LM's plan")
            return None
        from trace_dspy.compact.part_fits import fit_reply_parts

        return fit_reply_parts(cfg, metric, program, trainset, log)

    return fit


def finetune_writer(opt, program, source, trainset, metric, log, progress=None):
    """``compile --optimizer finetune``: train the compact writer's reply stage into a LoRA adapter for the
    embedded model (``trace_dspy.compact.finetune_fit``). ``opt``: the OptimizerConfig; ``source``: the data
    source whose pool gives the conversations; ``trainset``: the training side's examples (only their
    conversations are trained on, never dev's). Returns
    a ``FinetuneFit``: the program as a fine-tuned writer runs it (with its ``writer_adapter`` part), the
    manifest record of the training and the loss curve."""
    from trace_dspy.compact.finetune_fit import fit_writer, training_side

    return fit_writer(opt, program, training_side(source, trainset), metric, log, progress)


def compact_guards():
    """The compact writer's reply guards as the metric takes them (``EmpathyMetric(guards=...)``), for studies of
    the guards themselves (``metric_validity --reply-guards``)."""
    from trace_dspy.compact.guards import GUARDS

    return GUARDS


def writer_for(config, lm) -> Writer:
    """The writer ``config`` asks for, with the reply stage on ``lm``."""
    if resolve_writer(config, lm) == "compact":
        from trace_dspy.compact.writer import CompactWriter

        return CompactWriter(config)
    return StandardWriter(config)


class StandardWriter:
    """TRACE as published: DSPy's adapters, one reply, Best-of-N by the metric where ``best_of`` asks for it."""

    name = "standard"
    exemplars_last_turn = False

    def __init__(self, config):
        self.config = config

    def adapter(self, stage: str) -> dspy.Adapter | None:
        return None if self.config.adapter == "auto" else make_adapter(self.config.adapter)

    def stage_lm(self, program, stage: str) -> dspy.LM | None:
        """None: every stage keeps its LM. A fine-tuned writer's adapter (the ``writer_adapter`` part) is the
        compact writer's; that it is not used here is said once."""
        adapter = program.parts["writer_adapter"] if stage == "generate_response" else None
        if adapter is not None:
            from trace_dspy.lm.finetune.adapted import note_unused

            note_unused(adapter.path, "the standard writer writes the reply")
        return None

    def reply_format(self) -> str:
        return "fields"

    def best_of(self) -> int:
        return 1 if self.config.best_of == "auto" else self.config.best_of

    def prior_k(self) -> int:
        return STANDARD_PRIOR_K if self.config.prior_k == "auto" else self.config.prior_k

    def prior_decides(self, lm, predictor) -> bool:
        return False

    def plan_fitted(self, first_plan, predictor) -> bool:
        return False

    def reward(self, program, inputs: dict, pred) -> float:
        """The default metric's reference-free score of a candidate (no guards, no tone floor), or the
        program's own ``reward_fn``."""
        if program.reward_fn is not None:
            return float(program.reward_fn(inputs, pred))
        from trace_dspy.optimize.metric import EmpathyMetric

        demos = reply_demos(program.generate_response)
        metric = program.reward_metrics.get(("standard", demos), lambda: EmpathyMetric(copy_sources=demos))
        return metric.evaluate(dspy.Example(dialogue=inputs["dialogue"]), reward_candidate(inputs, pred)).score

    def write_reply(self, program, predictor, inputs: dict, state: dict) -> dspy.Prediction:
        if self.best_of() <= 1:
            return predictor(**inputs)
        selection = ReplySelection(predictor, lambda args, pred: self.reward(program, args, pred), n=self.best_of(),
                                   threshold=self.config.best_of_threshold, name=predictor)
        kept, state["reply_rewards"] = selection.select(inputs)
        return kept.prediction
