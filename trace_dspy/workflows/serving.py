"""A compiled program as an MLflow pyfunc model, logged from code: MLflow's own tools can load, serve and
batch it, and nothing is pickled.

MLflow's "models from code" keeps the model as source: the file
``trace_dspy/workflows/pyfunc_model.py`` builds a :class:`TraceModel` when
MLflow runs it, and the artifact folder (``manifest.json``, ``program.json``,
the emotion prior, the exemplar index) travels as the model artifact
``program``. ``load_context`` reads that folder with the same loader as
``trace_dspy.load``, so every check of the artifact trust boundary applies.

    mlflow.pyfunc.load_model("models:/trace-dspy@champion").predict(pd.DataFrame({"dialogue": [...]}))
    mlflow models serve -m models:/trace-dspy@champion --env-manager local
    mlflow.pyfunc.spark_udf(spark, "models:/trace-dspy@champion", result_type=SPARK_RESULT_TYPE)

These MLflow loaders run the code file logged with the model, so they should
only read a store you trust. :func:`export_model` writes a model folder that
runs the installed code instead, after checking the registered model's files
against the digests recorded when it was logged; ``respond --engine spark``
goes that way.

The LM comes from the serving environment, never from the model:
``TRACE_DSPY_LM`` (a model name, ``local`` for the embedded model),
``TRACE_DSPY_API_BASE``, ``TRACE_DSPY_API_KEY_ENV`` (the name of the
variable that holds the key), ``TRACE_DSPY_TIMEOUT`` and ``TRACE_DSPY_LM_CACHE``
(``0`` turns DSPy's answer cache off). ``TRACE_DSPY_THREADS`` sets how many rows one
loaded model answers at once (default 1; a remote LM only, since the embedded engine decodes one call
at a time). With none of the LM variables
set, the model runs the LM its artifact records, which must be the embedded
model unless ``TRACE_DSPY_TRUST_ARTIFACT_LM=1`` (the same rule as
``--trust-artifact-lm``).

Under ``mlflow models serve`` each request has MLflow's time limit
(``MLFLOW_SCORING_SERVER_REQUEST_TIMEOUT``, 60 s by default; MLflow answers
504 when it passes). A model answers one request at a time: a request that
finds it busy waits ``TRACE_DSPY_BUSY_WAIT`` seconds (default 5) and is then
refused with HTTP 503 ("busy, retry later"), and a request that runs past its
limit makes no further LM call and gives the model back. Outside the scoring
server there is no limit unless ``TRACE_DSPY_REQUEST_TIMEOUT`` sets one.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import math
import os
import threading
import time
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any

import mlflow.pyfunc
import pandas as pd  # mlflow's own dependency

from trace_dspy.core import env as env_vars
from trace_dspy.store.evaluations import MODEL_NAME

CODE_FILE = Path(__file__).with_name("pyfunc_model.py")
ARTIFACT_KEY = "program"
INPUT_COLUMN = "dialogue"
# One row out per row in, in the same order. ``stages`` holds every stage output as a JSON object;
# ``error`` is empty on success and says what went wrong for that row otherwise (the other columns are
# then empty), so one bad dialogue never loses a batch or a partition.
OUTPUT_COLUMNS = ("emotion", "emotion_group", "cause_summary", "strategy", "reply", "stages", "error")
ENV_LM, ENV_API_BASE, ENV_KEY_ENV = env_vars.LM, env_vars.API_BASE, env_vars.API_KEY_ENV
ENV_TIMEOUT, ENV_TRUST = env_vars.TIMEOUT, env_vars.TRUST_ARTIFACT_LM
ENV_CACHE, ENV_THREADS = env_vars.LM_CACHE, env_vars.THREADS
ENV_REQUEST_TIMEOUT, ENV_BUSY_WAIT = env_vars.REQUEST_TIMEOUT, env_vars.BUSY_WAIT
# MLflow's scoring server: its per-request limit (seconds, default 60; a 504 after it), and the variable it
# sets in the serving process.
MLFLOW_REQUEST_TIMEOUT, MLFLOW_DEFAULT_REQUEST_TIMEOUT = "MLFLOW_SCORING_SERVER_REQUEST_TIMEOUT", 60.0
MLFLOW_SERVING = "_MLFLOW_IS_IN_SERVING_ENVIRONMENT"
DEFAULT_BUSY_WAIT = 5.0


class ServingConfigError(ValueError):
    """The serving environment names an LM setting that cannot be used."""


def lm_config_from_env(environ: dict[str, str] | None = None):
    """The LMConfig the serving environment chooses, or None to keep the artifact's recorded LM."""
    from trace_dspy.lm.specs import LMConfig

    env = os.environ if environ is None else environ
    model, api_base, key_env = env.get(ENV_LM), env.get(ENV_API_BASE), env.get(ENV_KEY_ENV)
    timeout, cache = env.get(ENV_TIMEOUT), env.get(ENV_CACHE)
    if not (model or api_base or key_env or timeout or cache):
        return None
    if not model:
        raise ServingConfigError(f"{ENV_LM} is not set: the other LM variables ({ENV_API_BASE}, {ENV_KEY_ENV}, "
                                 f"{ENV_TIMEOUT}, {ENV_CACHE}) describe the model it names")
    try:
        config = LMConfig().with_overrides(lm=model, api_base=api_base, api_key_env=key_env)
        if timeout:
            config = config.with_timeout(float(timeout))
        if cache:
            if cache.strip().lower() not in ("0", "1", "true", "false", "yes", "no"):
                raise ValueError(f"{ENV_CACHE} must be 0 or 1, not {cache!r}")
            config = replace(config, default=replace(config.default,
                                                     cache=cache.strip().lower() in ("1", "true", "yes")))
    except ValueError as exc:  # a ConfigError, or a timeout that is not a number
        raise ServingConfigError(f"the serving environment's LM settings ({ENV_LM}, {ENV_API_BASE}, "
                                 f"{ENV_KEY_ENV}, {ENV_TIMEOUT}, {ENV_CACHE}): {exc}") from None
    return config


