"""The benchmark suite runs end to end on fake LMs, so that it cannot break silently."""

from __future__ import annotations

import json

import dspy
import pytest

import trace_dspy.lm.specs as lms_module
from trace_dspy import TraceProgram
from trace_dspy.bench.suite import (
    SingleCallProgram,
    TimedEngine,
    measure_concurrency,
    measure_overhead,
    paper_program,
    per_example,
)
from trace_dspy.cli.bench import main
from trace_dspy.core.config import ProgramConfig
from trace_dspy.data.sources import load_test
from conftest import FAST_CONFIG
from trace_dspy.testing.fakes import ScriptedEngine, fake_lm, stage_of

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def by_call(outputs, inputs):
    """The single call names 'joyful'; the staged program names 'sad' (so their emotion scores differ)."""
    if "emotion" in outputs:
        return {"emotion": "joyful" if "response" in outputs else "sad"}
    return {}


def test_baseline_is_one_call_and_the_paper_system_uses_its_own_instructions(fake):
    pred = SingleCallProgram()(dialogue="I failed my driving test again.")
    assert len(fake.calls) == 1 and set(fake.calls[0].outputs) == {"reasoning", "emotion", "response"}
    assert pred.emotion == "sad" and pred.emotion_group == "sadness" and pred.response

    fake.calls.clear()
    paper_program(ProgramConfig())(dialogue="I failed my driving test again.")
    assert [stage_of(c.outputs) for c in fake.calls] == [
        "recognize_emotion", "analyze_cause", "plan_strategy", "generate_response"]
    assert "affective state identifier" in fake.calls[0].instructions
    assert "causal analysis engine" in fake.calls[1].instructions
    # The published identifier and planner reason before answering; the others do not.
    assert ["reasoning" in c.outputs for c in fake.calls] == [True, False, True, False]
    fake.calls.clear()
    TraceProgram()(dialogue="I failed my driving test again.")
    assert "affective state identifier" not in fake.calls[0].instructions


def test_per_example_values_score_failures_as_zero():
    ok = {"score": 0.5, "gold_emotion": "sad", "gold_response": "so sorry about the test",
          "prediction": {"emotion": "lonely", "response": "so sorry about the test"},
          "components": {"emotion": 0.5, "rules": 1.0, "similarity": 0.9, "relevance": 0.4}}
    values = per_example(ok)
    assert values["emotion_correct"] == 0.0 and values["group_correct"] == 1.0  # lonely and sad share a group
    assert values["token_f1"] == 1.0 and values["rouge_l"] == 1.0 and values["similarity"] == 0.9
    failed = {"score": 0.0, "gold_emotion": "sad", "gold_response": "x", "error": "boom",
              "prediction": {"emotion": "sad"}}
    assert set(per_example(failed).values()) == {0.0}


