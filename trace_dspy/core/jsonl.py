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
from typing import Any

log = logging.getLogger(__name__)


# The largest results file read back (a run's rows, each a few KB); past it the file is refused, not read.
MAX_RECORDS_BYTES = 1024 * 1024 * 1024


class ForeignFileError(ValueError):
    """An existing file that is not an output of this command; it is left untouched."""


def read_records(path: str | os.PathLike, key: str = "id", *, accept: Callable[[dict], bool] | None = None,
                 what: str = "results", strict: bool = False) -> dict[str, dict]:
    """Records of an earlier run by ``key``, the last one per key winning.

    Nothing that was finished is dropped: a corrupt line is skipped with a
    warning that names it, and the lines after it are read as usual. A torn
    last line (the process died mid-write) is cut off so that appends stay
    valid JSONL. ``accept`` tells this command's records from anything else:
    a non-empty file with no accepted record is refused (``ForeignFileError``)
    rather than overwritten.

    ``strict``: one readable JSON line that ``accept`` refuses is enough to
    refuse the file, so that a file mixing a user's records with a few
    records of ours is never taken for ours. Only lines that are not JSON
    at all count as damage then. The last line without its newline is
    read as a record if it is one (ours: kept, the newline added; another
    kind: the file is refused); it is cut off as torn only when it is not
    JSON and the rest of the file is this command's, or when it is all the
    file holds and begins as this command's records do (``{"<key>": ``).
    Nothing is changed in a file that is refused.
    """
    path = Path(path)
    if not path.exists():
        return {}
    if not path.is_file():
        raise ForeignFileError(f"{path} is not a file")
    data = _read_checked(path, links=True)
    complete = data.rfind(b"\n") + 1  # bytes up to the last newline; the rest is a torn line
    ours = _accepts(key, accept)
    records, bad = _complete_lines(path, data[:complete], key, ours, what, strict)
    newline_missing = False
    if strict and complete != len(data):
        newline_missing = _last_line(path, data, complete, records, not bad, key, ours, what)
    if bad and not records:
        raise _foreign(path, what, bad[0])
    for message in bad[:5]:
        log.warning("skipping a damaged line: %s", message)
    if len(bad) > 5:
        log.warning("skipping %d more damaged lines of %s", len(bad) - 5, path)
    if newline_missing:  # a complete last record, only its newline missing: appends go after it
        with open(path, "ab") as fh:  # file-audit: appends the newline the results file just read lacks
            fh.write(b"\n")
    elif complete != len(data):
        log.warning("%s: cutting off a torn last line (%d bytes; a run was stopped mid-write)", path,
                    len(data) - complete)
        with open(path, "r+b") as fh:  # file-audit: cuts the torn last line off the results file just read
            fh.truncate(complete)
    return records


def _accepts(key: str, accept: Callable[[dict], bool] | None) -> Callable[[Any], bool]:
    """Whether a decoded line is one of this command's records."""
    return lambda rec: isinstance(rec, dict) and key in rec and (accept is None or accept(rec))


def _complete_lines(path: Path, data: bytes, key: str, ours: Callable[[Any], bool], what: str,
                    strict: bool) -> tuple[dict[str, dict], list[str]]:
    """(the records by key, a message per damaged line) of the newline-terminated lines ``data``."""
    from trace_dspy.core.safety import JSONLimitError, load_json

    records: dict[str, dict] = {}
    bad: list[str] = []
    for n, raw in enumerate(data.split(b"\n")[:-1], 1):
        if not raw.strip():
            continue
        try:
            rec = load_json(raw, f"{path}:{n}")
        except JSONLimitError as exc:
            bad.append(str(exc))
            continue
        if not ours(rec):
            if strict:
                raise _foreign(path, what, f"line {n} is not one of its records")
            bad.append(f"{path}:{n}: not a {what} record")
            continue
        records[str(rec[key])] = rec
    return records, bad