def _trusted(environ: dict[str, str] | None = None) -> bool:
    env = os.environ if environ is None else environ
    return env.get(ENV_TRUST, "").strip().lower() in ("1", "true", "yes")


def dialogues_from(model_input: Any) -> list[Any]:
    """The dialogues of a pyfunc input: a DataFrame with a ``dialogue`` column, a list, a dict or one string."""
    if isinstance(model_input, pd.DataFrame):
        if INPUT_COLUMN not in model_input.columns:
            raise ValueError(f"the input needs a {INPUT_COLUMN!r} column; it has {', '.join(map(str, model_input.columns))}")
        return list(model_input[INPUT_COLUMN])
    if isinstance(model_input, pd.Series):
        return list(model_input)
    if isinstance(model_input, str):
        return [model_input]
    if isinstance(model_input, dict):
        value = model_input.get(INPUT_COLUMN)
        if value is None:
            raise ValueError(f"the input needs a {INPUT_COLUMN!r} key")
        return list(value) if isinstance(value, (list, tuple)) else [value]
    if isinstance(model_input, (list, tuple)):
        return [row.get(INPUT_COLUMN) if isinstance(row, dict) else row for row in model_input]
    raise ValueError(f"cannot read dialogues from a {type(model_input).__name__}")


def threads_from_env(environ: dict[str, str] | None = None) -> int:
    """``TRACE_DSPY_THREADS``: rows one loaded model answers at once (default 1)."""
    env = os.environ if environ is None else environ
    raw = env.get(ENV_THREADS, "").strip()
    if not raw:
        return 1
    try:
        threads = int(raw)
    except ValueError:
        threads = 0
    if threads < 1:
        raise ServingConfigError(f"{ENV_THREADS} must be a whole number of at least 1, not {raw!r}")
    return threads


def _seconds(env, name: str, default: float | None) -> float | None:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not 0 < value <= 86_400:
        raise ServingConfigError(f"{name} must be a number of seconds above 0 (at most a day), not {raw!r}")
    return value


def limits_from_env(environ: dict[str, str] | None = None) -> tuple[float | None, float | None]:
    """(seconds one predict call may run, seconds it waits for a model busy with another call).

    ``TRACE_DSPY_REQUEST_TIMEOUT`` sets the first; inside MLflow's scoring server it defaults to
    MLflow's own request limit (``MLFLOW_SCORING_SERVER_REQUEST_TIMEOUT``, 60 s), elsewhere to none.
    ``TRACE_DSPY_BUSY_WAIT`` sets the second, default 5 s when there is a limit (never longer than
    it), and no bound when there is none."""
    env = os.environ if environ is None else environ
    serving = env.get(MLFLOW_SERVING, "").strip().lower() in ("1", "true")
    mlflow_limit = _seconds(env, MLFLOW_REQUEST_TIMEOUT, MLFLOW_DEFAULT_REQUEST_TIMEOUT) if serving else None
    timeout = _seconds(env, ENV_REQUEST_TIMEOUT, mlflow_limit)
    busy = _seconds(env, ENV_BUSY_WAIT, DEFAULT_BUSY_WAIT if timeout is not None else None)
    if timeout is not None and busy is not None:
        busy = min(busy, timeout)
    return timeout, busy


