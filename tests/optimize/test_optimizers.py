"""The optimizer registry: each optimizer compiles the program with a tiny budget (fake LMs)."""

from __future__ import annotations

import dspy
import pytest
from conftest import compile_reply, ring_trainset

from trace_dspy import TraceProgram
from trace_dspy.core.config import ConfigError
from trace_dspy.optimize.metric import EmpathyMetric
from trace_dspy.optimize.optimizers import OPTIMIZERS, OptimizerConfig, compile_program
from trace_dspy.testing.fakes import fake_lm

STAGES = ["recognize_emotion", "analyze_cause", "plan_strategy", "generate_response"]


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_each_optimizer_compiles_with_a_tiny_budget(name):
    if name == "mipro":
        pytest.importorskip("optuna")
    lm, _ = fake_lm(compile_reply, new_instruction="Be warm and specific.", proposed_instruction="Be warm.")
    response_lm, response_engine = fake_lm(compile_reply)
    program = TraceProgram(stage_lms={"generate_response": response_lm})
    cfg = OptimizerConfig(name=name, max_bootstrapped_demos=1, max_labeled_demos=1, mipro_candidates=2,
                          mipro_trials=2, gepa_max_metric_calls=16, gepa_minibatch=2, simba_steps=1,
                          simba_candidates=2, simba_bsize=2)
    with dspy.context(lm=lm):
        compiled = compile_program(cfg, program, EmpathyMetric(embedder=None), ring_trainset(), ring_trainset(3),
                                   prompt_lm=lm).program
        assert isinstance(compiled, TraceProgram)
        assert [n for n, _ in compiled.named_predictors()] == STAGES
        response_engine.calls.clear()
        assert compiled(dialogue="My cat is missing.").response
    # The stage LM survived compiling: every reply call (one per plan the program writes for) went to it.
    assert set(response_engine.stage_order()) == {"generate_response"}
    assert compiled.reply_plans == compiled.deepcopy().reply_plans  # the fitted plans survive copies too


def test_gepa_without_a_reflection_lm_is_a_clear_error():
    with pytest.raises(ConfigError, match="reflection LM"):
        compile_program(OptimizerConfig(name="gepa"), TraceProgram(), EmpathyMetric(embedder=None), ring_trainset(),
                        ring_trainset(2), prompt_lm=None)
