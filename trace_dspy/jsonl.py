"""Crash-safe JSONL files for results that are written one line at a time.

Lines are appended, flushed and fsynced one by one, so a killed process loses
at most the line it was writing; the reader cuts such a torn last line off.
Final files are replaced atomically (write to a temporary file, then rename).
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterable
from pathlib import Path


def read_records(path: str | os.PathLike, key: str = "id") -> dict[str, dict]:
    """Records of an earlier run by ``key``, the last one per key winning.

    A torn last line (the process died mid-write) is truncated away so that
    appends stay valid JSONL.
    """
    path = Path(path)
    records: dict[str, dict] = {}
    if not path.exists():
        return records
    good_bytes = 0
    with open(path, "rb") as fh:
        for raw in fh:
            try:
                if not raw.endswith(b"\n"):
                    raise ValueError("torn line")
                rec = json.loads(raw)
                records[str(rec[key])] = rec
            except (ValueError, KeyError, TypeError):
                break
            good_bytes += len(raw)
    if good_bytes != path.stat().st_size:
        with open(path, "r+b") as fh:
            fh.truncate(good_bytes)
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


def atomic_write_lines(path: str | os.PathLike, records: Iterable[dict]) -> None:
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        for rec in records:
            fh.write(json.dumps(rec, ensure_ascii=False) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def atomic_write_json(path: str | os.PathLike, data) -> None:
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=2, ensure_ascii=False, sort_keys=False)
        fh.write("\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