def _serving_error(message: str, code: str):
    """An MlflowException whose error code the scoring server turns into the HTTP status (503, 504)."""
    from mlflow.exceptions import MlflowException
    from mlflow.protos import databricks_pb2

    return MlflowException(message, error_code=getattr(databricks_pb2, code))


def model_busy(waited: float):
    """HTTP 503 under ``mlflow models serve``."""
    return _serving_error(f"the model is busy answering another request (waited {waited:g} s, "
                          f"{ENV_BUSY_WAIT}); retry later", "TEMPORARILY_UNAVAILABLE")


def request_timed_out(limit: float):
    """HTTP 504 under ``mlflow models serve`` (which has answered it already)."""
    return _serving_error(f"the request ran past its {limit:g} s limit; it makes no further LM calls "
                          f"({ENV_REQUEST_TIMEOUT}, {MLFLOW_REQUEST_TIMEOUT})", "DEADLINE_EXCEEDED")


class RequestDeadline:
    """The time by which one predict call must be done (monotonic clock)."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.at = time.monotonic() + seconds

    def left(self) -> float:
        return self.at - time.monotonic()

    def check(self) -> None:
        if self.left() <= 0:
            raise request_timed_out(self.seconds)


# The deadline of the predict call this thread (or pool task) works for; None outside one.
_DEADLINE: contextvars.ContextVar[RequestDeadline | None] = contextvars.ContextVar("trace_dspy_request_deadline",
                                                                                   default=None)
_STOPPING_CLASSES: dict[type, type] = {}


def _stopping_class(base: type) -> type:
    """``base`` with a deadline check before every call (copies keep it: ``dspy.LM.copy`` keeps the class)."""
    if base not in _STOPPING_CLASSES:
        def __call__(self, *args, **kwargs):
            deadline = _DEADLINE.get()
            if deadline is not None:
                deadline.check()
            return base.__call__(self, *args, **kwargs)

        async def acall(self, *args, **kwargs):
            deadline = _DEADLINE.get()
            if deadline is not None:
                deadline.check()
            return await base.acall(self, *args, **kwargs)

        _STOPPING_CLASSES[base] = type(base.__name__, (base,), {"__call__": __call__, "acall": acall,
                                                                 "__module__": base.__module__,
                                                                 "_trace_dspy_deadline": True})
    return _STOPPING_CLASSES[base]


def stop_lms_at_deadline(loaded) -> None:
    """Make every LM of a loaded program refuse calls once the current request's deadline has passed."""
    import dspy

    lms = list(getattr(loaded.lms, "_built", {}).values())
    lms += [p.lm for _, p in loaded.program.named_predictors() if getattr(p, "lm", None) is not None]
    for lm in lms:
        if isinstance(lm, dspy.BaseLM) and not getattr(type(lm), "_trace_dspy_deadline", False):
            lm.__class__ = _stopping_class(type(lm))


def answer_row(program, dialogue: Any) -> dict[str, Any]:
    """One output row; an exception becomes the row's ``error`` (redacted) instead of failing the batch."""
    from trace_dspy.core.dialogue import DialogueError
    from trace_dspy.core.safety import redact
    from trace_dspy.workflows.batch import stage_outputs

    empty = dict.fromkeys(OUTPUT_COLUMNS, "")
    if dialogue is None or (isinstance(dialogue, float) and dialogue != dialogue):  # None or NaN
        return {**empty, "error": "no dialogue in this row"}
    try:
        pred = program(dialogue=dialogue)
    except DialogueError as exc:
        return {**empty, "error": f"invalid dialogue: {exc}"}
    except Exception as exc:  # noqa: BLE001 - one bad row must not stop the batch
        return {**empty, "error": redact(f"{type(exc).__name__}: {exc}")}
    stages = stage_outputs(pred)
    return {"emotion": str(stages.get("emotion", "")), "emotion_group": str(stages.get("emotion_group", "")),
            "cause_summary": str(stages.get("cause_summary", "")), "strategy": str(stages.get("strategy", "")),
            "reply": str(pred.response), "stages": json.dumps(stages, ensure_ascii=False, default=str), "error": ""}


