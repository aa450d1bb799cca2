"""MLflow helpers: one place that knows the tracking store, names and flattening.

Metric names use ``/`` groups (``dev_after/empathy``) so that MLflow's charts
and parallel-coordinates view line the same measure up across runs.
Nothing here runs at import; MLflow itself is imported lazily.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from trace_dspy.core import env
from trace_dspy.core.console import say
from trace_dspy.core.safety import exception_chain, redact

DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"
DEFAULT_EXPERIMENT = "trace-dspy"


def resolve_tracking_uri(uri: str | None) -> str:
    """The default store is ``mlflow.db`` in the working directory (absolute path)."""
    uri = uri or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        uri = "sqlite:///" + str(Path(uri[len("sqlite:///"):]).resolve())
    return uri


def _quiet_mlflow() -> None:
    import logging
    import warnings

    warnings.filterwarnings("ignore", category=DeprecationWarning, module="sqlalchemy")
    warnings.filterwarnings("ignore", category=FutureWarning, module="mlflow")
    for name in ("mlflow", "alembic", "sqlalchemy"):
        logging.getLogger(name).setLevel(logging.ERROR)


_READY: set[str] = set()


@contextmanager
def store_lock(tracking_uri: str):
    """An exclusive lock beside a sqlite store (``mlflow.db.lock``); no-op for other stores.

    MLflow creates a new sqlite store's schema on first use; several processes
    doing that at once crash inside the migration, and two that both miss an
    experiment both try to create it. Both steps run under this lock.
    """
    if not tracking_uri.startswith("sqlite:///"):
        yield
        return
    import fcntl

    db = Path(tracking_uri[len("sqlite:///"):])
    db.parent.mkdir(parents=True, exist_ok=True)
    # file-audit: creates or opens the store's lock file only to flock it; nothing is read or written
    with open(db.with_name(db.name + ".lock"), "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def init_store(tracking_uri: str) -> None:
    """Create the store's schema once, under the lock, before anything else touches it."""
    if tracking_uri in _READY:
        return
    from mlflow import MlflowClient

    _quiet_mlflow()
    with store_lock(tracking_uri):
        MlflowClient(tracking_uri=tracking_uri).search_experiments(max_results=1)
    _READY.add(tracking_uri)


def ensure_experiment(name: str, tracking_uri: str) -> str:
    """Create the experiment with an explicit artifact folder beside a sqlite store."""
    import mlflow

    _quiet_mlflow()
    init_store(tracking_uri)
    mlflow.set_tracking_uri(tracking_uri)
    # After the URI: a new URI resets MLflow's tracing configuration. Every trace stored from here on
    # has its credentials masked.
    from trace_dspy.store.traces import install_redaction

    install_redaction()
    existing = mlflow.get_experiment_by_name(name)
    if existing is not None:
        return existing.experiment_id
    location = None
    if tracking_uri.startswith("sqlite:///"):
        db = Path(tracking_uri[len("sqlite:///"):])
        location = (db.parent / "mlruns").resolve().as_uri()
    with store_lock(tracking_uri):
        existing = mlflow.get_experiment_by_name(name)  # another process may have made it meanwhile
        if existing is not None:
            return existing.experiment_id
        return mlflow.create_experiment(name, artifact_location=location)


def prepare_tracing(tracking_uri: str | None, experiment: str) -> str:
    """Point MLflow's traces at ``experiment`` in the store (created when missing); returns its id."""
    import mlflow

    experiment_id = ensure_experiment(experiment, resolve_tracking_uri(tracking_uri))
    mlflow.set_experiment(experiment_id=experiment_id)
    return experiment_id


