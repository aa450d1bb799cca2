"""The MLflow model registry side of artifacts: versions, the champion alias, fetching.

A registered model (default ``trace-dspy``) gets one version per compile. Its
source is the compile run's MLflow model: a pyfunc logged from code
(``trace_dspy.workflows.serving``) whose model artifact ``program`` is the
artifact folder (program.json, manifest.json, the prior and the index; no
pickle), so that ``mlflow.pyfunc.load_model``, ``mlflow models serve`` and
``spark_udf`` run it. Versions registered before that point at the run's
``artifact/`` folder; both kinds load. Each version carries the dev score as a
tag; the alias ``champion`` moves to a new version only when that score beats
the current champion's.
"""

from __future__ import annotations

import re
from pathlib import Path

from trace_dspy.store.errors import ArtifactError
from trace_dspy.store.tracking import resolve_tracking_uri

DEFAULT_MODEL = "trace-dspy"
CHAMPION = "champion"
SCORE_TAG = "dev_empathy"
ARTIFACT_SUBDIR = "artifact"


def _client(tracking_uri: str | None):
    import mlflow
    from mlflow import MlflowClient

    from trace_dspy.store.tracking import _quiet_mlflow, init_store

    _quiet_mlflow()
    uri = resolve_tracking_uri(tracking_uri)
    init_store(uri)
    mlflow.set_tracking_uri(uri)
    return MlflowClient(tracking_uri=uri)


def register_version(run_id: str, artifact_uri: str, score: float, *, model: str = DEFAULT_MODEL,
                     tracking_uri: str | None = None, tags: dict[str, str] | None = None,
                     model_uri: str | None = None, model_id: str | None = None) -> int:
    """Create a registry version whose source is the run's logged MLflow model (``model_uri``,
    ``model_id``), or, without one, the run's artifact folder."""
    from mlflow.exceptions import MlflowException

    from trace_dspy.store.tracking import store_lock

    client = _client(tracking_uri)
    with store_lock(resolve_tracking_uri(tracking_uri)):  # two first compiles must not both create it
        try:
            client.get_registered_model(model)
        except MlflowException:
            client.create_registered_model(model, description="TRACE programs compiled by trace-dspy (JSON state)")
    source = model_uri or f"{artifact_uri}/{ARTIFACT_SUBDIR}"
    version = client.create_model_version(model, source=source, run_id=run_id, model_id=model_id,
                                          tags={SCORE_TAG: repr(float(score)), **(tags or {})})
    return int(version.version)


def champion(model: str = DEFAULT_MODEL, *, tracking_uri: str | None = None) -> tuple[int, float] | None:
    """(version, dev score) of the current champion, or None."""
    from mlflow.exceptions import MlflowException

    client = _client(tracking_uri)
    try:
        mv = client.get_model_version_by_alias(model, CHAMPION)
    except MlflowException:
        return None
    return int(mv.version), float(mv.tags.get(SCORE_TAG, "-inf"))


def promote_if_better(version: int, score: float, *, model: str = DEFAULT_MODEL,
                      tracking_uri: str | None = None) -> bool:
    """Point ``champion`` at ``version`` if its score beats the current champion's (strictly)."""
    current = champion(model, tracking_uri=tracking_uri)
    if current is not None and not score > current[1]:
        return False
    _client(tracking_uri).set_registered_model_alias(model, CHAMPION, str(version))
    return True


def fetch_artifact(ref: str, *, tracking_uri: str | None = None, cache_dir: str | Path | None = None) -> Path:
    """Download the artifact folder that a registry or run reference names.

    ``champion``; ``models:/NAME/VERSION``; ``models:/NAME@ALIAS``; ``runs:/RUN_ID``
    (its ``artifact/`` folder) or ``runs:/RUN_ID/PATH``.
    """
    import mlflow
    from mlflow.exceptions import MlflowException

    client = _client(tracking_uri)
    try:
        if ref == CHAMPION:
            mv = client.get_model_version_by_alias(DEFAULT_MODEL, CHAMPION)
            uri = mv.source
        elif ref.startswith("models:/"):
            body = ref[len("models:/"):]
            if "@" in body:
                name, alias = body.split("@", 1)
                mv = client.get_model_version_by_alias(name, alias)
            elif re.fullmatch(r"[^/]+/\d+", body):
                name, number = body.rsplit("/", 1)
                mv = client.get_model_version(name, number)
            else:
                raise ArtifactError(f"{ref!r}: use models:/NAME/VERSION or models:/NAME@ALIAS")
            uri = mv.source
        elif ref.startswith("runs:/"):
            body = ref[len("runs:/"):].strip("/")
            if not body:
                raise ArtifactError("runs:/ needs a run id")
            uri = f"runs:/{body}" if "/" in body else f"runs:/{body}/{ARTIFACT_SUBDIR}"
        else:
            raise ArtifactError(f"not a registry reference: {ref!r}")
        dst = Path(cache_dir) if cache_dir else None
        if dst is not None:
            dst.mkdir(parents=True, exist_ok=True)
        local = mlflow.artifacts.download_artifacts(artifact_uri=uri, dst_path=str(dst) if dst else None,
                                                    tracking_uri=resolve_tracking_uri(tracking_uri))
    except MlflowException as exc:
        raise ArtifactError(f"cannot fetch {ref!r} from {resolve_tracking_uri(tracking_uri)}: {exc.message}") from None
    found = artifact_folder_in(Path(local))
    if found is None:
        raise ArtifactError(f"{ref!r} holds no trace-dspy artifact (no manifest.json in {local})")
    return found


def artifact_folder_in(folder: Path) -> Path | None:
    """The artifact folder in a downloaded registry source: the folder itself, its ``artifact/``
    (versions registered as files), or the pyfunc model's ``artifacts/<name>/``; None if there is none."""
    candidates = [folder, folder / ARTIFACT_SUBDIR, folder / "artifacts" / "program",
                  *sorted(p for p in (folder / "artifacts").glob("*") if p.is_dir())]
    return next((p for p in candidates if (p / "manifest.json").is_file()), None)
