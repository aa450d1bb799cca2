"""The MLflow UI, in a real browser, shows two programs' evaluations side by side: the Evaluation runs
page with both runs, their dataset and scorer means; the two runs compared dialogue by dialogue; one
run's traces, one per dialogue; a trace's stage spans; and the compiled stage prompts on the Prompts page.

Marked ``browser`` (see tests/test_mlflow_ui.py for how Chromium renders the React pages). The
screenshots go to the test's temp dir; with ``TRACE_DSPY_SCREENSHOTS=<folder>`` they are also copied
there (that is how docs/mlflow-evaluation-runs.png, docs/mlflow-evaluation-compare.png and
docs/mlflow-trace.png are made).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from conftest import compile_fast
from test_mlflow_ui import UIServer, chromium, png_size, render  # noqa: F401 - chromium is a fixture

pytestmark = pytest.mark.browser

START_DIR = Path.cwd()  # TRACE_DSPY_SCREENSHOTS is relative to where pytest started (the tests chdir)
STAGE_SPANS = ("emotion prior", "emotion", "cause", "retrieval", "strategy", "response")


@pytest.fixture
def two_evaluations(tmp_path, monkeypatch):
    from trace_dspy.cli.evaluate import main

    uri = compile_fast(tmp_path, monkeypatch)
    assert main(["--program", "default", "--program", "trace-dspy@v1", "--limit", "4", "--threads", "2",
                 "--tracking-uri", uri, "--output-dir", "cmp"]) == 0
    import mlflow

    mlflow.set_tracking_uri(uri)
    experiment = mlflow.get_experiment_by_name("trace-dspy")
    summaries = {ref: json.loads((tmp_path / "cmp" / folder / "summary.json").read_text())
                 for ref, folder in (("default", "default"), ("trace-dspy@v1", "trace-dspy-v1"))}
    return uri, experiment.experiment_id, summaries


def _keep(shot: Path, name: str) -> None:
    folder = os.environ.get("TRACE_DSPY_SCREENSHOTS")
    if folder:
        target = START_DIR / folder
        target.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, target / name)


def test_the_ui_compares_two_evaluation_runs_down_to_the_stage_spans(chromium, two_evaluations, tmp_path):  # noqa: F811
    uri, experiment_id, summaries = two_evaluations
    runs = {ref: s["mlflow"]["run_id"] for ref, s in summaries.items()}
    server = UIServer(uri, tmp_path / "mlflow-ui.log")
    try:
        server.wait_ready()
        base = f"{server.url}/#/experiments/{experiment_id}"
        # 1. The Evaluation runs page: both runs, their dataset, and the scorer means.
        shot = tmp_path / "evaluation-runs.png"
        text = render(chromium, f"{base}/evaluation-runs", shot, tmp_path,
                      ["evaluate default", "evaluate trace-dspy@v1", "seed-test-trace-seed0-n4", "empathy/mean"])
        for summary in summaries.values():
            assert f"{summary['summary']['empathy']:.4f}"[:5] in text  # the composite mean is on the page
        _keep(shot, "mlflow-evaluation-runs.png")
        # 2. One run's traces: one per dialogue, with the assessments as columns.
        rows = [json.loads(line) for line in (tmp_path / "cmp/trace-dspy-v1/examples.jsonl").read_text().splitlines()]
        shot = tmp_path / "evaluation-traces.png"
        text = render(chromium, f"{base}/evaluation-runs/{runs['trace-dspy@v1']}/traces", shot, tmp_path,
                      [r["trace_id"] for r in rows] + ["empathy", "empathy_learned", "emotion_correct"])
        assert "4 of 4" in text
        # 3. A trace: the stage spans by name, with the reply.
        shot = tmp_path / "trace.png"
        text = render(chromium, f"{base}/evaluation-runs/{runs['trace-dspy@v1']}/traces"
                                f"?selectedEvaluationId={rows[0]['trace_id']}", shot, tmp_path,
                      [*STAGE_SPANS, "lm fake/scripted", rows[0]["prediction"]["response"]])
        _keep(shot, "mlflow-trace.png")
        # 4. The two runs compared example by example: the same dialogue, both programs' replies side by side.
        other = [json.loads(line) for line in (tmp_path / "cmp/default/examples.jsonl").read_text().splitlines()]
        shot = tmp_path / "evaluation-compare.png"
        text = render(chromium, f"{base}/evaluation-runs?selectedRunUuid={runs['default']}"
                                f"&compareToRunUuid={runs['trace-dspy@v1']}", shot, tmp_path,
                      ["Comparing", "evaluate default", "evaluate trace-dspy@v1", "4 of 4",
                       *(r["trace_id"] for r in rows + other)], size=(2400, 1300))
        # Each dialogue is one row holding both programs' traces: no other trace ID falls between the pair.
        where = {r["trace_id"]: text.index(r["trace_id"]) for r in rows + other}
        theirs_by_id = {r["id"]: r for r in other}
        for mine in rows:
            theirs = theirs_by_id[mine["id"]]
            low, high = sorted((where[mine["trace_id"]], where[theirs["trace_id"]]))
            assert not [t for t, at in where.items() if low < at < high]
        assert text.count(json.dumps(other[0]["prediction"]["response"])[1:-1]) >= 2  # both replies
        _keep(shot, "mlflow-evaluation-compare.png")
        # 5. The Prompts page: each compiled stage instruction, tagged with its artifact version.
        shot = tmp_path / "prompts.png"
        render(chromium, f"{server.url}/#/prompts", shot, tmp_path,
               [f"trace-dspy.{stage}" for stage in ("recognize_emotion", "analyze_cause", "plan_strategy",
                                                    "generate_response")] + ["trace-dspy@v1"])
        assert png_size(shot) == (1400, 1800)
    finally:
        server.stop()
