"""What a command checks before any work: the ``TRACE_DSPY_*`` settings it reads and the paths it will write.

A setting or an output path that cannot be used, found after an hour of fitting or evaluating, loses that
hour (or ends in a traceback). Found here it is one line, and the command exits 2 before anything runs.
Commands call :func:`check_environment` with the variables they read, and :func:`check_output_file` or
:func:`check_output_folder` for each path they will write, right after parsing their flags.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from trace_dspy.core import env


class PreflightError(ValueError):
    """A setting or an output path the command cannot use; the message is one line that names it."""


def folder_problem(folder: Path) -> str | None:
    """Why files cannot be written in ``folder`` (made when it is missing), or None when they can."""
    folder = Path(folder)
    if os.path.lexists(folder) and not folder.exists():
        return f"is a symbolic link to {os.path.realpath(folder)}, which does not exist"
    if folder.exists():
        if not folder.is_dir():
            return "is a file, not a folder"
        if not os.access(folder, os.W_OK | os.X_OK):
            return "is a folder you cannot write to"
        return None
    ancestor = next((p for p in folder.parents if p.exists()), Path("."))
    if not ancestor.is_dir():
        return f"cannot be made: {ancestor} is a file"
    if not os.access(ancestor, os.W_OK | os.X_OK):
        return f"cannot be made: {ancestor} is a folder you cannot write to"
    return None


def check_output_folder(folder: str | os.PathLike, flag: str) -> None:
    """A folder the command writes into (made when missing, with its parents)."""
    problem = folder_problem(Path(folder))
    if problem:
        raise PreflightError(f"{flag} {folder} {problem}; choose another folder")


def check_output_file(path: str | os.PathLike | None, flag: str, *, make_parent: bool = False) -> None:
    """A file the command writes (None: not asked for): not a folder, in a folder that exists (or, with
    ``make_parent``, that the command makes) and can be written, and writable itself when it exists."""
    if path is None:
        return
    path = Path(path)
    if path.is_dir():
        raise PreflightError(f"{flag} {path} is a folder; give a file name")
    parent = path.parent
    if not make_parent and not parent.exists() and not os.path.lexists(parent):
        raise PreflightError(f"{flag} {path}: the folder {parent} does not exist; create it or choose another path")
    problem = folder_problem(parent)
    if problem:
        raise PreflightError(f"{flag} {path}: the folder {parent} {problem}")
    if path.exists() and not os.access(path, os.W_OK):
        raise PreflightError(f"{flag} {path} exists and cannot be written; choose another path")


SQLITE_HEADER = b"SQLite format 3\x00"


def check_tracking_store(tracking_uri: str | None) -> None:
    """A sqlite tracking store (``--tracking-uri``, ``$MLFLOW_TRACKING_URI`` or ./mlflow.db) that can be used:
    a sqlite file (or an empty or missing one) in a folder that can be written, where its lock file goes.
    Other stores are checked at first use."""
    from trace_dspy.store.tracking import resolve_tracking_uri

    uri = resolve_tracking_uri(tracking_uri)
    if not uri.startswith("sqlite:///"):
        return
    db = Path(uri[len("sqlite:///"):].split("?", 1)[0])
    advice = "; use another --tracking-uri, or --no-mlflow"
    if db.is_dir():
        raise PreflightError(f"the MLflow store {db} is a folder, not a sqlite file{advice}")
    if db.exists() and not db.is_file():
        raise PreflightError(f"the MLflow store {db} is not a regular file{advice}")
    if db.exists():
        try:
            with open(db, "rb") as fh:  # file-audit: 16 bytes of the store's header, to tell a sqlite file
                head = fh.read(len(SQLITE_HEADER))
        except OSError as exc:
            raise PreflightError(f"the MLflow store {db} cannot be read: {exc.strerror or exc}{advice}") from None
        if head and head != SQLITE_HEADER:
            raise PreflightError(f"the MLflow store {db} is not a sqlite database{advice}")
        if not os.access(db, os.W_OK):
            raise PreflightError(f"the MLflow store {db} cannot be written{advice}")
    problem = folder_problem(db.parent)
    if problem:
        raise PreflightError(f"the MLflow store {db}: its folder {db.parent} {problem}{advice}")


def _check_cache() -> None:
    root = env.cache_root()
    problem = folder_problem(root)
    if problem is None:
        return
    if env.value(env.CACHE):
        raise PreflightError(f"{env.CACHE}={root} {problem}; point {env.CACHE} at a folder you can write")
    raise PreflightError(f"the cache folder {root} {problem}; set {env.CACHE} to a folder you can write")


def _check_store_wait() -> None:
    from trace_dspy.store.tracking import store_wait

    try:
        store_wait()
    except ValueError as exc:
        raise PreflightError(str(exc)) from None


# Each variable with a value a command can get wrong, and its check. The data variables are checked where
# the data is resolved, which every command does before its work.
CHECKS: dict[str, Callable[[], None]] = {env.CACHE: _check_cache, env.STORE_WAIT: _check_store_wait}


def check_run_settings(tracking_uri: str | None, *, tracked: bool) -> None:
    """What a command that may log to MLflow reads: the cache folder, and, when it tracks, the store wait and
    the tracking store (``PreflightError``)."""
    check_environment(env.CACHE, *((env.STORE_WAIT,) if tracked else ()))
    if tracked:
        check_tracking_store(tracking_uri)


def check_environment(*names: str) -> None:
    """Check the named ``TRACE_DSPY_*`` variables (those a command reads) in one go: ``PreflightError`` with
    one line for the first that cannot be used."""
    for name in names:
        CHECKS[name]()


__all__ = ["CHECKS", "PreflightError", "check_environment", "check_output_file", "check_output_folder",
           "check_run_settings", "check_tracking_store", "folder_problem"]
