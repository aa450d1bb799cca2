"""python -m trace_dspy.evaluate and the evaluation library, with fake LMs."""

from __future__ import annotations

import json

import dspy
import pytest
from trace_dspy.optimize.judge import EmpathyJudge
from trace_dspy.optimize.metric import (
    COST_KEYS,
    DELTA_KEYS,
    DETAIL_KEYS,
    HEADLINE_KEYS,
    PAIRED_KEYS,
    SUMMARY_KEYS,
    EmpathyMetric,
    MetricConfig,
    summary_keys,
)

import trace_dspy.lm.specs as lms_module
from trace_dspy import TraceProgram
from trace_dspy.bench import suite
from trace_dspy.cli.evaluate import main
from trace_dspy.core.config import ProgramConfig
from trace_dspy.core.pricing import Pricing
from trace_dspy.store import inspection
from trace_dspy.testing.fakes import fake_lm
from trace_dspy.workflows.evaluation import (
    TABLE_KEYS,
    FailureRateExceeded,
    evaluate_program,
    summarize,
)


def examples(n):
    return [dspy.Example(dialogue=f"Speaker: I lost my keys at beach number {i}.", emotion="sad",
                         response="Oh no, did you find them?", sample_id=f"s{i}",
                         conversation_id=f"c{i}").with_inputs("dialogue") for i in range(n)]


def reply_for(outputs, inputs):
    if "response" in outputs:
        return {"response": "Losing keys at the beach is awful; " + inputs["dialogue"][-3:-1] + "?"}
    return {}


def metric():
    return EmpathyMetric(embedder=None)


def test_rows_summary_and_resume(tmp_path):
    lm, engine = fake_lm(reply_for)
    rows = tmp_path / "rows.jsonl"
    first = evaluate_program(TraceProgram(), examples(6), metric(), lm=lm, threads=3, results_path=rows)
    assert first.summary["n"] == 6 and first.summary["failed"] == 0
    assert first.summary["emotion_acc"] == 1.0 and 0 < first.summary["empathy"] <= 1
    assert [r["id"] for r in first.rows] == [f"s{i}" for i in range(6)]
    assert len(engine.calls) == 24
    # Kill -9 mid-write: a torn last line. A rerun keeps the finished rows and redoes the rest.
    text = rows.read_text().splitlines(keepends=True)
    rows.write_text("".join(text[:4]) + text[4][:20])
    again = evaluate_program(TraceProgram(), examples(6), metric(), lm=lm, threads=1, results_path=rows)
    assert len(engine.calls) == 24 + 2 * 4
    timeless = lambda summary: {k: v for k, v in summary.items() if k != "seconds_per_dialogue"}  # noqa: E731
    assert timeless(again.summary) == timeless(first.summary)
    assert again.summary["lm_calls_per_dialogue"] == 4


def test_failures_are_counted_and_a_high_rate_stops_the_run(tmp_path):
    def flaky(outputs, inputs):
        if "emotion" in outputs and "3" in inputs["dialogue"]:
            return {"emotion": "not-a-label"}
        return reply_for(outputs, inputs)

    lm, _ = fake_lm(flaky)
    result = evaluate_program(TraceProgram(), examples(12), metric(), lm=lm, results_path=tmp_path / "r.jsonl")
    assert result.summary["failed"] == 1 and result.rows[3]["score"] == 0.0 and "error" in result.rows[3]
    assert result.summary["emotion_acc"] == pytest.approx(11 / 12)

    broken, _ = fake_lm(emotion="not-a-label")
    with pytest.raises(FailureRateExceeded, match="stopping instead of reporting a misleading score"):
        evaluate_program(TraceProgram(), examples(12), metric(), lm=broken, results_path=tmp_path / "b.jsonl")
    assert (tmp_path / "b.jsonl").read_text().count("\n") >= 10  # finished rows are kept


def test_threads_do_not_change_results():
    results = []
    for threads in (1, 8):
        lm, _ = fake_lm(reply_for)
        rows = evaluate_program(TraceProgram(), examples(16), metric(), lm=lm, threads=threads).rows
        assert all(r["lm_calls"] == 4 and r["prompt_tokens"] > 0 for r in rows)
        results.append([{k: v for k, v in r.items() if k != "seconds"} for r in rows])  # wall time varies
    assert results[0] == results[1]


def test_summary_counts_failed_rows_as_zero():
    rows = [{"id": "a", "score": 1.0, "gold_emotion": "sad", "gold_response": "x",
             "prediction": {"emotion": "sad", "response": "x"}, "components": {"emotion": 1.0},
             "rules": {"brief": True}},
            {"id": "b", "score": 0.0, "gold_emotion": "sad", "gold_response": "x", "error": "boom"}]
    summary = summarize(rows)
    assert summary["empathy"] == 0.5 and summary["failed"] == 1 and summary["emotion_acc"] == 0.5


