"""Crash-safe JSONL files for results that are written one line at a time.

Lines are appended, flushed and fsynced one by one, so a killed process loses
at most the line it was writing; the reader cuts such a torn last line off.
Final files are replaced atomically (write to a temporary file, then rename).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path

log = logging.getLogger(__name__)


class ForeignFileError(ValueError):
    """An existing file that is not an output of this command; it is left untouched."""


def read_records(path: str | os.PathLike, key: str = "id", *, accept: Callable[[dict], bool] | None = None,
                 what: str = "results") -> dict[str, dict]:
    """Records of an earlier run by ``key``, the last one per key winning.

    Nothing that was finished is dropped: a corrupt line is skipped with a
    warning that names it, and the lines after it are read as usual. A torn
    last line (the process died mid-write) is cut off so that appends stay
    valid JSONL. ``accept`` tells this command's records from anything else:
    a non-empty file with no accepted record is refused (``ForeignFileError``)
    rather than overwritten.
    """
    from trace_dspy.core.safety import JSONLimitError, load_json

    path = Path(path)
    records: dict[str, dict] = {}
    if not path.exists():
        return records
    if not path.is_file():
        raise ForeignFileError(f"{path} is not a file")
    data = path.read_bytes()
    complete = data.rfind(b"\n") + 1  # bytes up to the last newline; the rest is a torn line
    bad: list[str] = []
    for n, raw in enumerate(data[:complete].split(b"\n")[:-1], 1):
        if not raw.strip():
            continue
        try:
            rec = load_json(raw, f"{path}:{n}")
            if not isinstance(rec, dict) or key not in rec or (accept is not None and not accept(rec)):
                raise JSONLimitError(f"{path}:{n}: not a {what} record")
        except JSONLimitError as exc:
            bad.append(str(exc))
            continue
        records[str(rec[key])] = rec
    if bad and not records:
        raise ForeignFileError(f"{path} exists and is not a {what} file of this command ({bad[0]}); it was left "
                               "as it is. Choose another output, or move that file away")
    for message in bad[:5]:
        log.warning("skipping a damaged line: %s", message)
    if len(bad) > 5:
        log.warning("skipping %d more damaged lines of %s", len(bad) - 5, path)
    if complete != len(data):
        log.warning("%s: cutting off a torn last line (%d bytes; a run was stopped mid-write)", path,
                    len(data) - complete)
        with open(path, "r+b") as fh:
            fh.truncate(complete)
    return records


class AppendWriter:
    """Thread-safe, line-at-a-time durable appends."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = open(self.path, "a", encoding="utf-8")
        self._lock = threading.Lock()

    def write(self, record: dict) -> None:
        line = json.dumps(record, ensure_ascii=False) + "\n"
        with self._lock:
            self._fh.write(line)
            self._fh.flush()
            os.fsync(self._fh.fileno())

    def close(self) -> None:
        self._fh.close()

    def __enter__(self) -> AppendWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _atomic_write(path: str | os.PathLike, write: Callable) -> None:
    """Write through ``write(fh)`` to a private temporary file, fsync, then rename over ``path``."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{uuid.uuid4().hex[:6]}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write_lines(path: str | os.PathLike, records: Iterable[dict]) -> None:
    def write(fh):
        for rec in records:
            fh.write(json.dumps(rec, ensure_ascii=False) + "\n")

    _atomic_write(path, write)


def atomic_write_json(path: str | os.PathLike, data) -> None:
    def write(fh):
        json.dump(data, fh, indent=2, ensure_ascii=False, sort_keys=False)
        fh.write("\n")

    _atomic_write(path, write)
