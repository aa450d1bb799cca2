"""What a hosted LM would cost: the arithmetic on runs with known token counts, the prices in every record,
and clear errors for bad prices."""

from __future__ import annotations

import dataclasses
import json

import dspy
import pytest
from dspy.lm15 import Usage

from trace_dspy import TraceProgram
from trace_dspy.bench.quality import run_quality
from trace_dspy.bench.systems import SingleCallProgram, System
from trace_dspy.core.config import ProgramConfig
from trace_dspy.core.pricing import COST_KEY, PriceError, Pricing
from trace_dspy.optimize.metric import EmpathyMetric
from trace_dspy.testing.fakes import ScriptedEngine
from trace_dspy.workflows.evaluation import evaluate_program
from conftest import FAST_CONFIG, echo_reply, offline_workdir

PROMPT, COMPLETION = 100, 10  # tokens every call of the fixed-usage model reports


class FixedUsage(ScriptedEngine):
    """The scripted model, reporting PROMPT input and COMPLETION output tokens for every call."""

    def complete(self, request):
        response = super().complete(request)
        return dataclasses.replace(response, usage=Usage(input_tokens=PROMPT, output_tokens=COMPLETION,
                                                         total_tokens=PROMPT + COMPLETION))


def fixed_lm() -> dspy.LM:
    return dspy.LM("fake/fixed", engine=FixedUsage(responder=echo_reply), cache=False)


def examples(n: int) -> list[dspy.Example]:
    return [dspy.Example(dialogue=f"Speaker: I lost my keys at beach number {i}.", emotion="sad",
                         response="Oh no, did you find them?", sample_id=f"s{i}").with_inputs("dialogue")
            for i in range(n)]


def test_the_arithmetic():
    prices = Pricing(0.15, 0.60)
    assert prices.cost(1_000_000, 1_000_000) == pytest.approx(0.75)
    # 400 input and 40 output tokens a dialogue: (400 * 0.15 + 40 * 0.60) / 1e6 USD each, 0.084 USD per 1,000.
    summary = {"prompt_tokens_per_dialogue": 400.0, "completion_tokens_per_dialogue": 40.0}
    assert prices.per_dialogues(summary) == pytest.approx(0.084)
    assert prices.per_dialogues({"prompt_tokens_per_dialogue": 400.0}) is None  # no tokens, no cost
    assert Pricing().to_dict() == {"currency": "USD", "unit": "per million tokens", "input_per_million": 0.15,
                                   "output_per_million": 0.60, "cost_per": "1000 dialogues"}


def test_a_scripted_run_costs_its_calls_at_the_given_prices():
    """Four stages a dialogue at 100 input and 10 output tokens each; the single call makes one."""
    pricing = Pricing(input_per_million=2.0, output_per_million=8.0)
    program = TraceProgram(ProgramConfig(prior_k=0, best_of=1))
    result = evaluate_program(program, examples(3), EmpathyMetric(embedder=None), lm=fixed_lm(), pricing=pricing)
    s = result.summary
    assert (s["lm_calls_per_dialogue"], s["prompt_tokens_per_dialogue"], s["completion_tokens_per_dialogue"]) == (
        4, 4 * PROMPT, 4 * COMPLETION)
    assert s[COST_KEY] == pytest.approx(1000 * (400 * 2.0 + 40 * 8.0) / 1e6)  # USD 1.12 per 1,000 dialogues
    unpriced = evaluate_program(program, examples(3), EmpathyMetric(embedder=None), lm=fixed_lm())
    assert COST_KEY not in unpriced.summary

    systems = [System("single_cot", "one call", SingleCallProgram()), System("trace", "staged", program)]
    report = run_quality(systems, examples(3), EmpathyMetric(embedder=None), lm=fixed_lm(), pricing=pricing)
    record = report.to_dict()["hosted_cost"]
    assert record["pricing"]["input_per_million"] == 2.0 and record["pricing"]["output_per_million"] == 8.0
    assert record[COST_KEY]["single_cot"] == pytest.approx(1000 * (100 * 2.0 + 10 * 8.0) / 1e6)
    assert record["times_single_cot"] == {"single_cot": pytest.approx(1.0), "trace": pytest.approx(4.0)}
    table = report.markdown()
    assert "at USD 2 per million input tokens, 8 per million output tokens" in table
    assert "| cost vs single_cot | 1.00x | 4.00x |" in table and "| cost_per_1000_dialogues | 0.2800 | 1.1200 |" in table


