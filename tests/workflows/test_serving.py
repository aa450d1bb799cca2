"""The compiled program as an MLflow pyfunc model: logged from code by compile, registered, loaded by MLflow's
own loader, served over HTTP, and never pickled."""

from __future__ import annotations

import json
import os
import urllib.request
from pathlib import Path

import pandas as pd
import pytest

from conftest import SECRET, compile_fast, echo_reply, mlflow_serve
from trace_dspy.core.labels import EMOTIONS
from trace_dspy.testing.fakes import ScriptedEngine
from trace_dspy.testing.server import FakeChatServer
from trace_dspy.workflows import serving
from trace_dspy.workflows.serving import OUTPUT_COLUMNS, lm_config_from_env, required_extras

REPO = Path(__file__).resolve().parents[2]
PICKLE_SUFFIXES = (".pkl", ".pickle", ".cloudpickle", ".joblib")


@pytest.fixture
def compiled(tmp_path, monkeypatch):
    return compile_fast(tmp_path, monkeypatch, trace=False)


def test_compile_registers_a_pyfunc_model_that_mlflow_loads_and_runs(compiled, tmp_path, monkeypatch):
    import mlflow
    from mlflow import MlflowClient

    mlflow.set_tracking_uri(compiled)
    client = MlflowClient(tracking_uri=compiled)
    mv = client.get_model_version_by_alias("trace-dspy", "champion")
    assert mv.source.startswith("models:/m-")  # the logged model, not a folder of files
    model = mlflow.pyfunc.load_model("models:/trace-dspy@champion")
    schema = model.metadata.get_input_schema()
    assert schema.input_names() == ["dialogue"]
    assert model.metadata.get_output_schema().input_names() == list(OUTPUT_COLUMNS)
    frame = pd.DataFrame({"dialogue": ["I lost my ring at the beach.", "", "Speaker: I got the job!\nListener: Wow!\n"
                                       "Speaker: I start on Monday."]})
    out = model.predict(frame)
    assert list(out.columns) == list(OUTPUT_COLUMNS) and len(out) == 3
    assert out.loc[0, "error"] == "" and "beach." in out.loc[0, "reply"] and out.loc[0, "emotion"] in EMOTIONS
    assert json.loads(out.loc[0, "stages"])["emotion"] == out.loc[0, "emotion"]
    assert out.loc[1, "error"].startswith("invalid dialogue") and out.loc[1, "reply"] == ""  # kept, in place
    assert out.loc[2, "error"] == "" and "Monday." in out.loc[2, "reply"]
    # trace_dspy.load reaches the same version through the registry.
    import trace_dspy

    program = trace_dspy.load("models:/trace-dspy@champion", tracking_uri=compiled)
    assert program(dialogue="I lost my ring at the beach.").response == out.loc[0, "reply"]


def test_the_logged_model_holds_code_and_json_and_no_pickle(compiled, tmp_path):
    import mlflow
    from mlflow import MlflowClient

    mv = MlflowClient(tracking_uri=compiled).get_model_version_by_alias("trace-dspy", "champion")
    local = Path(mlflow.artifacts.download_artifacts(artifact_uri=mv.source, dst_path=str(tmp_path / "dl"),
                                                     tracking_uri=compiled))
    files = sorted(str(p.relative_to(local)) for p in local.rglob("*") if p.is_file())
    assert "pyfunc_model.py" in files and "MLmodel" in files
    assert any(f.endswith("program.json") for f in files) and any(f.endswith("manifest.json") for f in files)
    assert not [f for f in files if f.endswith(PICKLE_SUFFIXES)], files
    for path in local.rglob("*"):  # no file starts with a pickle protocol header either
        if path.is_file():
            assert path.read_bytes()[:1] != b"\x80", path
    mlmodel = (local / "MLmodel").read_text()
    assert "model_code_path" in mlmodel and "python_model.pkl" not in mlmodel
    requirements = (local / "requirements.txt").read_text()
    assert "trace-dspy" in requirements and "mlflow==" in requirements
    # A key in the compile's environment never reaches the model: the LM is chosen where it is served.
    for path in local.rglob("*"):
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), path


def test_extras_follow_what_the_program_needs(tmp_path):
    folder = tmp_path / "a"
    folder.mkdir()
    manifest = json.loads((REPO / "artifacts/trace-dspy/v0003/manifest.json").read_text())
    manifest["config"]["lm"]["default"]["model"] = "local"
    manifest["config"]["program"].update(best_of=1, prior_k=0)

    def extras():
        (folder / "manifest.json").write_text(json.dumps(manifest))
        return required_extras(folder)

    assert extras() == ["local"]
    manifest["config"]["lm"]["default"]["model"] = "openai/gpt-4o-mini"
    manifest["config"]["program"]["best_of"] = "auto"  # the reply reward embeds with MiniLM
    assert extras() == ["embed"]
    manifest["config"]["program"]["best_of"] = 1
    (folder / "emotion_prior.npz").write_bytes(b"")
    assert extras() == ["embed"]
    manifest["config"]["lm"]["stages"] = {"generate_response": {"model": "local"}}
    assert extras() == ["embed", "local"]