def _last_line(path: Path, data: bytes, complete: int, records: dict[str, dict], undamaged: bool, key: str,
               ours: Callable[[Any], bool], what: str) -> bool:
    """Read the last line, which has no newline, into ``records`` when it is one of ours (then True: only
    its newline is missing); False when it is torn and the file is ours. Refuses a file that is not."""
    from trace_dspy.core.safety import JSONLimitError, load_json

    tail, last = data[complete:], data.count(b"\n", 0, complete) + 1
    try:
        rec = load_json(tail, f"{path}:{last}")
    except JSONLimitError:  # a torn line: cut off by the caller, if the file is ours
        if not records and undamaged and not tail.lstrip().startswith(b'{"%s": ' % key.encode()):
            raise _foreign(path, what, "its only line is not JSON") from None
        return False
    if not ours(rec):
        raise _foreign(path, what, "its last line is not one of its records")
    records[str(rec[key])] = rec
    return True


def _foreign(path: Path, what: str, why: str) -> ForeignFileError:
    return ForeignFileError(f"{path} exists and is not a {what} file of this command ({why}); it was left as it "
                            "is. Choose another output, or move that file away")


class AppendWriter:
    """Thread-safe, line-at-a-time durable appends."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = open(self.path, "a", encoding="utf-8")  # file-audit: appends rows; nothing is read
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


def _atomic_write(path: str | os.PathLike, write: Callable, *, binary: bool = False) -> None:
    """Write through ``write(fh)`` to a private temporary file, fsync, then rename over ``path``."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{uuid.uuid4().hex[:6]}.tmp")
    try:
        # file-audit: writes a new private temporary file, renamed over the target once complete
        with (open(tmp, "wb") if binary else open(tmp, "w", encoding="utf-8")) as fh:
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


def atomic_add_records(path: str | os.PathLike, records: Iterable[dict], *,
                       ignore: Iterable[str] = ()) -> int:
    """Add to ``path`` the records it does not hold yet; return how many were added.

    The file is rewritten whole through a temporary file and a rename, its
    earlier bytes kept as they were, so it is either as before or complete.
    A record counts as held when an existing line parses to the same object,
    fields named in ``ignore`` left out of the comparison; adding the same
    records twice (a rerun after a crash) adds nothing the second time.
    Lines that are not JSON are kept and compare with nothing. A symbolic link
    at ``path`` is refused (``ForeignFileError``): its target's lines are never
    read into the new file.
    """
    path = Path(path)
    data = _read_checked(path, links=False)
    ignore = frozenset(ignore)

    def same(rec) -> str:
        if isinstance(rec, dict):
            rec = {k: v for k, v in rec.items() if k not in ignore}
        return json.dumps(rec, ensure_ascii=False, sort_keys=True)

    held = set()
    for raw in data.splitlines():
        try:
            held.add(same(json.loads(raw)))
        except (ValueError, RecursionError):
            continue
    new = []
    for rec in records:
        if same(rec) not in held:
            held.add(same(rec))
            new.append(rec)
    if not new:
        return 0

    def write(fh):
        fh.write(data)
        if data and not data.endswith(b"\n"):
            fh.write(b"\n")
        for rec in new:
            fh.write((json.dumps(rec, ensure_ascii=False) + "\n").encode("utf-8", "surrogatepass"))

    _atomic_write(path, write, binary=True)
    return len(new)


def _read_checked(path: Path, *, links: bool) -> bytes:
    """The bytes of ``path`` read through :func:`trace_dspy.core.files.read_bytes` (a regular file of at most
    ``MAX_RECORDS_BYTES``; ``links=False``: not a symbolic link); none when it is missing. Any other file is
    a ``ForeignFileError``, and is left as it is."""
    from trace_dspy.core.files import FileCheckError, read_bytes

    try:
        return read_bytes(path, max_bytes=MAX_RECORDS_BYTES, links=links)
    except FileCheckError as exc:
        if exc.missing:
            return b""
        raise ForeignFileError(f"{exc}; it was left as it is") from None


def atomic_write_json(path: str | os.PathLike, data) -> None:
    def write(fh):
        json.dump(data, fh, indent=2, ensure_ascii=False, sort_keys=False)
        fh.write("\n")

    _atomic_write(path, write)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` as UTF-8, whole or not at all (a temporary file renamed over ``path``)."""
    _atomic_write(path, lambda fh: fh.write(text))
