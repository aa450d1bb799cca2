"""The MLflow model registry side of artifacts: versions, the champion alias, fetching.

A registered model (default ``trace-dspy``) gets one version per compile. Its
source is the compile run's MLflow model: a pyfunc logged from code
(``trace_dspy.workflows.serving``) whose model artifact ``program`` is the
artifact folder (program.json, manifest.json, the prior and the index; no
pickle), so that ``mlflow.pyfunc.load_model``, ``mlflow models serve`` and
``spark_udf`` run it. Versions registered before that point at the run's
``artifact/`` folder; both kinds load. Each version carries the dev score and
the fingerprint of the dev items and metric it is on as tags; the alias
``champion`` moves to a new version only when it beats the current champion
on the same dev items under the same metric (the compile scores the champion
on its own dev set when the two differ, and records both scores).

MLflow's own loaders (``mlflow.pyfunc.load_model``, ``mlflow models serve``,
``spark_udf``) run the model's logged code file, so a model whose files were
edited in the store runs the edited code. When a model is logged, the sha256 of
each of its files is recorded in the store (the logged model's and the version's
tag ``trace_dspy.files_sha256``), and so are those of the artifact folder a
compile logs to its run (the run's tag of the same name). :func:`fetch_artifact`,
which every loader of this project goes through, checks the downloaded files
against it and refuses a model with a changed, missing or added file, naming it.
Everything it loads has this project's layout (a ``manifest.json``), so a
reference without a record is refused too (the record was deleted, or was never
kept): ``allow_unverified`` (``--allow-unverified-model``) loads it unchecked,
with a warning. The record sits in the same store as the files: it catches
damage and edits of the files alone, not someone who can rewrite the tags too.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from trace_dspy.store.errors import ArtifactError
from trace_dspy.store.tracking import resolve_tracking_uri

DEFAULT_MODEL = "trace-dspy"
CHAMPION = "champion"
SCORE_TAG = "dev_empathy"
# The dev items and metric a version's score is on (trace_dspy.workflows.compiling); scores compare only when equal.
DEV_TAG = "dev_fingerprint"
ARTIFACT_SUBDIR = "artifact"
DIGEST_TAG = "trace_dspy.files_sha256"
# MLflow's longest tag value on a logged model; a longer record keeps one digest of the whole tree.
_MAX_TAG = 8000
# The largest file a model's folder may hold (its readers allow at most 512 MiB for any one file).
MAX_FILE_BYTES = 1024 * 1024 * 1024


def file_digests(root: Path) -> dict[str, str]:
    """``{relative path: sha256}`` of every file under ``root``; a symbolic link or other non-file is
    recorded by kind, so that one replacing a file is a change too. Each file is read through
    :func:`~trace_dspy.core.files.hash_file` (a regular file inside ``root``, at most ``MAX_FILE_BYTES``);
    one that is not is an ArtifactError naming it."""
    from trace_dspy.core.files import FileCheckError, hash_file

    digests: dict[str, str] = {}
    for path in sorted(Path(root).rglob("*")):
        rel = path.relative_to(root).as_posix()
        if path.is_symlink():
            digests[rel] = "symlink"
        elif path.is_file():
            h = hashlib.sha256()
            try:
                hash_file(h, path, max_bytes=MAX_FILE_BYTES, root=root)
            except FileCheckError as exc:
                raise ArtifactError(f"{exc}; the model's files cannot be checked") from None
            digests[rel] = h.hexdigest()
        elif not path.is_dir():
            digests[rel] = "special"
    return digests


def _tree_digest(digests: dict[str, str]) -> str:
    return hashlib.sha256(json.dumps(digests, sort_keys=True).encode()).hexdigest()


def digest_record(root: Path) -> str:
    """The tag value that records ``root``'s files: their digests, or one digest of all when too long."""
    digests = file_digests(root)
    text = json.dumps(digests, sort_keys=True, separators=(",", ":"))
    if len(text) > _MAX_TAG:
        text = json.dumps({"*": _tree_digest(digests)}, separators=(",", ":"))
    return text