def test_the_serving_environment_chooses_the_lm_and_never_stores_a_key():
    assert lm_config_from_env({}) is None  # the artifact's recorded (embedded) model
    config = lm_config_from_env({"TRACE_DSPY_LM": "openai/m", "TRACE_DSPY_API_BASE": "http://127.0.0.1:9/v1",
                                 "TRACE_DSPY_API_KEY_ENV": "MY_KEY", "TRACE_DSPY_TIMEOUT": "7"})
    spec = config.default
    assert (spec.model, spec.api_base, spec.api_key_env, spec.timeout) == ("openai/m", "http://127.0.0.1:9/v1",
                                                                            "MY_KEY", 7.0)
    with pytest.raises(serving.ServingConfigError, match="TRACE_DSPY_TIMEOUT"):
        lm_config_from_env({"TRACE_DSPY_LM": "openai/m", "TRACE_DSPY_TIMEOUT": "soon"})
    with pytest.raises(serving.ServingConfigError, match="NAME of an environment variable"):
        lm_config_from_env({"TRACE_DSPY_LM": "openai/m", "TRACE_DSPY_API_KEY_ENV": "sk-secret-value"})
    with pytest.raises(serving.ServingConfigError, match="TRACE_DSPY_LM is not set"):
        lm_config_from_env({"TRACE_DSPY_API_BASE": "http://127.0.0.1:9/v1"})
    assert lm_config_from_env({"TRACE_DSPY_LM": "openai/m", "TRACE_DSPY_LM_CACHE": "0"}).default.cache is False
    with pytest.raises(serving.ServingConfigError, match="must be 0 or 1"):
        lm_config_from_env({"TRACE_DSPY_LM": "openai/m", "TRACE_DSPY_LM_CACHE": "sometimes"})


def test_a_remote_lm_answers_rows_in_threads_and_keeps_each_in_its_place(compiled, monkeypatch):
    import mlflow

    mlflow.set_tracking_uri(compiled)
    monkeypatch.setenv("TRACE_DSPY_LM", "openai/fake")  # build_lm is the fake LM in these tests
    monkeypatch.setenv("TRACE_DSPY_THREADS", "4")
    model = mlflow.pyfunc.load_model("models:/trace-dspy@champion")
    assert model.unwrap_python_model().threads == 4
    messages = [f"I repainted the kitchen, room number {i}." if i != 5 else "" for i in range(12)]
    out = model.predict(pd.DataFrame({"dialogue": messages}))
    assert len(out) == 12
    for i, row in out.iterrows():
        if i == 5:
            assert row["error"].startswith("invalid dialogue") and row["reply"] == ""
        else:
            assert row["error"] == "" and f"number {i}." in row["reply"], row  # its own row's answer
    # The embedded engine decodes one call at a time: there the setting is ignored.
    monkeypatch.setenv("TRACE_DSPY_LM", "local")
    assert mlflow.pyfunc.load_model("models:/trace-dspy@champion").unwrap_python_model().threads == 1
    monkeypatch.setenv("TRACE_DSPY_THREADS", "many")
    with pytest.raises(serving.ServingConfigError, match="TRACE_DSPY_THREADS must be a whole number"):
        mlflow.pyfunc.load_model("models:/trace-dspy@champion")


def test_inputs_in_every_accepted_shape():
    assert serving.dialogues_from(pd.DataFrame({"dialogue": ["a", "b"]})) == ["a", "b"]
    assert serving.dialogues_from(["a", {"dialogue": "b"}]) == ["a", "b"]
    assert serving.dialogues_from({"dialogue": ["a"]}) == ["a"] and serving.dialogues_from("a") == ["a"]
    with pytest.raises(ValueError, match="'dialogue' column"):
        serving.dialogues_from(pd.DataFrame({"text": ["a"]}))


def _post(url: str, payload: dict, timeout: float = 60) -> dict:
    request = urllib.request.Request(url, data=json.dumps(payload).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


@pytest.mark.slow
def test_mlflow_models_serve_answers_invocations(compiled, tmp_path):
    with FakeChatServer(latency=0.0, engine=ScriptedEngine(responder=echo_reply)) as lm_server:
        env = {**os.environ, "MLFLOW_TRACKING_URI": compiled, "TRACE_DSPY_LM": "openai/fake",
               "TRACE_DSPY_API_BASE": lm_server.api_base, "TRACE_DSPY_API_KEY_ENV": "FAKE_SERVING_KEY",
               "FAKE_SERVING_KEY": "unused", "TRACE_DSPY_CACHE": str(tmp_path / "cache")}
        with mlflow_serve("models:/trace-dspy@champion", env, tmp_path) as base:
            body = _post(f"{base}/invocations", {"dataframe_records": [
                {"dialogue": "My dog died yesterday."}, {"dialogue": ""}, {"dialogue": "I got the job!!"}]})
        rows = body["predictions"]
        assert len(rows) == 3
        assert rows[0]["error"] == "" and "yesterday." in rows[0]["reply"]
        assert rows[1]["error"].startswith("invalid dialogue")
        assert rows[2]["error"] == "" and "job!!" in rows[2]["reply"]
        assert lm_server.requests >= 2 * 4  # every stage went to the LM the serving environment named
        assert set(lm_server.authorizations) == {"Bearer unused"}


@pytest.mark.slow
@pytest.mark.embedded
def test_the_shipped_artifact_runs_as_a_pyfunc_on_the_embedded_model(tmp_path, monkeypatch):
    """The real embedded model behind MLflow's loader: one everyday message, a sensible-looking row."""
    import mlflow

    for var in ("TRACE_DSPY_LM", "TRACE_DSPY_API_BASE", "TRACE_DSPY_API_KEY_ENV", "TRACE_DSPY_TIMEOUT",
                "TRACE_DSPY_LM_CACHE"):
        monkeypatch.delenv(var, raising=False)
    path = serving.save_program_model(REPO / "artifacts/trace-dspy/v0003", tmp_path / "model")
    model = mlflow.pyfunc.load_model(str(path))
    out = model.predict(pd.DataFrame({"dialogue": ["I failed my driving test again today."]}))
    row = out.iloc[0]
    assert row["error"] == "", row["error"]
    assert row["emotion"] in EMOTIONS and row["strategy"]
    assert 3 <= len(row["reply"].split()) <= 80
    assert row["reply"].strip().lower() != "i failed my driving test again today."