def test_quality_bench_tables_intervals_charts_and_mlflow(tmp_path, monkeypatch, capsys):
    lm, engine = fake_lm(by_call)
    monkeypatch.setattr(lms_module, "build_lm", lambda spec: lm)
    monkeypatch.chdir(tmp_path)
    # Model-free settings (no prior to fit on the ED pool, token-F1 similarity): the tables are the subject.
    (tmp_path / "fast.toml").write_text(FAST_CONFIG)
    argv = ["--limit", "8", "--optimizers", "labeled", "--train", "4", "--dev", "4", "--output-dir", "out",
            "--config", "fast.toml", "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}"]
    assert main(argv) == 0  # no sub-command: the quality bench
    out = capsys.readouterr().out
    for system in ("single_cot", "trace_paper", "trace", "compiled_labeled"):
        assert f"`{system}`" in out
    record = json.loads((tmp_path / "out/quality.json").read_text())
    result = record["result"]
    assert result["baseline"] == "single_cot" and record["command"].startswith("python -m trace_dspy.bench")
    summaries = result["summaries"]
    assert summaries["single_cot"]["lm_calls_per_dialogue"] == 1
    assert summaries["trace"]["lm_calls_per_dialogue"] == 4 and summaries["trace_paper"]["lm_calls_per_dialogue"] == 4
    assert summaries["trace_paper"]["prompt_tokens_per_dialogue"] > summaries["single_cot"]["prompt_tokens_per_dialogue"]
    assert all(s["n"] == 8 and s["failed"] == 0 for s in summaries.values())
    assert result["run"]["lm"]["default"]["cache"] is False  # every call is really made, so costs are real
    # LabeledFewShot only copies demos, and on a model other than the embedded one the standard writer has no
    # plans to fit (the further-plan fit is the compact writer's): the compile makes no LM call.
    assert result["compile"]["compiled_labeled"]["lm_calls"] == 0

    # The paired intervals are over the same examples: recompute one by hand from the rows.
    # Rows are appended as threads finish them, so the two files are paired by id, not by line.
    rows = {name: sorted((json.loads(x) for x in (tmp_path / f"out/quality_rows/{name}.jsonl").read_text().splitlines()),
                         key=lambda r: r["id"])
            for name in ("single_cot", "trace")}
    assert [r["id"] for r in rows["trace"]] == [r["id"] for r in rows["single_cot"]] and len(rows["trace"]) == 8
    diffs = [per_example(t)["emotion_correct"] - per_example(b)["emotion_correct"]
             for t, b in zip(rows["trace"], rows["single_cot"])]
    diff, low, high = result["paired_vs_baseline"]["trace"]["emotion_correct"]
    assert diff == pytest.approx(sum(diffs) / len(diffs)) and low <= diff <= high
    assert result["paired_vs_baseline"]["single_cot"]["empathy"] == [0.0, 0.0, 0.0]

    for png in ("bench_score.png", "bench_tokens_vs_score.png"):
        data = (tmp_path / "out" / png).read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 5000

    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = mlflow.search_runs(experiment_names=["trace-dspy-bench"], output_format="list")
    systems = {r.data.tags.get("trace_dspy.system"): r for r in runs if r.data.tags.get("trace_dspy.system")}
    assert set(systems) == {"single_cot", "trace_paper", "trace", "compiled_labeled"}
    assert systems["trace"].data.metrics["test/empathy"] == pytest.approx(summaries["trace"]["empathy"])
    assert "vs_baseline/empathy_ci_low" in systems["trace"].data.metrics
    (parent,) = [r for r in runs if r.data.tags.get("trace_dspy.kind") == "bench-quality"]
    assert all(r.data.tags.get("mlflow.parentRunId") == parent.info.run_id for r in systems.values())

    # A rerun resumes from the rows: the LM is not asked again (labeled only copies demos; the standard writer
    # fits no plans).
    calls = len(engine.calls)
    assert main(argv + ["--no-mlflow"]) == 0
    assert len(engine.calls) == calls


def test_quality_bench_user_errors(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["quality", "--systems", "trace,nope", "--no-mlflow"]) == 2
    assert "unknown system or optimizer: nope" in capsys.readouterr().err
    assert main(["quality", "--limit", "0", "--no-mlflow"]) == 2
    with pytest.raises(SystemExit):
        main(["concurrency", "--levels", "0,2"])


def test_overhead_times_every_stage_outside_the_lm():
    examples = load_test(None, limit=6, seed=0)
    result = measure_overhead(examples, TraceProgram(), warmup=1, clock="cpu")
    assert result["clock"] == "cpu"
    with pytest.raises(ValueError, match="clock"):
        measure_overhead(examples, TraceProgram(), clock="sundial")
    stages = ("recognize_emotion", "analyze_cause", "plan_strategy", "generate_response")
    assert set(result["per_stage"]) == set(stages)
    assert all(result["per_stage"][s]["calls"] == 6 for s in stages) and result["stage_calls"] == 24
    # A dialogue's time outside the LM contains its stages' time outside the LM.
    stage_sum = sum(result["per_stage"][s]["mean_ms"] for s in stages)
    assert result["per_dialogue"]["mean_ms"] >= stage_sum > 0