@contextmanager
def mlflow_run(*, tracking_uri: str | None, experiment: str, run_name: str, tags: Mapping[str, str] | None = None,
               nested: bool = False):
    """Start (and always end) an MLflow run; yields the run.

    A sqlite store that another process keeps locked ends the run with :class:`StoreLocked` (one line
    naming the file) instead of MLflow's SQL error: at the start after :func:`wait_for_store`'s bounded
    wait, and inside the run when an MLflow call finds the store locked.
    """
    import mlflow

    uri = resolve_tracking_uri(tracking_uri)
    wait_for_store(uri)
    try:
        experiment_id = ensure_experiment(experiment, uri)
        run = mlflow.start_run(experiment_id=experiment_id, run_name=run_name, tags=_masked_tags(tags),
                               nested=nested)
    except Exception as exc:
        if is_lock_error(exc):
            raise StoreLocked(_locked_message(uri, store_wait())) from None
        raise
    token = _SAVED.set(None)
    try:
        try:
            yield run
        except BaseException as exc:
            if is_lock_error(exc):
                # Ending the run would wait on the same lock again: it stays RUNNING, as after a kill.
                _forget_active_run()
                raise StoreLocked(_locked_message(uri, store_wait(), run_id=run.info.run_id)) from None
            mlflow.end_run("KILLED" if isinstance(exc, KeyboardInterrupt) else "FAILED")
            raise
        try:
            mlflow.end_run("FINISHED")
        except Exception as exc:
            if is_lock_error(exc):
                raise StoreLocked(_locked_message(uri, store_wait(), run_id=run.info.run_id)) from None
            raise
    finally:
        _SAVED.reset(token)


# ---------------------------------------------------------------- a store locked by another process

ENV_STORE_WAIT = env.STORE_WAIT
# MLflow's own sqlite sessions wait 20 s for a lock; the check before a run waits as long by default.
DEFAULT_STORE_WAIT = 20.0
_SAVED: ContextVar[str | None] = ContextVar("trace_dspy_saved_before_logging", default=None)


class StoreLocked(ValueError):
    """Another process holds a write lock on the sqlite tracking store past the bounded wait."""


def store_wait() -> float:
    """Seconds to wait for a locked sqlite store: ``TRACE_DSPY_STORE_WAIT``, default 20."""
    raw = os.environ.get(ENV_STORE_WAIT, "").strip()
    if not raw:
        return DEFAULT_STORE_WAIT
    try:
        seconds = float(raw)
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds <= 3600:  # also false for NaN
        raise ValueError(f"{ENV_STORE_WAIT} must be a number of seconds from 0 to 3600, not {raw!r}")
    return seconds


def _sqlite_file(tracking_uri: str) -> Path | None:
    if not tracking_uri.startswith("sqlite:///"):
        return None
    return Path(tracking_uri[len("sqlite:///"):].split("?", 1)[0])


def is_lock_error(exc: BaseException) -> bool:
    """Whether ``exc`` (or an exception it came from) is sqlite's "database is locked"."""
    return any("database is locked" in str(current)[:2000] for current in exception_chain(exc))


def _locked_message(tracking_uri: str, waited: float, *, run_id: str | None = None) -> str:
    db = _sqlite_file(tracking_uri) or tracking_uri
    parts = [f"the MLflow store {db} is locked by another process (still locked after {waited:g} s)"]
    saved = _SAVED.get()
    if saved:
        parts.append(f"{saved}; only its MLflow logging failed")
    if run_id:
        parts.append(f"the MLflow run {run_id} stays marked RUNNING")
    parts.append(f"let the other process finish and run again, or use --no-mlflow or another --tracking-uri "
                 f"(wait longer with {ENV_STORE_WAIT}=SECONDS)")
    return "; ".join(parts)


def wait_for_store(tracking_uri: str | None, *, saved: str | None = None) -> None:
    """Wait, at most ``TRACE_DSPY_STORE_WAIT`` seconds, until a sqlite store can take a write.

    Raises :class:`StoreLocked` when another process still holds its lock. ``saved`` says what is
    already on disk (e.g. a compile's artifact version); a lock error later in the same run repeats it.
    Other stores, and a sqlite file that does not exist yet, pass at once.
    """
    uri = resolve_tracking_uri(tracking_uri)
    if saved is not None:
        _SAVED.set(saved)
    db = _sqlite_file(uri)
    if db is None or not db.is_file():
        return
    import sqlite3

    waited = store_wait()
    try:
        con = sqlite3.connect(str(db), timeout=waited, isolation_level=None)
        try:
            con.execute("BEGIN IMMEDIATE")  # the write lock: waits while another connection holds it
            con.execute("ROLLBACK")
        finally:
            con.close()
    except sqlite3.OperationalError as exc:
        if is_lock_error(exc):
            raise StoreLocked(_locked_message(uri, waited)) from None
        raise


