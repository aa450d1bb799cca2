"""What a compile takes and gives is typed: the fit records come back beside the program, and the compile's config
holds the data table's sizes once."""

from __future__ import annotations

import dataclasses

import dspy

from trace_dspy import ProgramConfig, TraceProgram
from trace_dspy.core.config import DataConfig
from trace_dspy.optimize.optimizers import OptimizerConfig, compile_program
from trace_dspy.program.writers import part_fitter
from trace_dspy.testing.fakes import fake_lm

FIT_RECORD_NAMES = ("opener_fit", "plan_fit", "first_plan_fit")


def writer(outputs, inputs):
    """A writer that goes on from each opener with a question, and a sad speaker for the emotion stage."""
    if "prefill" in inputs:
        return {"response": " about it now?" if inputs["prefill"].endswith("How are you feeling")
                else " something about your day."}
    if "emotion" in outputs and "dialogue" in inputs:
        return {"emotion": "sad"}
    return {}


def metric(example, pred, trace=None):
    return 0.9 if pred.response.startswith("I'm so sorry") else 0.3 if "?" in pred.response else 0.1


def test_the_optimizer_returns_the_fit_records_beside_a_program_that_does_not_carry_them():
    lm, _ = fake_lm(writer, strategy="ER", secondary_strategy="EX")
    program = TraceProgram(ProgramConfig(reply_format="scaffold", prior_k=0, best_of=1))
    trainset = [dspy.Example(dialogue=f"Speaker: My cat ran away this morning, day {i}.", response="Oh no.")
                .with_inputs("dialogue") for i in range(4)]
    cfg = OptimizerConfig(name="labeled", opener_items=4, plan_items=4)
    with dspy.context(lm=lm):
        result = compile_program(cfg, program, metric, trainset, [], fit_parts=part_fitter(cfg, metric))
    fits = result.fits
    records = [fits.reply_openers, fits.reply_plans, fits.first_plan]
    assert [record["items"] for record in records] == [4, 4, 4]
    compiled = result.program
    assert isinstance(compiled, TraceProgram) and compiled.reply_openers is not None  # the fitted part itself
    # The records travel only in the result: none is an attribute of the program (which a copy or a save
    # would carry along, or lose).
    assert not [name for name in FIT_RECORD_NAMES if hasattr(compiled, name)]
    assert not [name for name, value in vars(compiled).items()
                if any(value is record for record in records)]


def test_the_compile_config_holds_the_data_sizes_once():
    from trace_dspy.cli.compile import config_from_args
    from trace_dspy.workflows.compiling import CompileConfig

    repeated = {f.name for f in dataclasses.fields(CompileConfig)} & {f.name for f in dataclasses.fields(DataConfig)}
    assert not repeated, f"CompileConfig repeats DataConfig's {sorted(repeated)}"
    cfg = config_from_args(["--no-mlflow", "--data", "d.jsonl", "--train", "5", "--val", "2"])
    assert cfg.data == DataConfig(source="d.jsonl", train=5, dev=DataConfig.dev, val=2)
    assert cfg.record()["data"] == {"source": "d.jsonl", "situations": None, "train": 5, "dev": DataConfig.dev,
                                    "val": 2, "seed": 0}
