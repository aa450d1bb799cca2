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
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any

import mlflow.pyfunc
import pandas as pd  # mlflow's own dependency

from trace_dspy.store.evaluations import MODEL_NAME

CODE_FILE = Path(__file__).with_name("pyfunc_model.py")
ARTIFACT_KEY = "program"
INPUT_COLUMN = "dialogue"
# One row out per row in, in the same order. ``stages`` holds every stage output as a JSON object;
# ``error`` is empty on success and says what went wrong for that row otherwise (the other columns are
# then empty), so one bad dialogue never loses a batch or a partition.
OUTPUT_COLUMNS = ("emotion", "emotion_group", "cause_summary", "strategy", "reply", "stages", "error")
ENV_LM, ENV_API_BASE, ENV_KEY_ENV = "TRACE_DSPY_LM", "TRACE_DSPY_API_BASE", "TRACE_DSPY_API_KEY_ENV"
ENV_TIMEOUT, ENV_TRUST = "TRACE_DSPY_TIMEOUT", "TRACE_DSPY_TRUST_ARTIFACT_LM"
ENV_CACHE, ENV_THREADS = "TRACE_DSPY_LM_CACHE", "TRACE_DSPY_THREADS"


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
        self._lock = threading.Lock()

    def load_context(self, context) -> None:
        from trace_dspy.store.artifacts import load_folder

        folder = Path(context.artifacts[ARTIFACT_KEY])
        threads = threads_from_env()
        self.loaded = load_folder(folder, lm_config=lm_config_from_env(), trust_lm=_trusted(),
                                  ref=f"mlflow model ({folder.name})")
        # The embedded engine decodes one call at a time, so threads would only queue behind its lock.
        embedded = any(spec.is_local for _, spec in self.loaded.lms.config.specs())
        self.threads = 1 if embedded else threads

    # The pandas hint tells MLflow to leave the input as it comes (the signature already checks it).
    def predict(self, context, model_input: pd.DataFrame, params=None) -> pd.DataFrame:
        if self.loaded is None:  # predict without load_context: MLflow always calls it first
            raise RuntimeError("the model was not loaded (load_context was not called)")
        dialogues = dialogues_from(model_input)
        from trace_dspy.lm.specs import use_lm

        program = self.loaded.program
        if self.threads > 1 and len(dialogues) > 1:
            # A remote LM: overlap the rows' waits; each row's answer stays in its own place.
            from concurrent.futures import ThreadPoolExecutor

            from trace_dspy.core.console import with_dspy_context

            with use_lm(self.loaded.lms.default), \
                    ThreadPoolExecutor(max_workers=min(self.threads, len(dialogues))) as pool:
                rows = list(pool.map(with_dspy_context(lambda d: answer_row(program, d)), dialogues))
        else:
            # One row at a time; the lock keeps a threaded server's requests from interleaving.
            with self._lock, use_lm(self.loaded.lms.default):
                rows = [answer_row(program, d) for d in dialogues]
        return pd.DataFrame(rows, columns=list(OUTPUT_COLUMNS))


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
    config = manifest.get("config") or {}
    lm = config.get("lm") or {}
    specs = [lm.get("default") or {}, *((lm.get("stages") or {}).values())]
    extras = set()
    if any(str((s or {}).get("model", "local")).startswith("local") for s in specs):
        extras.add("local")
    program = config.get("program") or {}
    if (folder / "emotion_prior.npz").is_file() or program.get("best_of", 1) not in (1, "1"):
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
    """Log an artifact folder as a pyfunc model in the active run; returns MLflow's ModelInfo."""
    import mlflow

    with _quiet_logging():
        return mlflow.pyfunc.log_model(name=name, **_model_kwargs(Path(folder)))


def save_program_model(folder: str | os.PathLike, path: str | os.PathLike) -> Path:
    """Write an artifact folder as a pyfunc model directory at ``path`` (no run needed), e.g. for Spark."""
    import mlflow

    with _quiet_logging():
        mlflow.pyfunc.save_model(path=str(path), **_model_kwargs(Path(folder)))
    return Path(path)


__all__ = ["OUTPUT_COLUMNS", "TraceModel", "answer_row", "dialogues_from",
           "lm_config_from_env", "log_program_model", "model_signature", "pip_requirements", "required_extras",
           "save_program_model"]
