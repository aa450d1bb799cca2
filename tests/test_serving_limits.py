"""Limits at the edges of the MLflow side: a served model under load, a logged model whose files were edited,
and a tracking store that another process keeps locked.

Timing bounds here are the ones the behaviour is about (a busy model answers within its wait, a request
stops at its limit); each is checked against a margin several times the value it bounds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

from conftest import FAST_CONFIG, SECRET, echo_reply, offline_workdir
from trace_dspy.testing.fakes import FaultyEngine, ScriptedEngine, fake_lm

REPO = Path(__file__).resolve().parents[1]
ARTIFACT = REPO / "artifacts/trace-dspy/v0001"
SERVING_ENV = ("TRACE_DSPY_LM", "TRACE_DSPY_API_BASE", "TRACE_DSPY_API_KEY_ENV", "TRACE_DSPY_TIMEOUT",
               "TRACE_DSPY_LM_CACHE", "TRACE_DSPY_THREADS", "TRACE_DSPY_REQUEST_TIMEOUT", "TRACE_DSPY_BUSY_WAIT",
               "MLFLOW_SCORING_SERVER_REQUEST_TIMEOUT", "_MLFLOW_IS_IN_SERVING_ENVIRONMENT")


# ---------------------------------------------------------------- serving: backpressure and request limits

class TimedEngine(FaultyEngine):
    """A slow fake engine that records when each call started."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.started: list[float] = []

    def complete(self, request):
        self.started.append(time.monotonic())
        return super().complete(request)


def _slow_model(monkeypatch, *, latency: float, threads: int = 1, **env: str):
    """TraceModel loaded as MLflow loads it (load_context), every LM a slow fake that records its calls."""
    import dspy

    import trace_dspy.lm.specs as lms_module
    from trace_dspy.workflows.serving import TraceModel

    engine = TimedEngine(inner=ScriptedEngine(responder=echo_reply), latency=latency)
    lm = dspy.LM("openai/fake", engine=engine, cache=False, num_retries=0)
    monkeypatch.setattr(lms_module, "build_lm", lambda spec: lm)
    for var in SERVING_ENV:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("TRACE_DSPY_LM", "openai/fake")
    monkeypatch.setenv("TRACE_DSPY_THREADS", str(threads))
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    model = TraceModel()
    model.load_context(SimpleNamespace(artifacts={"program": str(ARTIFACT)}))
    return model, engine


def _frame(n: int) -> pd.DataFrame:
    return pd.DataFrame({"dialogue": [f"I finally painted the fence, take {i}." for i in range(n)]})


def _in_thread(fn):
    box: dict = {}

    def run():
        box["start"] = time.monotonic()
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            box["error"] = exc
        box["end"] = time.monotonic()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, box


@pytest.mark.parametrize("how", ["mlflow-server-limit", "own-limit"])
def test_a_second_request_is_answered_or_refused_while_a_slow_one_runs(monkeypatch, how):
    from mlflow.exceptions import MlflowException

    # The limit comes from MLflow's scoring server (its variable, inside its serving environment) or from ours.
    env = ({"_MLFLOW_IS_IN_SERVING_ENVIRONMENT": "true", "MLFLOW_SCORING_SERVER_REQUEST_TIMEOUT": "2"}
           if how == "mlflow-server-limit" else {"TRACE_DSPY_REQUEST_TIMEOUT": "2"})
    model, engine = _slow_model(monkeypatch, latency=0.25, TRACE_DSPY_BUSY_WAIT="0.5", **env)
    assert (model.timeout, model.busy_wait) == (2.0, 0.5)
    # 12 dialogues of four or more calls each: at least 12 s of LM work, far past the 2 s limit.
    slow, first = _in_thread(lambda: model.predict(None, _frame(12)))
    while not engine.started and slow.is_alive():
        time.sleep(0.01)
    small, second = _in_thread(lambda: model.predict(None, _frame(1)))
    small.join(30)
    slow.join(60)
    assert not slow.is_alive() and not small.is_alive()
    # The second request gets the clear "busy" error (HTTP 503) after its 0.5 s wait, not after the slow one.
    error = second.get("error")
    assert isinstance(error, MlflowException), second
    assert error.get_http_status_code() == 503 and "busy" in error.message and "retry later" in error.message
    assert second["end"] - second["start"] < 10  # bounded by the 0.5 s wait (wide margin for a loaded machine)
    # The slow request stops at its limit (HTTP 504) and makes no LM call after it.
    error = first.get("error")
    assert isinstance(error, MlflowException), first
    assert error.get_http_status_code() == 504 and "limit" in error.message
    deadline = first["start"] + 2.0
    assert all(t <= deadline + 0.05 for t in engine.started), [t - first["start"] for t in engine.started]
    assert len(engine.started) < 12 * 4
    calls = len(engine.started)
    time.sleep(0.5)
    assert len(engine.started) == calls  # nothing left running in the background
    # The model is free again: a small request is answered.
    out = model.predict(None, _frame(1))
    assert out.loc[0, "error"] == "" and "take 0." in out.loc[0, "reply"]