def verify_files(root: Path, record: str, ref: str) -> None:
    """Refuse (ArtifactError, naming the file) a downloaded model whose files differ from ``record``."""
    try:
        recorded = json.loads(record)
        if not isinstance(recorded, dict) or not all(isinstance(v, str) for v in recorded.values()):
            raise ValueError("not an object of digests")
    except ValueError as exc:
        raise ArtifactError(f"{ref}: the file digests recorded at registration ({DIGEST_TAG}) are unreadable "
                            f"({exc}); refusing to load it") from None
    actual = file_digests(root)
    how = "its files were edited in the store after it was logged; refusing to load it"
    if set(recorded) == {"*"}:
        if _tree_digest(actual) != recorded["*"]:
            raise ArtifactError(f"{ref}: its files differ from the digest recorded at registration: {how}")
        return
    for rel in sorted(set(recorded) | set(actual)):
        if rel not in actual:
            raise ArtifactError(f"{ref}: {rel} is missing (it was there when the model was logged): {how}")
        if rel not in recorded:
            raise ArtifactError(f"{ref}: {rel} was not there when the model was logged: {how}")
        if actual[rel] != recorded[rel]:
            raise ArtifactError(f"{ref}: {rel} differs from the sha256 recorded when the model was logged: {how}")


def recorded_digests(client, *, model_version=None, model_id: str | None = None) -> str | None:
    """The digest record of a registry version (its own tag, else its logged model's; for a version whose
    source is its run's artifact folder, the run's), or of a logged model; None when there is none."""
    if model_version is not None:
        record = (model_version.tags or {}).get(DIGEST_TAG)
        if record:
            return record
        model_id = getattr(model_version, "model_id", None)
        source = str(getattr(model_version, "source", "") or "")
        if not model_id and re.fullmatch(r"models:/m-[0-9a-f]+", source):
            model_id = source[len("models:/"):]
        run_id = getattr(model_version, "run_id", None)
        if not model_id and run_id and source.rstrip("/").endswith(f"/{ARTIFACT_SUBDIR}"):
            return _run_record(client, run_id)
    if not model_id:
        return None
    from mlflow.exceptions import MlflowException

    try:
        return (client.get_logged_model(model_id).tags or {}).get(DIGEST_TAG)
    except MlflowException:
        return None


def _run_record(client, run_id: str) -> str | None:
    """The digest record of the artifact folder a compile logged to run ``run_id`` (its run tag)."""
    from mlflow.exceptions import MlflowException

    try:
        return (client.get_run(run_id).data.tags or {}).get(DIGEST_TAG)
    except MlflowException:
        return None


def _run_model_record(client, run_id: str, name: str) -> str | None:
    """The digest record of the model named ``name`` that run ``run_id`` logged (as MLflow resolves
    ``runs:/RUN_ID/NAME``); None when there is no such model or it has no record."""
    from mlflow.exceptions import MlflowException

    if not re.fullmatch(r"[\w.-]+", name):
        return None
    try:
        experiment_id, token = client.get_run(run_id).info.experiment_id, None
        while True:  # the same search MLflow's download makes (one model of each name per compile run)
            page = client.search_logged_models(experiment_ids=[experiment_id], filter_string=f"name = '{name}'",
                                               page_token=token)
            found = next((m for m in page if m.source_run_id == run_id), None)
            if found is not None:
                return (found.tags or {}).get(DIGEST_TAG)
            if not page.token:
                return None
            token = page.token
    except MlflowException:
        return None


def record_run_files(folder: Path) -> None:
    """Record the sha256 of the artifact folder just logged to the active run (``artifact/``) as the run's
    tag ``trace_dspy.files_sha256``: a ``runs:/RUN_ID`` load checks the files against it."""
    import mlflow

    mlflow.set_tag(DIGEST_TAG, digest_record(Path(folder)))


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
    record = recorded_digests(client, model_id=model_id)  # the files' digests, taken when the model was logged
    version = client.create_model_version(model, source=source, run_id=run_id, model_id=model_id,
                                          tags={SCORE_TAG: repr(float(score)), **(tags or {}),
                                                **({DIGEST_TAG: record} if record else {})})
    return int(version.version)


