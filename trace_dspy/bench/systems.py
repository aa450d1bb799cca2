"""The systems the quality bench compares: the single-call baseline, the paper-instruction program,
TraceProgram uncompiled and compiled, and artifacts."""

from __future__ import annotations

import time
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass, replace

import dspy

from trace_dspy.bench.records import count_lm_calls
from trace_dspy.core.console import say
from trace_dspy.workflows.settings import Settings

BASE_SYSTEMS = ("single_cot", "trace_paper", "trace")
SYSTEM_DESCRIPTIONS = {
    "single_cot": "one ChainOfThought call: dialogue -> emotion, reply",
    "trace_paper": "TRACE stages with paraphrased paper-agent instructions, uncompiled",
    "trace": "TraceProgram, uncompiled",
}


class SingleCallProgram(dspy.Module):
    """The single-call baseline: dialogue -> (reasoning, emotion, reply) in one LM call."""

    def __init__(self):
        super().__init__()
        from trace_dspy.signatures.baselines import SingleCallEmpathy

        self.respond = dspy.ChainOfThought(SingleCallEmpathy)

    def forward(self, dialogue) -> dspy.Prediction:
        from trace_dspy.core.dialogue import normalize_dialogue
        from trace_dspy.core.labels import ekman_group
        from trace_dspy.lm.adapters import COMPACT
        from trace_dspy.lm.kinds import takes_grammar

        text = normalize_dialogue(dialogue)
        lm = dspy.settings.lm
        adapter = COMPACT if lm is not None and takes_grammar(lm) else None  # compact on grammar-constrained LMs
        with dspy.context(adapter=adapter) if adapter is not None else nullcontext():
            out = self.respond(dialogue=text)
        return dspy.Prediction(dialogue=text, emotion=out.emotion, emotion_group=ekman_group(out.emotion),
                               response=out.response, reasoning=out.reasoning)


def paper_program(config, *, retriever=None, stage_lms=None):
    """TraceProgram with instructions restating the published agents' prompts (uncompiled)."""
    from trace_dspy.program.pipeline import TraceProgram
    from trace_dspy.signatures.baselines import (
        PAPER_INSTRUCTIONS,
        PAPER_REASONING_STAGES,
    )

    config = replace(config, reasoning=tuple(dict.fromkeys((*config.reasoning, *PAPER_REASONING_STAGES))))
    program = TraceProgram(config, stage_lms=stage_lms, retriever=retriever)
    for stage, text in PAPER_INSTRUCTIONS.items():
        predictor = getattr(program, stage, None)
        if predictor is not None:
            predictor.signature = predictor.signature.with_instructions(text)
    return program


@dataclass
class System:
    name: str
    description: str
    program: dspy.Module
    compile_seconds: float | None = None
    compile_lm_calls: int | None = None


def without_cache(lm_config):
    """The same models with DSPy's response cache off, so every call is really made and timed."""
    from trace_dspy.lm.specs import LMConfig

    off = lambda spec: None if spec is None else replace(spec, cache=False)
    return LMConfig(default=off(lm_config.default), stages={k: off(v) for k, v in lm_config.stages.items()},
                    judge=off(lm_config.judge), prompt=off(lm_config.prompt))



def build_systems(names: Sequence[str], optimizers: Sequence[str], artifacts: Sequence[str], *, settings: Settings,
                  lms, retriever, train=(), dev=(), metric=None, optimizer_settings: dict | None = None,
                  log=say, prior=None) -> list[System]:
    """The systems to compare, all on the LMs of ``lms``; compiled ones are compiled here.

    Every staged system gets the same emotion ``prior`` (the default
    program's, fitted on the pool), so that they differ only in what the bench
    compares. Compiling optimizers that score candidates do it on ``dev``.
    """
    from trace_dspy.optimize.optimizers import OptimizerConfig, compile_program
    from trace_dspy.program.writers import part_fitter
    from trace_dspy.program.pipeline import TraceProgram

    systems: list[System] = []
    stage_lms = lms.stage_lms()
    for name in names:
        if name == "single_cot":
            program = SingleCallProgram()
        elif name == "trace_paper":
            program = paper_program(settings.program, retriever=retriever, stage_lms=stage_lms)
        elif name == "trace":
            program = TraceProgram(settings.program, stage_lms=stage_lms, retriever=retriever, emotion_prior=prior)
        else:
            raise ValueError(f"unknown system {name!r}; choose from {', '.join(BASE_SYSTEMS)}")
        if name == "trace_paper":
            program.emotion_prior = prior
        systems.append(System(name, SYSTEM_DESCRIPTIONS[name], program))
    for opt in optimizers:
        cfg = OptimizerConfig.from_dict({**(optimizer_settings or {}), "name": opt})
        student = TraceProgram(settings.program, stage_lms=stage_lms, retriever=retriever, emotion_prior=prior)
        log(f"compiling with {opt} on {len(train)} train examples")
        started = time.perf_counter()
        with dspy.context(lm=lms.default):
            result, calls = count_lm_calls(compile_program, cfg, student, metric, train, dev,
                                           prompt_lm=lms.role("prompt"), log=log,
                                           fit_parts=part_fitter(cfg, metric))
        systems.append(System(f"compiled_{opt}", f"TraceProgram compiled with {opt} ({len(train)} train)",
                              result.program, time.perf_counter() - started, calls))
    for ref in artifacts:
        from trace_dspy.workflows.loading import load_for_run

        loaded = load_for_run(ref, Settings())
        program = loaded.program
        if hasattr(program, "set_stage_lms"):  # same LM for every system
            program.set_stage_lms(stage_lms)
        systems.append(System(f"artifact:{ref}", f"compiled artifact {ref}", program))
    names_seen = [s.name for s in systems]
    if len(set(names_seen)) != len(names_seen):
        raise ValueError(f"duplicate systems: {names_seen}")
    if not systems:
        raise ValueError("no systems to compare")
    return systems