def _post(url: str, payload: dict, timeout: float = 120) -> tuple[int, str]:
    import urllib.error
    import urllib.request

    request = urllib.request.Request(url, data=json.dumps(payload).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@pytest.mark.slow
def test_mlflow_models_serve_answers_503_while_busy_and_stops_a_timed_out_request(tmp_path, monkeypatch):
    from conftest import compile_fast, mlflow_serve
    from trace_dspy.testing.server import FakeChatServer

    tracking = compile_fast(tmp_path, monkeypatch, trace=False)
    with FakeChatServer(latency=0.4, engine=ScriptedEngine(responder=echo_reply)) as lm_server:
        env = {**{k: v for k, v in os.environ.items() if k not in SERVING_ENV},
               "MLFLOW_TRACKING_URI": tracking, "TRACE_DSPY_LM": "openai/fake",
               "TRACE_DSPY_API_BASE": lm_server.api_base, "TRACE_DSPY_API_KEY_ENV": "FAKE_SERVING_KEY",
               "FAKE_SERVING_KEY": "unused", "TRACE_DSPY_BUSY_WAIT": "0.5",
               "MLFLOW_SCORING_SERVER_REQUEST_TIMEOUT": "4"}
        with mlflow_serve("models:/trace-dspy@champion", env, tmp_path) as base:
            url = f"{base}/invocations"
            # 10 dialogues of four or more 0.4 s calls: 16 s of LM work against a 4 s limit.
            records = [{"dialogue": f"I finally painted the fence, take {i}."} for i in range(10)]
            slow, first = _in_thread(lambda: _post(url, {"dataframe_records": records}))
            while lm_server.requests == 0 and slow.is_alive():
                time.sleep(0.05)
            small, second = _in_thread(lambda: _post(url, {"dataframe_records": [{"dialogue": "I got the job!"}]}))
            small.join(60)
            slow.join(120)
            status, body = second["value"]
            assert status == 503, (status, body)
            assert "busy" in json.loads(body)["message"] and "retry later" in json.loads(body)["message"]
            assert second["end"] - second["start"] < 15  # the 0.5 s wait, far from MLflow's 4 s limit
            assert first["value"][0] == 504, first
            # The timed-out request gives up its LM calls: the count stops growing shortly after its 504.
            time.sleep(2)
            calls = lm_server.requests
            time.sleep(3)
            assert lm_server.requests == calls
            assert calls < 10 * 4
            # The model is free again once the stopped request has let go of it (at once on an idle machine;
            # a loaded one may take a few seconds to unwind that request's thread).
            deadline = time.monotonic() + 30
            while True:
                status, body = _post(url, {"dataframe_records": [{"dialogue": "My dog died yesterday."}]})
                if status != 503 or time.monotonic() > deadline:
                    break
                time.sleep(1)
            assert status == 200 and "yesterday." in json.loads(body)["predictions"][0]["reply"], body


def test_threaded_rows_also_stop_calling_the_lm_at_the_limit(monkeypatch):
    from mlflow.exceptions import MlflowException

    model, engine = _slow_model(monkeypatch, latency=0.25, threads=3, TRACE_DSPY_REQUEST_TIMEOUT="1.5")
    started = time.monotonic()
    with pytest.raises(MlflowException, match="limit") as caught:
        model.predict(None, _frame(12))
    assert caught.value.get_http_status_code() == 504
    assert all(t <= started + 1.5 + 0.05 for t in engine.started)
    assert len(engine.started) < 12 * 4


def test_limits_come_from_the_environment_and_bad_values_are_refused():
    from trace_dspy.workflows.serving import ServingConfigError, limits_from_env

    assert limits_from_env({}) == (None, None)  # a notebook or a Spark batch: no limit, wait for the model
    assert limits_from_env({"_MLFLOW_IS_IN_SERVING_ENVIRONMENT": "true"}) == (60.0, 5.0)  # MLflow's 60 s
    assert limits_from_env({"_MLFLOW_IS_IN_SERVING_ENVIRONMENT": "true",
                            "MLFLOW_SCORING_SERVER_REQUEST_TIMEOUT": "3"}) == (3.0, 3.0)
    assert limits_from_env({"TRACE_DSPY_REQUEST_TIMEOUT": "30", "TRACE_DSPY_BUSY_WAIT": "1"}) == (30.0, 1.0)
    for bad in ("soon", "0", "-1", "nan", "1e9"):
        with pytest.raises(ServingConfigError, match="TRACE_DSPY_REQUEST_TIMEOUT must be"):
            limits_from_env({"TRACE_DSPY_REQUEST_TIMEOUT": bad})
        with pytest.raises(ServingConfigError, match="TRACE_DSPY_BUSY_WAIT must be"):
            limits_from_env({"TRACE_DSPY_REQUEST_TIMEOUT": "5", "TRACE_DSPY_BUSY_WAIT": bad})


# ---------------------------------------------------------------- a logged model whose files were edited

MARKER_CODE = "\nimport pathlib\npathlib.Path({marker!r}).write_text('the edited model code ran')\n"


@pytest.fixture
def registered(tmp_path, monkeypatch):
    from conftest import compile_fast

    return compile_fast(tmp_path, monkeypatch, trace=False)


def _stored_model_dir(tmp_path: Path) -> Path:
    """The logged model's folder in the run's artifact store (mlruns beside mlflow.db)."""
    found = [p.parent for p in (tmp_path / "mlruns").rglob("pyfunc_model.py")]
    assert len(found) == 1, found
    return found[0]


def _edits(marker: Path):
    """Ways to change a logged model in the store: (what the refusal names, how to make the change)."""
    return [
        ("pyfunc_model.py", lambda d: d.joinpath("pyfunc_model.py").write_text(
            d.joinpath("pyfunc_model.py").read_text() + MARKER_CODE.format(marker=str(marker)))),
        ("MLmodel", lambda d: d.joinpath("MLmodel").write_text(d.joinpath("MLmodel").read_text()
                                                              + "code: evil\n")),
        ("artifacts/v0001/program.json", lambda d: d.joinpath("artifacts/v0001/program.json").write_text(
            d.joinpath("artifacts/v0001/program.json").read_text() + " ")),
        ("code/sitecustomize.py", lambda d: (d / "code").mkdir() or d.joinpath("code/sitecustomize.py").write_text(
            MARKER_CODE.format(marker=str(marker)))),
        ("artifacts/v0001/dev_after.jsonl", lambda d: d.joinpath("artifacts/v0001/dev_after.jsonl").unlink()),
    ]


def test_a_model_edited_in_the_store_is_refused_by_every_project_loader(registered, tmp_path, monkeypatch):
    import shutil

    import trace_dspy
    from trace_dspy.store.errors import ArtifactError
    from trace_dspy.store.registry import DIGEST_TAG
    from trace_dspy.workflows.serving import export_model
    from trace_dspy.workflows.spark import model_uri_for

    from mlflow import MlflowClient

    mv = MlflowClient(tracking_uri=registered).get_model_version_by_alias("trace-dspy", "champion")
    recorded = json.loads(mv.tags[DIGEST_TAG])
    assert {"pyfunc_model.py", "MLmodel", "artifacts/v0001/program.json",
            "artifacts/v0001/manifest.json"} <= set(recorded)
    trace_dspy.load("models:/trace-dspy@champion", tracking_uri=registered)  # untouched: it loads
    stored = _stored_model_dir(tmp_path)
    pristine = tmp_path / "pristine"
    shutil.copytree(stored, pristine)
    marker = tmp_path / "MARKER"
    refs = ["champion", "models:/trace-dspy@champion", "models:/trace-dspy/1", mv.source]
    for named, edit in _edits(marker):
        edit(stored)
        for ref in refs:
            with pytest.raises(ArtifactError, match=named.replace(".", r"\.") + ".*refusing to load it"):
                trace_dspy.load(ref, tracking_uri=registered)
        for n, ref in enumerate(refs):
            with pytest.raises(ArtifactError, match=named.replace(".", r"\.")):
                model_uri_for(ref, workdir=tmp_path / f"work-{named}-{n}")
            with pytest.raises(ArtifactError, match=named.replace(".", r"\.")):
                export_model(ref, tmp_path / f"export-{named}-{n}", tracking_uri=registered)
        assert not marker.exists()
        shutil.rmtree(stored)
        shutil.copytree(pristine, stored)


def test_respond_on_spark_refuses_an_edited_model_and_runs_none_of_its_code(registered, tmp_path, monkeypatch,
                                                                            capsys):
    from trace_dspy.cli.respond import main

    marker = tmp_path / "MARKER"
    stored = _stored_model_dir(tmp_path)
    _edits(marker)[0][1](stored)
    (tmp_path / "in.jsonl").write_text(json.dumps({"id": "a", "turns": ["I lost my ring at the beach."]}) + "\n")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", registered)
    code = main(["--engine", "spark", "--program", "champion", "--input", "in.jsonl", "--output", "out.jsonl",
                 "--lm", "openai/fake"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert not marker.exists() and not (tmp_path / "out.jsonl").exists()
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "pyfunc_model.py" in lines[0] and "refusing to load it" in lines[0], err
    assert "Traceback" not in err


def test_the_project_serves_registered_models_with_the_installed_code(registered, tmp_path, monkeypatch):
    """Even a model with no recorded digests (logged before they were recorded), taken unchecked on request,
    runs this installation's code file on the project's paths: only its artifact folder is taken from the store."""
    import mlflow
    from mlflow import MlflowClient

    from trace_dspy.store.registry import DIGEST_TAG
    from trace_dspy.workflows.serving import CODE_FILE
    from trace_dspy.workflows.spark import model_uri_for

    client = MlflowClient(tracking_uri=registered)
    mv = client.get_model_version_by_alias("trace-dspy", "champion")
    client.delete_model_version_tag("trace-dspy", mv.version, DIGEST_TAG)
    client.delete_logged_model_tag(mv.source[len("models:/"):], DIGEST_TAG)
    marker = tmp_path / "MARKER"
    _edits(marker)[0][1](_stored_model_dir(tmp_path))
    local = Path(model_uri_for("champion", workdir=tmp_path / "work", allow_unverified=True))
    assert local.is_dir() and (local / "pyfunc_model.py").read_bytes() == CODE_FILE.read_bytes()
    monkeypatch.setenv("TRACE_DSPY_LM", "openai/fake")
    out = mlflow.pyfunc.load_model(str(local)).predict(pd.DataFrame({"dialogue": ["I lost my ring at the beach."]}))
    assert out.loc[0, "error"] == "" and "beach." in out.loc[0, "reply"]
    assert not marker.exists()


# ---------------------------------------------------------------- a tracking store locked by another process

@contextmanager
def _locked(db: Path):
    """Another process holds sqlite's exclusive lock on ``db`` until the block ends."""
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sqlite3, sys\n"
         f"con = sqlite3.connect({str(db)!r}, isolation_level=None)\n"
         "con.execute('BEGIN EXCLUSIVE')\nprint('held', flush=True)\nsys.stdin.read()\n"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        yield holder
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)


def _compile(tmp_path: Path, monkeypatch) -> tuple[int, str]:
    from trace_dspy.cli.compile import main

    lm, _ = fake_lm(echo_reply)
    offline_workdir(tmp_path, monkeypatch, lm)
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    (tmp_path / "fast.toml").write_text(FAST_CONFIG)
    return main(["--optimizer", "labeled", "--max-labeled", "1", "--train", "4", "--dev", "3", "--threads", "1",
                 "--config", "fast.toml", "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}", "--no-trace"])


def _store(tmp_path: Path) -> Path:
    from trace_dspy.store.tracking import init_store

    init_store(f"sqlite:///{tmp_path / 'mlflow.db'}")
    return tmp_path / "mlflow.db"


def _one_error_line(err: str) -> str:
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, err
    return lines[0]


def test_compile_against_a_locked_store_stops_with_one_line_before_any_work(tmp_path, monkeypatch, capsys):
    db = _store(tmp_path)
    monkeypatch.setenv("TRACE_DSPY_STORE_WAIT", "1")
    with _locked(db):
        started = time.monotonic()
        code = _compile(tmp_path, monkeypatch)
        seconds = time.monotonic() - started
    line = _one_error_line(capsys.readouterr().err)
    assert code == 2
    assert f"the MLflow store {db} is locked by another process" in line
    assert "--no-mlflow" in line and "TRACE_DSPY_STORE_WAIT" in line
    assert seconds < 15  # the 1 s wait, not MLflow's 20 s per statement (wide margin)
    assert not (tmp_path / "artifacts/trace-dspy/v0001").exists()  # it stopped before the work, as it said


def test_a_store_locked_after_the_artifact_was_saved_keeps_the_version_and_says_so(tmp_path, monkeypatch, capsys):
    import trace_dspy
    import trace_dspy.store.artifacts as artifacts_module

    db = _store(tmp_path)
    monkeypatch.setenv("TRACE_DSPY_STORE_WAIT", "1")
    write_artifact = artifacts_module.write_artifact
    holders = []

    def write_then_lock(*args, **kwargs):
        written = write_artifact(*args, **kwargs)
        holders.append(_locked(db))
        holders[-1].__enter__()  # another process takes the store while this compile logs
        return written

    monkeypatch.setattr(artifacts_module, "write_artifact", write_then_lock)
    try:
        started = time.monotonic()
        code = _compile(tmp_path, monkeypatch)
        seconds = time.monotonic() - started
    finally:
        for holder in holders:
            holder.__exit__(None, None, None)
    line = _one_error_line(capsys.readouterr().err)
    assert code == 2
    assert f"the MLflow store {db} is locked by another process" in line
    assert "the artifact trace-dspy@v1 is saved" in line and "only its MLflow logging failed" in line
    assert "stays marked RUNNING" in line
    assert seconds < 60  # no statement waited out MLflow's 20 s busy timeout twice (wide margin)
    # Nothing computed is lost: the version is complete and loads.
    monkeypatch.setattr(artifacts_module, "write_artifact", write_artifact)
    program = trace_dspy.load("trace-dspy@v1")
    assert program is not None


@pytest.mark.parametrize("value", ["soon", "-1", "nan"])
def test_a_bad_store_wait_is_one_line(tmp_path, monkeypatch, capsys, value):
    _store(tmp_path)
    monkeypatch.setenv("TRACE_DSPY_STORE_WAIT", value)
    assert _compile(tmp_path, monkeypatch) == 2
    assert "TRACE_DSPY_STORE_WAIT must be" in _one_error_line(capsys.readouterr().err)


def test_a_lock_error_inside_a_run_becomes_one_line_without_waiting_to_end_the_run(tmp_path):
    """An MLflow call inside the run that met the lock (MLflow's own 20 s wait already spent) ends the
    run with StoreLocked, and no further store write (ending the run) waits on the lock again."""
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    from trace_dspy.store.tracking import StoreLocked, mlflow_run, wait_for_store

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    with pytest.raises(StoreLocked) as caught:
        with mlflow_run(tracking_uri=uri, experiment="e", run_name="r") as run:
            wait_for_store(uri, saved="the results are saved in out/")
            raise MlflowException("(sqlite3.OperationalError) database is locked\n[SQL: INSERT INTO tags ...]")
    message = str(caught.value)
    assert "\n" not in message and "is locked by another process" in message
    assert "the results are saved in out/; only its MLflow logging failed" in message
    assert f"the MLflow run {run.info.run_id} stays marked RUNNING" in message
    assert MlflowClient(tracking_uri=uri).get_run(run.info.run_id).info.status == "RUNNING"
    import mlflow

    assert mlflow.active_run() is None
    # Any other failure still ends its run as FAILED.
    with pytest.raises(RuntimeError):
        with mlflow_run(tracking_uri=uri, experiment="e", run_name="r2") as run:
            raise RuntimeError("boom")
    assert MlflowClient(tracking_uri=uri).get_run(run.info.run_id).info.status == "FAILED"