def test_every_key_list_is_drawn_from_the_summary_keys():
    assert len(set(SUMMARY_KEYS)) == len(SUMMARY_KEYS)
    lists = {"COST_KEYS": COST_KEYS, "DETAIL_KEYS": DETAIL_KEYS, "HEADLINE_KEYS": HEADLINE_KEYS,
             "DELTA_KEYS": DELTA_KEYS, "PAIRED_KEYS": PAIRED_KEYS, "evaluation.TABLE_KEYS": TABLE_KEYS,
             "suite.SCORE_KEYS": suite.SCORE_KEYS, "inspection.SCORE_KEYS": inspection.SCORE_KEYS}
    for name, keys in lists.items():
        assert keys and set(keys) <= set(SUMMARY_KEYS), name
        assert list(keys) == [k for k in SUMMARY_KEYS if k in keys], f"{name} is not in display order"
    assert not set(TABLE_KEYS) & set(DETAIL_KEYS) and set(COST_KEYS) <= set(TABLE_KEYS)
    with pytest.raises(ValueError, match=r"not evaluation summary keys: \['emotion_accuracy'\]"):
        summary_keys("empathy", "emotion_accuracy")


def test_a_real_summary_has_exactly_the_summary_keys():
    # A judge, Best-of-N and prices, so that the keys only they bring are there too.
    lm, _ = fake_lm(reply_for)
    judge_lm, _ = fake_lm(emotional_reaction="strong", interpretation="weak", exploration="none",
                          relevance="good", fluency="good", justification="Warm.")
    class Tone:  # the tone head's interface, without the embedder
        meta = {"dev_table": {}}

        def pleasant(self, reply):
            return 0.3

    scorer = EmpathyMetric(MetricConfig(judge=0.2), judge=EmpathyJudge(judge_lm), embedder=None, tone=Tone())
    program = TraceProgram(ProgramConfig(best_of=2, best_of_threshold=1.0))
    result = evaluate_program(program, examples(2), scorer, lm=lm, pricing=Pricing())
    assert sorted(result.summary) == sorted(SUMMARY_KEYS)
    # The bench pairs the same measures per example (an accuracy as whether the label was right).
    assert set(suite.per_example(result.rows[0])) == set(suite.PAIRED_METRICS)


def test_cli_writes_table_rows_summary_and_mlflow_run(tmp_path, monkeypatch, capsys, ed_dir):
    lm, _ = fake_lm(reply_for)
    monkeypatch.setattr(lms_module, "build_lm", lambda spec: lm)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)  # the default store: ./mlflow.db, here tmp_path
    argv = ["--data", str(ed_dir), "--limit", "5", "--threads", "2", "--output-dir", "out"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "| empathy |" in out and "| emotion_acc |" in out
    summary = json.loads((tmp_path / "out/summary.json").read_text())
    assert summary["summary"]["n"] == 5 and summary["command"].startswith("python -m trace_dspy.evaluate")
    assert len((tmp_path / "out/examples.jsonl").read_text().splitlines()) == 5
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    (run,) = mlflow.search_runs(experiment_names=["trace-dspy"], output_format="list")
    assert run.data.metrics["test/empathy"] == pytest.approx(summary["summary"]["empathy"])
    assert run.data.params["split"] == "test" and run.data.tags["trace_dspy.kind"] == "evaluate"


def test_cli_reports_user_errors(capsys, tmp_path):
    assert main(["--program", str(tmp_path / "missing"), "--no-mlflow"]) == 2
    assert "cannot resolve program" in capsys.readouterr().err
    assert main(["--limit", "0"]) == 2


def quoting(outputs, inputs):
    """Quotes the speaker's words as the trigger span, so the audit's rule checks pass."""
    if "trigger_spans" in outputs:
        return {"trigger_spans": [inputs["dialogue"].splitlines()[-1].removeprefix("Speaker: ")]}
    return reply_for(outputs, inputs)


def test_ablation_runs_each_variant_on_the_same_examples(tmp_path, monkeypatch, capsys):
    lm, engine = fake_lm(quoting)
    monkeypatch.setattr(lms_module, "build_lm", lambda spec: lm)
    monkeypatch.chdir(tmp_path)
    assert main(["--ablation", "no_cause,with_reflection", "--limit", "4", "--threads", "1", "--no-mlflow",
                 "--output-dir", "abl"]) == 0
    out = capsys.readouterr().out
    assert "| full |" in out and "| no_cause |" in out and "| with_reflection |" in out and "[95% CI]" in out
    record = json.loads((tmp_path / "abl/ablation.json").read_text())
    assert set(record["table"]) == {"full", "no_cause", "with_reflection"}
    ids = [json.loads(line)["id"] for line in (tmp_path / "abl/full/examples.jsonl").read_text().splitlines()]
    for variant in ("no_cause", "with_reflection"):
        rows = (tmp_path / f"abl/{variant}/examples.jsonl").read_text().splitlines()
        assert sorted(json.loads(line)["id"] for line in rows) == sorted(ids)
    order = engine.stage_order()
    # 4 full runs (4 stages), 4 without the cause stage (3), 4 with one audit each (5).
    assert len(order) == 4 * 4 + 4 * 3 + 4 * 5 and order.count("reflect") == 4
    assert main(["--ablation", "no_such_thing", "--limit", "2", "--no-mlflow"]) == 2
