"""The stage registry is the one source of stage names: signatures, program, LM groups, fakes and metric agree."""

from __future__ import annotations

import ast
from dataclasses import replace
from pathlib import Path

import pytest
import trace_dspy.signatures as signatures

from trace_dspy.core import stages
from trace_dspy.core.config import ProgramConfig
from trace_dspy.core.stages import REGISTRY, STAGES, Stage

REPO = Path(__file__).resolve().parents[2]


def registry_problems(registry: tuple[Stage, ...], module) -> list[str]:
    """Every way ``registry`` and the signatures module disagree (empty when they match)."""
    problems = []
    built = {**module.STAGE_SIGNATURES, **module.OPTIONAL_SIGNATURES}
    for position, stage in enumerate(registry):
        sig = getattr(module, stage.signature, None)
        if sig is None:
            problems.append(f"{stage.name}: no signature class {stage.signature}")
            continue
        if built.get(stage.name) is not sig:
            problems.append(f"{stage.name}: not in STAGE_SIGNATURES/OPTIONAL_SIGNATURES as {stage.signature}")
        if stage.main_output not in sig.output_fields:
            problems.append(f"{stage.name}: {stage.main_output} is not an output of {stage.signature}")
        for gated in stage.gates:
            if gated not in sig.output_fields:
                problems.append(f"{stage.name}: gates {gated}, which it does not produce")
            later = [getattr(module, s.signature, None) for s in registry[position + 1:]]
            if not any(s is not None and gated in s.input_fields for s in later):
                problems.append(f"{stage.name}: gates {gated}, which no later stage takes")
    extra = set(built) - {s.name for s in registry}
    problems += [f"{name}: a signature with no registry row" for name in sorted(extra)]
    return problems


def test_the_registry_and_the_signatures_agree():
    assert registry_problems(REGISTRY, signatures) == []


def test_a_stage_added_to_the_registry_but_not_to_the_signatures_is_caught():
    new = Stage("summarize_need", "SummarizeNeed", core=True, optional=True, lm_group="analysis",
                main_output="need")
    assert registry_problems((*REGISTRY, new), signatures) == [
        "summarize_need: no signature class SummarizeNeed"]
    # a renamed output field is caught too
    wrong = tuple(replace(s, main_output="feeling") if s.name == "recognize_emotion" else s for s in REGISTRY)
    assert any("feeling is not an output" in p for p in registry_problems(wrong, signatures))


def test_every_stage_table_derives_from_the_registry():
    from trace_dspy.optimize.metric import _STAGE_NOTES
    from trace_dspy.signatures.baselines import (
        PAPER_INSTRUCTIONS,
        PAPER_REASONING_STAGES,
    )

    from trace_dspy.cli.common import STAGE_WORDS
    from trace_dspy.lm.specs import STAGE_GROUPS
    from trace_dspy.testing.fakes import stage_of

    assert tuple(STAGE_WORDS) == STAGES and all(STAGE_WORDS.values())
    assert sorted(s for group in STAGE_GROUPS.values() for s in group) == sorted(STAGES)
    assert set(_STAGE_NOTES) <= set(STAGES)
    assert set(PAPER_INSTRUCTIONS) == set(stages.CORE_STAGES)
    assert set(PAPER_REASONING_STAGES) <= set(STAGES)
    for stage in REGISTRY:  # the fakes name each prompt's stage by the registry's main output
        sig = getattr(signatures, stage.signature)
        assert stage_of(tuple(sig.output_fields)) == stage.name


def test_the_program_builds_one_predictor_per_registry_stage():
    from trace_dspy.program.pipeline import TraceProgram

    program = TraceProgram(ProgramConfig(commonsense=True, reflection=True))
    assert [name for name, _ in program.named_predictors()] == list(STAGES)
    plain = TraceProgram(ProgramConfig())
    assert [name for name, _ in plain.named_predictors()] == list(stages.CORE_STAGES)
    audit = signatures.AuditReply.output_fields["faulty_stage"].annotation
    assert audit.__args__ == ("none", *stages.AUDITABLE_STAGES)


# Literals in package code that may name two or more stages, each checked against the registry above.
ALLOWED = {("signatures/baselines.py", "PAPER_INSTRUCTIONS"), ("signatures/baselines.py", "PAPER_REASONING_STAGES")}


@pytest.mark.parametrize("root", ["trace_dspy", "signatures", "optimize"])
def test_no_other_module_writes_a_list_of_stage_names(root):
    found = []
    for path in sorted((REPO / root).rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        if rel == "trace_dspy/core/stages.py" or "__pycache__" in rel:
            continue
        tree = ast.parse(path.read_text())
        names_of = {}
        for node in ast.walk(tree):
            if isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    if isinstance(target, ast.Name) and node.value is not None:
                        names_of[id(node.value)] = target.id
        for node in ast.walk(tree):
            if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
                elements = node.elts
            elif isinstance(node, ast.Dict):
                elements = [k for k in node.keys if k is not None]
            else:
                continue
            named = [e.value for e in elements if isinstance(e, ast.Constant) and e.value in STAGES]
            if len(named) >= 2 and (rel, names_of.get(id(node))) not in ALLOWED:
                found.append(f"{rel}:{node.lineno} {named}")
    assert found == []