def champion(model: str = DEFAULT_MODEL, *, tracking_uri: str | None = None) -> tuple[int, float] | None:
    """(version, dev score) of the current champion, or None."""
    record = champion_record(model, tracking_uri=tracking_uri)
    return (record["version"], record["score"]) if record is not None else None


def champion_record(model: str = DEFAULT_MODEL, *, tracking_uri: str | None = None) -> dict | None:
    """The current champion: ``version``, ``score`` (its dev score) and ``dev_fingerprint`` (the dev items and
    metric that score is on; None for versions registered before it was recorded); None without a champion."""
    from mlflow.exceptions import MlflowException

    client = _client(tracking_uri)
    try:
        mv = client.get_model_version_by_alias(model, CHAMPION)
    except MlflowException:
        return None
    tags = mv.tags or {}
    return {"version": int(mv.version), "score": float(tags.get(SCORE_TAG, "-inf")),
            "dev_fingerprint": tags.get(DEV_TAG)}


def comparison_tags(dev_fingerprint: str, comparison: dict | None) -> dict[str, str]:
    """Registry tags for a new version: its dev fingerprint and, when there was a champion, the champion's
    version, its score on the same dev items and the fingerprint of the dev set it was first scored on."""
    tags = {DEV_TAG: dev_fingerprint}
    if comparison is not None:
        tags.update({"champion_version": str(comparison["version"]),
                     "champion_dev_empathy": repr(comparison.get("score")),
                     "champion_dev_fingerprint": str(comparison.get("dev_fingerprint"))})
    return tags


def promote_if_better(version: int, score: float, *, model: str = DEFAULT_MODEL, tracking_uri: str | None = None,
                      dev_fingerprint: str | None = None, comparison: dict | None = None) -> bool:
    """Point ``champion`` at ``version`` if it beats the current champion (strictly) on the same dev items
    under the same metric.

    Args:
        version, score: the new registry version and its dev score.
        dev_fingerprint: what ``score`` was measured on (dev items and metric).
        comparison: the current champion scored on those same items (``score``; None when it could not be
            loaded, and then the new version replaces it), as the compile measured it.

    The champion's recorded score is used only when it was measured on the same
    dev fingerprint; otherwise ``comparison`` must hold its score on this dev set
    for the same champion version, else the champion stays (returns False).
    """
    current = champion_record(model, tracking_uri=tracking_uri)
    if current is not None:
        if current["dev_fingerprint"] == dev_fingerprint:
            theirs = current["score"]
        elif comparison is not None and comparison.get("version") == current["version"]:
            theirs = comparison.get("score")
            theirs = float("-inf") if theirs is None else theirs
        else:
            return False  # no score of the champion on these dev items: no fair comparison
        if not score > theirs:
            return False
    _client(tracking_uri).set_registered_model_alias(model, CHAMPION, str(version))
    return True


def fetch_artifact(ref: str, *, tracking_uri: str | None = None, cache_dir: str | Path | None = None,
                   allow_unverified: bool = False) -> Path:
    """Download the artifact folder that a registry or run reference names, after checking its files.

    ``champion``; ``models:/NAME/VERSION``; ``models:/NAME@ALIAS``; ``models:/m-ID`` (a logged model);
    ``runs:/RUN_ID`` (its ``artifact/`` folder) or ``runs:/RUN_ID/PATH``. The files are checked against the
    sha256 recorded when they were logged (:func:`verify_files`). A reference without such a record is
    refused, unless ``allow_unverified``: then it loads unchecked, with a warning on stderr naming it.
    """
    import mlflow
    from mlflow.exceptions import MlflowException

    client = _client(tracking_uri)
    try:
        uri, record, where = _source_and_record(client, ref)
        dst = Path(cache_dir) if cache_dir else None
        if dst is not None:
            dst.mkdir(parents=True, exist_ok=True)
        local = mlflow.artifacts.download_artifacts(artifact_uri=uri, dst_path=str(dst) if dst else None,
                                                    tracking_uri=resolve_tracking_uri(tracking_uri))
    except MlflowException as exc:
        first = next((line for line in str(exc.message).splitlines() if line.strip()), "")[:300]
        raise ArtifactError(f"cannot fetch {ref!r} from {resolve_tracking_uri(tracking_uri)}: {first}") from None
    if record:
        verify_files(Path(local), record, ref)
    found = artifact_folder_in(Path(local))
    if found is None:
        raise ArtifactError(f"{ref!r} holds no trace-dspy artifact (no manifest.json in {local})")
    if not record:
        _unverified(ref, where, allow_unverified)
    return found