def test_the_evaluate_record_states_its_prices(tmp_path, monkeypatch, capsys):
    from trace_dspy.cli.evaluate import main

    offline_workdir(tmp_path, monkeypatch, fixed_lm())
    (tmp_path / "fast.toml").write_text(FAST_CONFIG)
    assert main(["--limit", "2", "--threads", "1", "--no-mlflow", "--config", "fast.toml", "--output-dir", "out",
                 "--price-input", "0.5", "--price-output", "1.5"]) == 0
    out = capsys.readouterr().out
    record = json.loads((tmp_path / "out/summary.json").read_text())
    assert record["pricing"]["input_per_million"] == 0.5 and record["pricing"]["output_per_million"] == 1.5
    summary = record["summary"]
    expected = 1000 * (summary["prompt_tokens_per_dialogue"] * 0.5 + summary["completion_tokens_per_dialogue"] * 1.5) / 1e6
    assert summary[COST_KEY] == pytest.approx(expected) and expected > 0
    assert "| cost_per_1000_dialogues |" in out
    assert "per 1,000 dialogues at USD 0.5 per million input tokens, 1.5 per million output tokens" in out


def test_the_bench_record_states_its_prices_beside_the_single_call(tmp_path, monkeypatch, capsys):
    from trace_dspy.cli.bench import main

    offline_workdir(tmp_path, monkeypatch, fixed_lm())
    (tmp_path / "fast.toml").write_text(FAST_CONFIG)
    assert main(["quality", "--limit", "2", "--systems", "single_cot,trace", "--optimizers", "", "--no-mlflow",
                 "--config", "fast.toml", "--output-dir", "out", "--price-input", "1", "--price-output", "3"]) == 0
    out = capsys.readouterr().out
    result = json.loads((tmp_path / "out/quality.json").read_text())["result"]
    assert result["hosted_cost"]["pricing"]["input_per_million"] == 1.0
    assert result["hosted_cost"]["pricing"]["output_per_million"] == 3.0
    costs = result["hosted_cost"][COST_KEY]
    assert costs["single_cot"] == pytest.approx(1000 * (PROMPT * 1 + COMPLETION * 3) / 1e6)
    assert result["hosted_cost"]["times_single_cot"]["trace"] == pytest.approx(costs["trace"] / costs["single_cot"])
    assert "| cost vs single_cot | 1.00x |" in out and "at USD 1 per million input tokens" in out


@pytest.mark.parametrize("value, message", [
    (-0.1, "must be a finite number >= 0"), (float("nan"), "must be a finite number >= 0"),
    (float("inf"), "must be a finite number >= 0"), ("cheap", "must be a number of USD per million tokens"),
    (None, "must be a number of USD per million tokens"), (True, "must be a number of USD per million tokens"),
])
def test_a_bad_price_is_a_clear_error(value, message):
    with pytest.raises(PriceError, match=f"the input price {message}"):
        Pricing(input_per_million=value)
    with pytest.raises(PriceError, match=f"the output price {message}"):
        Pricing(output_per_million=value)


@pytest.mark.parametrize("argv, message", [
    (["--price-input", "-1"], "argument --price-input: the price must be a finite number >= 0"),
    (["--price-output", "abc"], "argument --price-output: the price must be a number of USD per million tokens, "
                                "such as 0.15, not 'abc'"),
])
def test_a_bad_price_on_the_command_line_is_a_clear_error(argv, message, capsys):
    from trace_dspy.cli import bench, evaluate

    for main, prefix in ((evaluate.main, []), (bench.main, ["quality"])):
        with pytest.raises(SystemExit) as stopped:
            main([*prefix, *argv])
        assert stopped.value.code == 2
        assert message in capsys.readouterr().err
