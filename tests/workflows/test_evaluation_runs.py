"""Evaluations as MLflow evaluation runs: one trace per dialogue with stage spans and LM spans, one
assessment per metric part, scorer means equal to summary.json, the dataset and the compiled model linked,
and a two-program comparison in one command."""

from __future__ import annotations

import json

import pytest

from conftest import compile_fast
from trace_dspy.store.evaluations import SCORER_SUMMARY_KEYS, row_scores

STAGE_SPANS = {"trace_dspy", "emotion prior", "emotion", "cause", "strategy", "response"}


@pytest.fixture
def compared(tmp_path, monkeypatch, capsys):
    """A compile (fake LM, logs a model), then evaluate the uncompiled program against it on 4 items."""
    from trace_dspy.cli.evaluate import main

    uri = compile_fast(tmp_path, monkeypatch)
    capsys.readouterr()
    code = main(["--program", "default", "--program", "trace-dspy@v1", "--limit", "4", "--threads", "2",
                 "--tracking-uri", uri, "--output-dir", "cmp"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return uri, tmp_path / "cmp", captured


def _runs(uri):
    import mlflow

    mlflow.set_tracking_uri(uri)
    runs = mlflow.search_runs(experiment_names=["trace-dspy"], output_format="list",
                              filter_string="tags.`trace_dspy.kind` = 'evaluate'")
    return {r.data.params["program_ref"]: r for r in runs}


def test_each_program_is_an_evaluation_run_with_one_traced_dialogue_per_item(compared):
    import mlflow

    uri, out, captured = compared
    runs = _runs(uri)
    assert set(runs) == {"default", "trace-dspy@v1"}
    for ref, folder in (("default", "default"), ("trace-dspy@v1", "trace-dspy-v1")):
        run = runs[ref]
        summary = json.loads((out / folder / "summary.json").read_text())
        rows = [json.loads(line) for line in (out / folder / "examples.jsonl").read_text().splitlines()]
        assert summary["mlflow"]["run_id"] == run.info.run_id
        assert run.data.tags.get("mlflow.runType") == "genai_evaluate"  # listed under "Evaluation runs"
        # MLflow's scorer means are the summary's numbers.
        for name, key in SCORER_SUMMARY_KEYS.items():
            if key in summary["summary"]:
                assert run.data.metrics[f"{name}/mean"] == pytest.approx(summary["summary"][key]), name
        # The dataset: the seed set's test view, seed 0, 4 items, with its digest.
        (dataset_input,) = run.inputs.dataset_inputs
        assert dataset_input.dataset.name == "seed-test-trace-seed0-n4" and dataset_input.dataset.digest
        assert json.loads(dataset_input.dataset.source)["fingerprint"] == summary["data"]["fingerprint"]

        traces = mlflow.search_traces(run_id=run.info.run_id, return_type="list")
        assert len(traces) == 4 and {t.info.trace_id for t in traces} == {r["trace_id"] for r in rows}
        by_id = {r["trace_id"]: r for r in rows}
        for trace in traces:
            names = [s.name for s in trace.data.spans]
            assert STAGE_SPANS <= set(names), names
            lm_spans = [s for s in trace.data.spans if s.name.startswith("lm ")]
            # One per stage call (the prompt in, the completion out); the reply stage is called once per plan
            # it writes for: the planner's, and the further plans the compile chose.
            plans = by_id[trace.info.trace_id]["prediction"].get("reply_plans") or [None]
            assert len(lm_spans) == 3 + len(plans)
            if ref == "default":
                assert plans == [None]  # the uncompiled program writes for the planner's plan only
            assert all(s.inputs["messages"] and s.outputs for s in lm_spans)
            assert all(s.attributes["mlflow.chat.tokenUsage"]["total_tokens"] > 0 for s in lm_spans)
            response = next(s for s in trace.data.spans if s.name == "response")
            assert response.outputs["response"] == by_id[trace.info.trace_id]["prediction"]["response"]
            # One assessment per metric part, with the row's own value.
            got = {a.name: a.value for a in trace.info.assessments}
            assert got == pytest.approx(row_scores(by_id[trace.info.trace_id]))


def test_the_compiled_programs_run_links_its_logged_model(compared):
    from mlflow import MlflowClient

    uri, _, _ = compared
    runs = _runs(uri)
    client = MlflowClient(tracking_uri=uri)
    champion = client.get_model_version_by_alias("trace-dspy", "champion")
    run = client.get_run(runs["trace-dspy@v1"].info.run_id)
    linked = [m.model_id for m in (run.inputs.model_inputs or [])]
    assert linked == [champion.source.removeprefix("models:/")]  # the version's source is the logged model
    # the uncompiled program has no logged model
    assert not client.get_run(runs["default"].info.run_id).inputs.model_inputs


def test_the_comparison_is_paired_on_the_same_items(compared):
    _, out, captured = compared
    record = json.loads((out / "compare.json").read_text())
    assert record["run"]["programs"] == ["default", "trace-dspy@v1"]
    diff, low, high = record["table"]["trace-dspy@v1"]["empathy_diff"]
    a = json.loads((out / "default/summary.json").read_text())["summary"]["empathy"]
    b = json.loads((out / "trace-dspy-v1/summary.json").read_text())["summary"]["empathy"]
    assert diff == pytest.approx(b - a) and low <= diff <= high
    assert "empathy vs default [95% CI]" in captured.out
    ids = [[json.loads(line)["id"] for line in (out / f / "examples.jsonl").read_text().splitlines()]
           for f in ("default", "trace-dspy-v1")]
    assert sorted(ids[0]) == sorted(ids[1])
    # The UI path of the dialogue-by-dialogue view names both runs.
    runs = [json.loads((out / f / "summary.json").read_text())["mlflow"]["run_id"] for f in ("default", "trace-dspy-v1")]
    assert f"evaluation-runs?selectedRunUuid={runs[1]}&compareToRunUuid={runs[0]}" in captured.out


def test_tracing_is_off_unless_asked(tmp_path, monkeypatch):
    """respond without --trace, and an untraced evaluation, leave no trace; the switch reaches threads."""
    import dspy

    from conftest import echo_reply
    from trace_dspy.core import spans
    from trace_dspy.core.console import with_dspy_context
    from trace_dspy.program.pipeline import TraceProgram
    from trace_dspy.store.traces import tracing
    from trace_dspy.testing.fakes import fake_lm

    assert not spans.enabled()
    with tracing():
        assert with_dspy_context(spans.enabled)() is True
    assert with_dspy_context(spans.enabled)() is False
    lm, _ = fake_lm(echo_reply)
    with dspy.context(lm=lm):
        TraceProgram()(dialogue="I lost my keys on the bus.")
    assert spans.last_trace_id() is None


def test_respond_traces_when_asked(tmp_path, monkeypatch, capsys):
    import mlflow

    import trace_dspy.lm.specs as lms_module
    from conftest import echo_reply
    from trace_dspy.cli.respond import main
    from trace_dspy.testing.fakes import fake_lm

    lm, _ = fake_lm(echo_reply)
    monkeypatch.setattr(lms_module, "build_lm", lambda spec: lm)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert main(["--program", "default", "I lost my keys on the bus."]) == 0
    assert not (tmp_path / "mlflow.db").exists()  # no --trace: nothing recorded
    assert main(["--program", "default", "--trace", "I lost my keys on the bus."]) == 0
    err = capsys.readouterr().err
    assert "traces are in the MLflow experiment trace-dspy (the last one here: tr-" in err
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    (trace,) = mlflow.search_traces(locations=[mlflow.get_experiment_by_name("trace-dspy").experiment_id],
                                    return_type="list")
    assert {"emotion", "cause", "strategy", "response"} <= {s.name for s in trace.data.spans}
    (tmp_path / "t.toml").write_text("[tracing]\nenabled = 1\n")
    assert main(["--program", "default", "--config", "t.toml", "hi there"]) == 2
    assert "[tracing] takes one key" in capsys.readouterr().err


def test_a_compile_logs_its_dev_evaluations_and_registers_its_prompts(tmp_path, monkeypatch):
    import mlflow
    from mlflow import MlflowClient

    uri = compile_fast(tmp_path, monkeypatch)
    mlflow.set_tracking_uri(uri)
    runs = mlflow.search_runs(experiment_names=["trace-dspy"], output_format="list",
                              filter_string="tags.`trace_dspy.kind` = 'compile-evaluation'")
    by_name = {r.info.run_name: r for r in runs}
    assert set(by_name) == {"trace-dspy dev before", "trace-dspy dev after"}
    client = MlflowClient(tracking_uri=uri)
    champion = client.get_model_version_by_alias("trace-dspy", "champion")
    manifest = json.loads((tmp_path / "artifacts/trace-dspy/v0001/manifest.json").read_text())
    for name, run in by_name.items():
        assert run.data.tags["mlflow.runType"] == "genai_evaluate"
        assert run.data.tags["mlflow.parentRunId"] == manifest["mlflow"]["run_id"]
        traces = mlflow.search_traces(run_id=run.info.run_id, return_type="list")
        assert len(traces) == 3  # the dev set
        key = "dev_after" if name.endswith("after") else "dev_before"
        assert run.data.metrics["empathy/mean"] == pytest.approx(manifest["scores"][key]["empathy"])
    linked = client.get_run(by_name["trace-dspy dev after"].info.run_id).inputs.model_inputs
    assert [m.model_id for m in linked] == [champion.source.removeprefix("models:/")]
    program = json.loads((tmp_path / "artifacts/trace-dspy/v0001/program.json").read_text())
    for stage in ("recognize_emotion", "generate_response"):
        prompt = mlflow.genai.load_prompt(f"prompts:/trace-dspy.{stage}/1")
        state = program.get(stage) or program.get(f"{stage}.predict")
        assert prompt.template == state["signature"]["instructions"]
        assert prompt.tags["artifact_version"] == "trace-dspy@v1" and prompt.tags["demos"] == str(len(state["demos"]))


def test_candidates_and_reflection_rounds_are_spans(tmp_path):
    """Best-of-N candidates carry their reward; each reflection round is a span holding the stages it redid."""
    import dspy
    import mlflow

    from trace_dspy import ProgramConfig, TraceProgram
    from trace_dspy.core import spans
    from trace_dspy.store.tracking import prepare_tracing
    from trace_dspy.store.traces import tracing
    from trace_dspy.testing.fakes import fake_lm

    prepare_tracing(f"sqlite:///{tmp_path / 'mlflow.db'}", "spans")
    replies = iter(["Okay then.", "That is sad news.", "I am so sorry about your dog; how are you?"] * 3)
    lm, _ = fake_lm(response=lambda inputs: next(replies))
    program = TraceProgram(ProgramConfig(best_of=3, best_of_threshold=1.0, reflection=True, reflection_rounds=1))
    rewards = {"Okay then.": 0.2, "That is sad news.": 0.5, "I am so sorry about your dog; how are you?": 0.9}
    program.reward_fn = lambda inputs, pred: rewards[pred.response]
    with tracing(), dspy.context(lm=lm, callbacks=[spans.lm_span_callback()]):
        pred = program(dialogue="Speaker: My dog died yesterday.")
        trace_id = spans.last_trace_id()
    mlflow.flush_trace_async_logging()
    trace = mlflow.get_trace(trace_id)
    candidates = {s.name: s for s in trace.data.spans if s.name.startswith("candidate ")}
    assert [candidates[f"candidate {i}"].attributes["reward"] for i in (1, 2, 3)] == [0.2, 0.5, 0.9]
    assert pred.reply_rewards == [0.2, 0.5, 0.9]
    (round_1,) = [s for s in trace.data.spans if s.name == "reflection round 1"]
    assert round_1.outputs["round"] == 1 and "redo_from" in round_1.outputs
    # The audit's own LM call sits inside its round.
    assert any(s.name.startswith("lm ") for s in trace.data.spans if s.parent_id == round_1.span_id)


def test_an_untraced_evaluation_still_gives_every_row_a_trace_and_its_scores(tmp_path, monkeypatch, capsys):
    import mlflow

    import trace_dspy.lm.specs as lms_module
    from conftest import echo_reply
    from trace_dspy.cli.evaluate import main
    from trace_dspy.testing.fakes import fake_lm

    lm, _ = fake_lm(echo_reply)
    monkeypatch.setattr(lms_module, "build_lm", lambda spec: lm)
    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert main(["--no-trace", "--limit", "3", "--threads", "1", "--tracking-uri", uri, "--output-dir", "o"]) == 0
    summary = json.loads((tmp_path / "o/summary.json").read_text())
    mlflow.set_tracking_uri(uri)
    run = mlflow.get_run(summary["mlflow"]["run_id"])
    traces = mlflow.search_traces(locations=[run.info.experiment_id], run_id=run.info.run_id, return_type="list")
    assert len(traces) == 3 and {t.info.experiment_id for t in traces} == {run.info.experiment_id}
    for trace in traces:  # input and output only: the program ran without spans
        assert [s.name for s in trace.data.spans] == ["trace_dspy"]
        assert {a.name for a in trace.info.assessments} >= {"empathy", "relevance"}
    assert summary["mlflow"]["scorer_means"]["empathy"] == pytest.approx(summary["summary"]["empathy"])


def test_a_compile_without_traces_keeps_its_run_model_and_prompts(tmp_path, monkeypatch):
    import mlflow
    from mlflow import MlflowClient

    uri = compile_fast(tmp_path, monkeypatch, trace=False)
    mlflow.set_tracking_uri(uri)
    experiment = mlflow.get_experiment_by_name("trace-dspy")
    runs = mlflow.search_runs(experiment_ids=[experiment.experiment_id], output_format="list")
    assert [r.data.tags.get("trace_dspy.kind") for r in runs] == ["compile"]  # no evaluation runs
    assert mlflow.search_traces(locations=[experiment.experiment_id], return_type="list") == []
    manifest = json.loads((tmp_path / "artifacts/trace-dspy/v0001/manifest.json").read_text())
    assert runs[0].data.metrics["dev_after/empathy"] == pytest.approx(manifest["scores"]["dev_after"]["empathy"])
    assert manifest["config"]["run"]["trace"] is False
    assert MlflowClient(tracking_uri=uri).get_model_version_by_alias("trace-dspy", "champion").source.startswith("models:/")
    assert mlflow.genai.load_prompt("prompts:/trace-dspy.generate_response/1").tags["artifact_version"] == "trace-dspy@v1"
