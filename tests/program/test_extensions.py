"""Commonsense and reflection stages, wired and bounded (fake LMs)."""

from __future__ import annotations

import dspy
import pytest

from trace_dspy import ProgramConfig, TraceProgram
from trace_dspy.core.config import ConfigError
from trace_dspy.testing.fakes import fake_lm

CORE = ["recognize_emotion", "analyze_cause", "plan_strategy", "generate_response"]
DIALOGUE = "Speaker: I failed my driving test again."


def audits_then(*verdicts):
    """A responder whose successive reflect calls return the given faulty stages."""
    queue = list(verdicts)

    def respond(outputs, inputs):
        if "faulty_stage" in outputs:
            stage = queue.pop(0) if queue else "none"
            return {"faulty_stage": stage, "critique": f"fix {stage}"}
        return {}

    return respond


def test_commonsense_feeds_the_cause_stage():
    lm, engine = fake_lm()
    program = TraceProgram(ProgramConfig(commonsense=True))
    assert [n for n, _ in program.named_predictors()] == ["recognize_emotion", "infer_commonsense", *CORE[1:]]
    with dspy.context(lm=lm):
        pred = program(dialogue=DIALOGUE)
    assert engine.stage_order() == ["recognize_emotion", "infer_commonsense", *CORE[1:]]
    note = engine.calls[2].inputs["commonsense"]
    assert "xIntent: to pass the test" in note and "xReact: disappointed" in note
    assert pred.x_want == "to try again"


def test_reflection_redoes_only_the_faulty_stage_and_after():
    lm, engine = fake_lm(audits_then("plan_strategy", "none"))
    program = TraceProgram(ProgramConfig(reflection=True))
    with dspy.context(lm=lm):
        pred = program(dialogue=DIALOGUE)
    assert engine.stage_order() == [*CORE, "reflect", "plan_strategy", "generate_response", "reflect"]
    assert [a["redo_from"] for a in pred.audits] == ["plan_strategy", None]
    # The redone stages see the audit's note; the first pass saw none.
    assert engine.calls[2].inputs["revision_note"] == ""
    assert engine.calls[5].inputs["revision_note"] == "fix plan_strategy"
    assert engine.calls[6].inputs["revision_note"] == "fix plan_strategy"
    assert pred.audits[0]["critique"] == "fix plan_strategy" and pred.audits[0]["round"] == 1


def test_reflection_rounds_are_bounded():
    lm, engine = fake_lm(audits_then(*["recognize_emotion"] * 10))
    program = TraceProgram(ProgramConfig(reflection=True, reflection_rounds=2))
    with dspy.context(lm=lm):
        pred = program(dialogue=DIALOGUE)
    assert len(pred.audits) == 2
    assert engine.stage_order() == [*CORE, "reflect", *CORE, "reflect", *CORE]
    with pytest.raises(ConfigError):
        ProgramConfig(reflection_rounds=0)


def test_rule_checks_catch_what_the_audit_missed():
    # The LM audit says all is well, but the spans are not quoted and the reply gives advice.
    lm, engine = fake_lm(trigger_spans=["I passed easily."], response="You should practise more.")
    program = TraceProgram(ProgramConfig(reflection=True, reflection_rounds=1))
    with dspy.context(lm=lm):
        pred = program(dialogue=DIALOGUE)
    audit = pred.audits[0]
    assert audit["rule_checks"] == {"no_advice": False, "spans_verbatim": False}
    assert audit["redo_from"] == "analyze_cause"  # the earliest faulty stage
    assert engine.stage_order()[5:] == ["analyze_cause", "plan_strategy", "generate_response"]
    assert "Rule broken: spans_verbatim." in engine.calls[5].inputs["revision_note"]


def test_a_disabled_faulty_stage_maps_to_the_next_one_that_runs():
    lm, engine = fake_lm(audits_then("plan_strategy"))
    program = TraceProgram(ProgramConfig(reflection=True, reflection_rounds=1, disabled=["plan_strategy"]))
    with dspy.context(lm=lm):
        pred = program(dialogue=DIALOGUE)
    assert pred.audits[0]["redo_from"] == "generate_response"
    assert engine.stage_order() == ["recognize_emotion", "analyze_cause", "generate_response", "reflect",
                                    "generate_response"]
    assert "strategy" not in engine.calls[3].inputs  # the audit is not asked about a plan that never ran


def test_optional_stages_are_optimizable_predictors():
    program = TraceProgram(ProgramConfig(commonsense=True, reflection=True))
    names = [n for n, _ in program.named_predictors()]
    assert names == ["recognize_emotion", "infer_commonsense", *CORE[1:], "reflect"]
    lm, _ = fake_lm()
    train = [dspy.Example(dialogue=DIALOGUE, emotion="sad", response="Oh no.").with_inputs("dialogue")]
    with dspy.context(lm=lm):
        compiled = dspy.BootstrapFewShot(metric=lambda e, p, trace=None: True, max_bootstrapped_demos=1,
                                         max_labeled_demos=0).compile(program, trainset=train)
    assert compiled.reflect.demos and compiled.infer_commonsense.demos