def _forget_active_run() -> None:
    """Drop the innermost active run from MLflow's run stack without writing to the store."""
    from mlflow.environment_variables import MLFLOW_RUN_ID
    from mlflow.tracking import fluent

    stack = fluent._active_run_stack.get()
    if stack:
        stack.pop()
    MLFLOW_RUN_ID.unset()


def _masked_tags(tags: Mapping[str, str] | None) -> dict[str, str]:
    """Run tags with credentials masked (a tag may quote a command line)."""
    return {k: redact(v, limit=None) if isinstance(v, str) else v for k, v in (tags or {}).items()}


def flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """Nested config -> flat ``a.b.c`` params, values as short strings."""
    out: dict[str, str] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten(value, name + "."))
        else:
            text = value if isinstance(value, str) else json.dumps(value)
            out[name] = redact(text, limit=None)[:6000]
    return out


def log_params(params: Mapping[str, Any]) -> None:
    import mlflow

    flat = flatten(params)
    items = list(flat.items())
    for i in range(0, len(items), 90):  # MLflow takes at most 100 params per batch
        mlflow.log_params(dict(items[i:i + 90]))


def log_metrics(metrics: Mapping[str, float]) -> None:
    """Log numbers (e.g. :func:`numeric_metrics`) to the active run."""
    import mlflow

    mlflow.log_metrics(dict(metrics))


def log_metric_steps(key: str, values: list[float]) -> None:
    """Log ``values`` as the metric ``key`` of the active run, one step each from 1 (a loss curve), in batches
    of 1000 (one call per step would take a store transaction each); values that are not finite are left out."""
    import time

    import mlflow
    from mlflow.entities import Metric

    run = mlflow.active_run()
    if run is None:
        return
    now = int(time.time() * 1000)
    rows = [Metric(key, float(v), now, step) for step, v in enumerate(values, 1) if math.isfinite(v)]
    client = mlflow.MlflowClient()
    for i in range(0, len(rows), 1000):
        client.log_batch(run.info.run_id, metrics=rows[i:i + 1000])


def log_artifacts(folder: str | os.PathLike, artifact_path: str | None = None) -> None:
    """Log every file in ``folder`` to the active run, under ``artifact_path``."""
    import mlflow

    mlflow.log_artifacts(str(folder), artifact_path=artifact_path)


def numeric_metrics(summary: Mapping[str, Any], prefix: str) -> dict[str, float]:
    """The plain numbers of a summary, as ``prefix/name`` metrics."""
    out = {}
    for key, value in summary.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if isinstance(value, float) and not math.isfinite(value):
            continue
        out[f"{prefix}/{key}"] = float(value)
    return out


# What SQLAlchemy adds to a database error's own words: the statement, its parameters, a link to its docs.
_SQL_TAIL = re.compile(r"\s*(\[SQL:|\[parameters:|\(Background on this error)")
_DRIVER_PREFIX = re.compile(r"^\([\w.]+\)\s*")


def error_line(exc: BaseException) -> str:
    """A store error as one line, ``Type: words``: the database's own words without the SQL statement, its
    parameters and the link SQLAlchemy appends, credentials masked, at most 300 characters."""
    text = _SQL_TAIL.split(str(exc), maxsplit=1)[0].strip()
    first = _DRIVER_PREFIX.sub("", (text.splitlines() or [""])[0].strip())
    return redact(f"{type(exc).__name__}: {first}" if first else type(exc).__name__)[:300]


_NOT_LOGGED = [0]  # how many times this process warned that results were not logged


def warn_not_logged(exc: BaseException, results) -> None:
    """MLflow failed after the results were written: say where they are instead of losing them."""
    _NOT_LOGGED[0] += 1
    say(f"warning: could not log to MLflow ({error_line(exc)}); results are in {results}")


def not_logged_count() -> int:
    """How many times :func:`warn_not_logged` warned in this process: a command compares it before and after
    its work, and does not exit 0 when its results did not reach MLflow."""
    return _NOT_LOGGED[0]


@contextmanager
def logged_or_warned(results):
    """Run the MLflow logging inside; if it fails, warn (naming ``results``) instead of raising.

    For logging that follows results already on disk. Only ``Exception`` is
    caught: KeyboardInterrupt and SystemExit still end the command.
    """
    try:
        yield
    except Exception as exc:  # the results are on disk already; say so rather than lose them
        warn_not_logged(exc, results)


# ---------------------------------------------------------------- what a compile run records