def _source_and_record(client, ref: str) -> tuple[str, str | None, str]:
    """(the URI to download, the digest record of its files or None, where that record is kept)."""
    if ref == CHAMPION:
        mv = client.get_model_version_by_alias(DEFAULT_MODEL, CHAMPION)
        return mv.source, recorded_digests(client, model_version=mv), _VERSION_RECORD
    if ref.startswith("models:/"):
        body = ref[len("models:/"):]
        if re.fullmatch(r"m-[0-9a-f]+", body):  # a logged model by its id
            client.get_logged_model(body)
            return ref, recorded_digests(client, model_id=body), "the logged model's tag"
        if "@" in body:
            name, alias = body.split("@", 1)
            mv = client.get_model_version_by_alias(name, alias)
        elif re.fullmatch(r"[^/]+/\d+", body):
            name, number = body.rsplit("/", 1)
            mv = client.get_model_version(name, number)
        else:
            raise ArtifactError(f"{ref!r}: use models:/NAME/VERSION or models:/NAME@ALIAS")
        return mv.source, recorded_digests(client, model_version=mv), _VERSION_RECORD
    if ref.startswith("runs:/"):
        body = ref[len("runs:/"):].strip("/")
        if not body:
            raise ArtifactError("runs:/ needs a run id")
        run_id, _, path = body.partition("/")
        path = path.strip("/") or ARTIFACT_SUBDIR
        if path == ARTIFACT_SUBDIR:  # None for an unknown run too: the download then names it
            return f"runs:/{run_id}/{path}", _run_record(client, run_id), "the run's tag"
        # MLflow reads runs:/RUN_ID/NAME as the run's logged model NAME; any other path has no record.
        return (f"runs:/{run_id}/{path}", _run_model_record(client, run_id, path),
                f"the run's logged model {path!r} (the run's own tag covers its {ARTIFACT_SUBDIR}/ folder only)")
    raise ArtifactError(f"not a registry reference: {ref!r}")


_VERSION_RECORD = "the registry version's tag or its logged model's"
UNVERIFIED_FLAG = "--allow-unverified-model"


def _unverified(ref: str, where: str, allowed: bool) -> None:
    """A reference whose files have no digest record: refused (ArtifactError), or, when ``allowed``, a
    warning on stderr that names what was loaded unchecked."""
    from trace_dspy.core.console import say

    what = (f"{ref}: the digest record of its files is missing ({DIGEST_TAG}, kept on {where}): it was deleted, "
            "or the model was logged before records were kept")
    if not allowed:
        raise ArtifactError(f"{what}; its files cannot be checked, so refusing to load it ({UNVERIFIED_FLAG}, "
                            "or allow_unverified=True in Python, loads it unchecked)")
    say(f"warning: {what}; loading it with its files NOT verified ({UNVERIFIED_FLAG})")


def artifact_folder_in(folder: Path) -> Path | None:
    """The artifact folder in a downloaded registry source: the folder itself, its ``artifact/``
    (versions registered as files), or the pyfunc model's ``artifacts/<name>/``; None if there is none."""
    candidates = [folder, folder / ARTIFACT_SUBDIR, folder / "artifacts" / "program",
                  *sorted(p for p in (folder / "artifacts").glob("*") if p.is_dir())]
    return next((p for p in candidates if (p / "manifest.json").is_file()), None)
