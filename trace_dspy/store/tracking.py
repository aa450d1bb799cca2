"""MLflow helpers: one place that knows the tracking store, names and flattening.

Metric names use ``/`` groups (``dev_after/empathy``) so that MLflow's charts
and parallel-coordinates view line the same measure up across runs.
Nothing here runs at import; MLflow itself is imported lazily.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

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
    """Start (and always end) an MLflow run; yields the run."""
    import mlflow

    uri = resolve_tracking_uri(tracking_uri)
    experiment_id = ensure_experiment(experiment, uri)
    with mlflow.start_run(experiment_id=experiment_id, run_name=run_name, tags=dict(tags or {}),
                          nested=nested) as run:
        yield run


def flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """Nested config -> flat ``a.b.c`` params, values as short strings."""
    out: dict[str, str] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten(value, name + "."))
        else:
            text = value if isinstance(value, str) else json.dumps(value)
            out[name] = text[:6000]
    return out


def log_params(params: Mapping[str, Any]) -> None:
    import mlflow

    flat = flatten(params)
    items = list(flat.items())
    for i in range(0, len(items), 90):  # MLflow takes at most 100 params per batch
        mlflow.log_params(dict(items[i:i + 90]))


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


def warn_not_logged(exc: BaseException, results) -> None:
    """MLflow failed after the results were written: say where they are instead of losing them."""
    import sys

    print(f"warning: could not log to MLflow ({type(exc).__name__}: {exc}); results are in {results}",
          file=sys.stderr)


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