class TraceModel(mlflow.pyfunc.PythonModel):
    """The pyfunc model: loads the artifact folder once per process, then answers rows in order."""

    def __init__(self):
        self.loaded = None
        self.threads = 1
        self.timeout: float | None = None
        self.busy_wait: float | None = None
        self._lock = threading.Lock()

    def load_context(self, context) -> None:
        from dataclasses import replace

        from trace_dspy.workflows.loading import load_for_run
        from trace_dspy.workflows.settings import Settings

        folder = Path(context.artifacts[ARTIFACT_KEY])
        threads = threads_from_env()
        self.timeout, self.busy_wait = limits_from_env()  # a bad value fails the load, not each request
        lm_config = lm_config_from_env()
        settings = Settings(lm_explicit=lm_config is not None, trust_artifact_lm=_trusted(),
                            **({"lm": lm_config} if lm_config is not None else {}))
        self.loaded = replace(load_for_run(str(folder), settings), ref=f"mlflow model ({folder.name})")
        stop_lms_at_deadline(self.loaded)
        # The embedded engine decodes one call at a time, so threads would only queue behind its lock.
        embedded = any(spec.is_local for _, spec in self.loaded.lms.config.specs())
        self.threads = 1 if embedded else threads

    # The pandas hint tells MLflow to leave the input as it comes (the signature already checks it).
    def predict(self, context, model_input: pd.DataFrame, params=None) -> pd.DataFrame:
        if self.loaded is None:  # predict without load_context: MLflow always calls it first
            raise RuntimeError("the model was not loaded (load_context was not called)")
        # Read per call: MLflow's scoring server marks its environment only after it has loaded the model.
        self.timeout, self.busy_wait = limits_from_env()
        deadline = RequestDeadline(self.timeout) if self.timeout is not None else None
        dialogues = dialogues_from(model_input)
        token = _DEADLINE.set(deadline)
        try:
            return self._predict(dialogues, deadline)
        finally:
            _DEADLINE.reset(token)

    def _predict(self, dialogues: list[Any], deadline: RequestDeadline | None) -> pd.DataFrame:
        from trace_dspy.lm.specs import use_lm

        program = self.loaded.program
        if self.threads > 1 and len(dialogues) > 1:
            # A remote LM: overlap the rows' waits; each row's answer stays in its own place.
            from concurrent.futures import ThreadPoolExecutor

            from trace_dspy.core.console import with_dspy_context

            with use_lm(self.loaded.lms.default), \
                    ThreadPoolExecutor(max_workers=min(self.threads, len(dialogues))) as pool:
                answer = with_dspy_context(lambda d: answer_row(program, d))
                # Each task sees this request's deadline (a pool thread starts from an empty context).
                rows = list(pool.map(lambda d: _run_with_deadline(deadline, answer, d), dialogues))
        else:
            # One request at a time; a request that finds the model busy waits a bounded time, then is refused.
            if not self._lock.acquire(timeout=-1 if self.busy_wait is None else self.busy_wait):
                raise model_busy(self.busy_wait)
            try:
                with use_lm(self.loaded.lms.default):
                    rows = []
                    for dialogue in dialogues:
                        if deadline is not None:
                            deadline.check()
                        rows.append(answer_row(program, dialogue))
            finally:
                self._lock.release()
        if deadline is not None and deadline.left() <= 0 and any(row["error"] for row in rows):
            deadline.check()  # rows cut short by the limit: the request failed, not those dialogues
        return pd.DataFrame(rows, columns=list(OUTPUT_COLUMNS))


def _run_with_deadline(deadline: RequestDeadline | None, fn, *args):
    token = _DEADLINE.set(deadline)
    try:
        return fn(*args)
    finally:
        _DEADLINE.reset(token)


def model_signature():
    from mlflow.models import ModelSignature
    from mlflow.types.schema import ColSpec, Schema

    return ModelSignature(inputs=Schema([ColSpec("string", INPUT_COLUMN)]),
                          outputs=Schema([ColSpec("string", c) for c in OUTPUT_COLUMNS]))