def set_tags(tags: Mapping[str, str]) -> None:
    """Set tags on the active run."""
    import mlflow

    mlflow.set_tags(dict(tags))


def autolog_compiles() -> None:
    """Have DSPy's autolog record the optimizer's compile, without traces. Its candidate evaluations are
    left out: each would be an unnamed child run (eval_0, ...) with one unnamed metric, and their scores are
    the compile's selection scores already (printed, and in the manifest)."""
    import mlflow

    mlflow.dspy.autolog(log_compiles=True, log_evals=False, log_traces_from_compile=False, log_traces=False,
                        silent=True)


@contextmanager
def traced_run(**run_options: Any):
    """:func:`mlflow_run`, with MLflow's traces going to the run's experiment; yields the run."""
    import mlflow

    with mlflow_run(**run_options) as run:
        mlflow.set_experiment(experiment_id=run.info.experiment_id)
        yield run


def register_prompt(name: str, template: str, *, commit_message: str, tags: Mapping[str, str]) -> None:
    """A new version of the prompt ``name`` in MLflow's prompt registry."""
    import mlflow

    mlflow.genai.register_prompt(name=name, template=template, commit_message=commit_message, tags=dict(tags))


def log_artifact(path: str | os.PathLike, artifact_path: str | None = None) -> None:
    """Log one file to the active run, under ``artifact_path``."""
    import mlflow

    mlflow.log_artifact(str(path), artifact_path=artifact_path)


def log_record_run(record_file: str | os.PathLike, metrics: Mapping[str, float], *, tracking_uri: str | None,
                   experiment: str, run_name: str, kind: str, params: Mapping[str, Any] | None = None,
                   variants: Mapping[str, tuple[Mapping[str, Any], Mapping[str, float]]] | None = None) -> str:
    """One run that holds a command's record file, its numbers and params; returns its id.

    ``variants`` (name -> (params, metrics)) become nested runs named ``<run_name> <name>`` of kind
    ``<kind>-variant``, one per variant, as an ablation logs them.
    """
    with mlflow_run(tracking_uri=tracking_uri, experiment=experiment, run_name=run_name,
                    tags={"trace_dspy.kind": kind}) as run:
        if params:
            log_params(params)
        if metrics:
            log_metrics(metrics)
        for name, (variant_params, variant_metrics) in (variants or {}).items():
            with mlflow_run(tracking_uri=tracking_uri, experiment=experiment, run_name=f"{run_name} {name}",
                            tags={"trace_dspy.kind": f"{kind}-variant"}, nested=True):
                log_params(variant_params)
                log_metrics(variant_metrics)
        log_artifact(record_file)
        return run.info.run_id


def use_tracking_store(tracking_uri: str | None = None) -> str:
    """Point MLflow at ``tracking_uri`` (None: $MLFLOW_TRACKING_URI, else the local sqlite store); returns it."""
    import mlflow

    uri = resolve_tracking_uri(tracking_uri)
    mlflow.set_tracking_uri(uri)
    return uri


def log_evaluation_run(out_dir: str | os.PathLike, record: dict[str, Any], rows, *, tracking_uri: str | None,
                       experiment: str, run_name: str, params: Mapping[str, Any], metrics: Mapping[str, float],
                       dataset: dict[str, Any], manifest: Mapping[str, Any] | None) -> tuple[str, str]:
    """One evaluation run: ``params``, ``metrics``, the ``rows`` as an MLflow evaluation linked to the
    program's logged model, and the folder ``out_dir`` with ``record`` as its summary.json.

    ``record`` gains ``mlflow``: the run id and the scorer means. Returns (experiment id, run id).
    """
    from trace_dspy.core.jsonl import atomic_write_json
    from trace_dspy.store.evaluations import log_evaluation, logged_model_id

    with mlflow_run(tracking_uri=tracking_uri, experiment=experiment, run_name=run_name,
                    tags={"trace_dspy.kind": "evaluate"}) as run:
        log_params(params)
        log_metrics(metrics)
        record["mlflow"] = {"run_id": run.info.run_id,
                            "scorer_means": log_evaluation(rows, dataset=dataset, model_id=logged_model_id(manifest))}
        atomic_write_json(Path(out_dir) / "summary.json", record)
        log_artifacts(out_dir, artifact_path="evaluation")
        return run.info.experiment_id, run.info.run_id
