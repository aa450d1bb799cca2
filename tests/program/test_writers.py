"""The writer switch (trace_dspy.program.writers): which writer runs, what each does, and that the standard path
never touches the compact writer's package."""

from __future__ import annotations

import json
import subprocess
import sys

import dspy
import pytest

from trace_dspy import ProgramConfig, TraceProgram
from trace_dspy.core.config import ConfigError
from trace_dspy.program.writers import resolve_writer
from trace_dspy.testing.fakes import fake_lm, stage_of


class _Embedded:
    """Looks like the embedded LM to the switch (an engine of the embedded kind), without loading a model."""

    def __init__(self):
        from trace_dspy.lm.engine import LlamaEngine

        self.engine = LlamaEngine.__new__(LlamaEngine)


def test_auto_is_compact_only_for_the_embedded_model_or_a_compact_layout():
    remote, _ = fake_lm()
    assert resolve_writer(ProgramConfig(), _Embedded()) == "compact"
    assert resolve_writer(ProgramConfig(), remote) == "standard"
    assert resolve_writer(ProgramConfig(reply_format="scaffold"), remote) == "compact"
    assert resolve_writer(ProgramConfig(writer="standard"), _Embedded()) == "standard"
    assert resolve_writer(ProgramConfig(writer="compact"), remote) == "compact"


def test_a_grammar_server_is_not_taken_for_the_small_model():
    # a large model behind a llama.cpp server with server_grammar used to get the 135M mode
    from trace_dspy.lm.specs import GrammarLM

    grammar = GrammarLM("openai/big", api_base="http://127.0.0.1:9/v1", api_key="x")
    program = TraceProgram(ProgramConfig())
    assert program.writer(grammar).name == "standard"
    assert (program.reply_format(grammar), program.best_of(grammar), program.prior_k(grammar)) == ("fields", 1, 5)


def test_the_standard_writer_refuses_a_compact_layout_by_name():
    with pytest.raises(ConfigError, match="compact writer's layout"):
        ProgramConfig(writer="standard", reply_format="scaffold")
    with pytest.raises(ConfigError, match="writer must be one of"):
        ProgramConfig(writer="small")
    assert ProgramConfig.from_dict(ProgramConfig(writer="compact").to_dict()).writer == "compact"


def test_a_standard_program_with_fitted_plans_writes_one_reply_for_the_lm_plan():
    # the default artifact's fitted plans used to start the plan race on any LM
    lm, engine = fake_lm(emotion="sad", strategy="ER", secondary_strategy="IP", response="That is hard news.")
    program = TraceProgram(ProgramConfig(prior_k=0)).with_parts(reply_plans=(("EX", "EX"),), first_plan=("IP", "EX"))
    with dspy.context(lm=lm):
        pred = program(dialogue="Speaker: My dog died.")
    assert pred.writer == "standard" and pred.plan_path == "lm"
    assert (pred.strategy, pred.secondary_strategy) == ("ER", "IP")
    assert "reply_plans" not in pred and "reply_rewards" not in pred
    assert [stage_of(call.outputs) for call in engine.calls].count("generate_response") == 1


def test_the_standard_writer_samples_by_the_metric_only_when_best_of_asks():
    lm, engine = fake_lm(emotion="sad", strategy="ER", secondary_strategy="IP", response="I am sorry.")
    program = TraceProgram(ProgramConfig(prior_k=0, best_of=3, best_of_threshold=1.0))
    seen = []
    program.reward_fn = lambda inputs, pred: seen.append(pred.response) or 0.1
    with dspy.context(lm=lm):
        pred = program(dialogue="Speaker: My dog died.")
    assert pred.writer == "standard" and len(pred.reply_rewards) == 3 and len(seen) == 3


STANDARD_RUN = r"""
import json, sys
import dspy
import trace_dspy
from trace_dspy.testing.fakes import fake_lm, stage_of

lm, engine = fake_lm(emotion="sad", cause_summary="a loss", cause_category="Loss & Failure", strategy="ER",
                     secondary_strategy="EX", response="I am so sorry.")
program = trace_dspy.load("trace-dspy@v6", attach_lms=False)
import dataclasses
program.config = dataclasses.replace(program.config, writer=sys.argv[1])
with dspy.context(lm=lm):
    pred = program(dialogue="Speaker: My grandmother passed away last week.")
print(json.dumps({"writer": pred.writer, "compact": sorted(m for m in sys.modules if m.startswith("trace_dspy.compact")),
                  "calls": [stage_of(c.outputs) for c in engine.calls]}))
"""


@pytest.mark.parametrize("writer", ["standard", "compact"])
def test_the_standard_path_never_imports_the_compact_writer(writer):
    run = subprocess.run([sys.executable, "-c", STANDARD_RUN, writer], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["writer"] == writer
    if writer == "standard":  # the packaged artifact, loaded and run, and nothing of the compact writer
        assert result["compact"] == []
        assert result["calls"].count("generate_response") == 1
    else:  # the check can fail: the compact writer does import it
        assert "trace_dspy.compact.writer" in result["compact"]