def required_extras(folder: Path) -> list[str]:
    """The trace-dspy extras an artifact needs to run: ``local`` for the embedded model, ``embed`` for
    the emotion prior and the learned reply reward (MiniLM)."""
    from trace_dspy.store.artifacts import read_manifest

    manifest = read_manifest(folder)
    extras = set()
    if any(spec.is_local for _, spec in manifest.lm_config().specs()):
        extras.add("local")
    if (folder / "emotion_prior.npz").is_file() or manifest.program_config().best_of != 1:
        extras.add("embed")
    return sorted(extras)


def pip_requirements(folder: Path) -> list[str]:
    from importlib.metadata import PackageNotFoundError, version

    try:
        ours = version("trace-dspy")
    except PackageNotFoundError:  # pragma: no cover - running from a bare checkout
        ours = None
    extras = required_extras(folder)
    name = "trace-dspy" + (f"[{','.join(extras)}]" if extras else "")
    reqs = [f"{name}=={ours}" if ours else name]
    for dist in ("mlflow", "dspy"):
        try:
            reqs.append(f"{dist}=={version(dist)}")
        except PackageNotFoundError:  # pragma: no cover
            pass
    return reqs


def _model_kwargs(folder: Path) -> dict[str, Any]:
    if not (folder / "manifest.json").is_file():
        raise FileNotFoundError(f"{folder} is not a trace-dspy artifact folder (no manifest.json)")
    return {"python_model": str(CODE_FILE), "artifacts": {ARTIFACT_KEY: str(folder)},
            "signature": model_signature(), "pip_requirements": pip_requirements(folder)}


@contextlib.contextmanager
def _quiet_logging():
    """MLflow's advice to add type hints and an input example does not apply here (the signature is
    explicit, and an example would call the LM at logging time); its copy progress bar is noise."""
    saved = os.environ.get("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR")
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*type hints to the `predict` method.*")
            warnings.filterwarnings("ignore", message=".*input example was not provided.*")
            yield
    finally:
        if saved is None:
            os.environ.pop("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", None)


def log_program_model(folder: str | os.PathLike, *, name: str = MODEL_NAME):
    """Log an artifact folder as a pyfunc model in the active run; returns MLflow's ModelInfo.

    The sha256 of every file of the logged model (its code file, MLmodel, the artifact's files) is
    recorded as the logged model's tag ``trace_dspy.files_sha256``; registering a version copies it, and
    :func:`trace_dspy.store.registry.fetch_artifact` checks a model's files against it before use."""
    import tempfile

    import mlflow
    from mlflow import MlflowClient

    from trace_dspy.store.registry import DIGEST_TAG, digest_record

    with _quiet_logging():
        info = mlflow.pyfunc.log_model(name=name, **_model_kwargs(Path(folder)))
        with tempfile.TemporaryDirectory(prefix="trace-model-") as tmp:
            local = mlflow.artifacts.download_artifacts(artifact_uri=info.model_uri, dst_path=tmp)
            MlflowClient().set_logged_model_tags(info.model_id, {DIGEST_TAG: digest_record(Path(local))})
    return info


def save_program_model(folder: str | os.PathLike, path: str | os.PathLike) -> Path:
    """Write an artifact folder as a pyfunc model directory at ``path`` (no run needed), e.g. for Spark."""
    import mlflow

    with _quiet_logging():
        mlflow.pyfunc.save_model(path=str(path), **_model_kwargs(Path(folder)))
    return Path(path)


def export_model(ref: str, path: str | os.PathLike, *, tracking_uri: str | None = None,
                 allow_unverified: bool = False) -> Path:
    """A pyfunc model directory at ``path`` for a registered or logged model (``champion``,
    ``models:/NAME/VERSION``, ``models:/NAME@ALIAS``, ``runs:/ID``) that runs the installed trace-dspy code.

    The model's files are checked against the digests recorded when it was logged (a changed file is an
    ArtifactError naming it; one without a record is refused unless ``allow_unverified``); only its
    artifact folder (JSON, the prior, the index) is kept, and the code file is this installation's.
    ``mlflow models serve -m PATH`` then never runs code from the store."""
    import tempfile

    from trace_dspy.store.registry import fetch_artifact

    with tempfile.TemporaryDirectory(prefix="trace-fetch-") as tmp:
        folder = fetch_artifact(ref, tracking_uri=tracking_uri, cache_dir=tmp, allow_unverified=allow_unverified)
        return save_program_model(folder, path)


__all__ = ["OUTPUT_COLUMNS", "TraceModel", "export_model", "limits_from_env", "answer_row", "dialogues_from",
           "lm_config_from_env", "log_program_model", "model_signature", "pip_requirements", "required_extras",
           "save_program_model"]