def test_timed_engine_counts_only_time_inside_the_engine():
    class Slow(ScriptedEngine):
        def complete(self, request):
            import time

            time.sleep(0.01)
            return super().complete(request)

    engine = TimedEngine(Slow())
    with dspy.context(lm=dspy.LM("fake/slow", engine=engine, cache=False)):
        TraceProgram()(dialogue="I failed my driving test again.")
    assert engine.elapsed() >= 4 * 0.01
    assert len(engine.inner.calls) == 4


def test_concurrency_counts_every_call_at_every_level():
    examples = load_test(None, limit=4, seed=0)
    result = measure_concurrency(examples, TraceProgram(), levels=(1, 3), latency=0.005, per_thread=2,
                                 min_dialogues=2)
    first, second = result["levels"]
    assert (first["threads"], first["dialogues"], first["lm_calls"]) == (1, 2, 8)
    assert (second["threads"], second["dialogues"], second["lm_calls"]) == (3, 6, 24)
    assert first["speedup"] == 1.0 and second["dialogues_per_second"] > 0


def test_compile_bench_warm_rerun_is_served_from_the_cache(tmp_path, monkeypatch):
    engine = ScriptedEngine()
    monkeypatch.setattr(lms_module, "build_lm",
                        lambda spec: dspy.LM("fake/scripted", engine=engine, cache=spec.cache))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "fast.toml").write_text(FAST_CONFIG)  # the cache is the subject, not the prior's fit
    assert main(["compile", "--optimizer", "bootstrap", "--train", "4", "--dev", "4", "--output-dir", "out",
                 "--config", "fast.toml", "--no-mlflow"]) == 0
    result = json.loads((tmp_path / "out/compile.json").read_text())["result"]
    assert result["cold"]["lm_calls"] > 0 and result["warm"]["lm_calls"] == 0
    assert result["warm"]["dev_after"] == result["cold"]["dev_after"]
    assert len(engine.calls) == result["cold"]["lm_calls"]
    assert dspy.cache.enable_disk_cache is False  # the caller's cache settings are restored


def test_overhead_and_concurrency_commands_write_their_records(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["overhead", "--dialogues", "3", "--warmup", "0", "--clock", "cpu", "--output-dir", "out",
                 "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}"]) == 0
    record = json.loads((tmp_path / "out/overhead-cpu.json").read_text())
    assert record["result"]["stage_calls"] == 12 and "| any stage call | 12 |" in capsys.readouterr().out
    assert main(["concurrency", "--levels", "1,2", "--latency", "0.001", "--per-thread", "1", "--output-dir", "out",
                 "--no-mlflow"]) == 0
    levels = json.loads((tmp_path / "out/concurrency.json").read_text())["result"]["levels"]
    assert [(r["threads"], r["lm_calls"]) for r in levels] == [(1, 32), (2, 32)]

    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    (run,) = mlflow.search_runs(experiment_names=["trace-dspy-bench"], output_format="list")
    assert run.data.tags["trace_dspy.kind"] == "bench-overhead-cpu"
    assert run.data.metrics["per_stage_call/mean_ms"] == pytest.approx(record["result"]["per_stage_call"]["mean_ms"])


def test_a_system_with_the_same_program_is_evaluated_once(monkeypatch):
    """``select`` may keep the uncompiled program: the bench then shares its rows instead of a second run."""
    from trace_dspy.bench.suite import System, run_quality
    from trace_dspy.optimize.metric import EmpathyMetric

    lm, engine = fake_lm(by_call)
    examples = load_test(None, limit=3)
    program = TraceProgram()
    other = TraceProgram()
    other.generate_response.signature = other.generate_response.signature.with_instructions("Be brief.")
    systems = [System("trace", "", program), System("compiled_select", "", program.deepcopy()),
               System("other", "", other)]
    with dspy.context(lm=lm):
        report = run_quality(systems, examples, EmpathyMetric(embedder=None), lm=lm)
    assert len(engine.calls) == 2 * 3 * 4  # trace and other, three dialogues, four stages
    assert report.summaries["compiled_select"]["same_program_as"] == "trace"
    assert report.summaries["compiled_select"]["empathy"] == report.summaries["trace"]["empathy"]
    assert "same_program_as" not in report.summaries["other"]
