"""Bounded, checked reads of every file the package reads: data, configs, artifacts, caches.

A file is looked at before a byte of it is read: it must be a regular file
(a FIFO would block the reader forever, a device such as ``/dev/zero`` never
ends), a symbolic link may only lead to a regular file, and inside ``root``
when one is given (an artifact's files stay inside its folder), and its size
must be within the caller's limit. The read itself goes through the opened
descriptor, checked again, and stops one byte past the limit, so a file that
is swapped or grows after the check is still bounded.

Every reader in the package goes through here: whole files (``read_bytes``,
``read_text``), text files a line at a time (``TextLines``: a cap on each
line and on the whole, UTF-8 errors named by their line, a spreadsheet's
byte-order mark dropped), digests (``hash_file``) and a checked handle for a
reader that needs one (``open_checked``). ``tests/core/test_file_audit.py``
fails on any other file opened in the package without a stated reason.

``.npz`` files (numpy arrays in a zip) are checked the same way, then member
by member: the uncompressed size each member declares (zipfile stops
inflating at that size, so it bounds the work), the ``.npy`` header's dtype
(numbers only, never objects) and a shape that matches the member's size;
only then is the array read. ``read_header_npz`` also reads the JSON header
that the project's weight files carry as a ``uint8`` array, the one format in
which they are all written (``write_header_npz``).

Every problem is a :class:`FileCheckError` whose message starts with the
file's path; callers re-raise it as their own error type.
"""

from __future__ import annotations

import errno
import hashlib
import io
import json
import math
import os
import stat
import zipfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

MiB = 1024 * 1024


class FileCheckError(ValueError):
    """A file that may not or cannot be read; ``path`` and ``reason`` are set, the message is ``path: reason``
    (``path:line: reason`` when ``line``, the number of the line at fault, is set).
    ``missing`` is true when the file does not exist at all (a caller may say "not found" instead)."""

    def __init__(self, path: str | os.PathLike, reason: str, *, missing: bool = False, line: int | None = None):
        self.path, self.reason, self.missing, self.line = str(path), reason, missing, line
        super().__init__(f"{path}: {reason}" if line is None else f"{path}:{line}: {reason}")


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISDIR, "a folder"), (stat.S_ISREG, "a regular file")):
        if test(mode):
            return name
    return "not a regular file"


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def check_file(path: str | os.PathLike, *, max_bytes: int, root: str | os.PathLike | None = None,
               links: bool = True) -> int:
    """The size of ``path`` once it is known to be a regular file of at most ``max_bytes``.

    With ``root``, the file (every symbolic link on its way resolved) must lie inside that folder;
    ``links=False`` refuses a symbolic link at ``path`` itself.
    """
    path = Path(path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise FileCheckError(path, "is missing", missing=True) from None
    except OSError as exc:
        raise FileCheckError(path, f"cannot be read ({exc.strerror or exc})") from None
    real = os.path.realpath(path)
    if stat.S_ISLNK(st.st_mode) and not links:
        raise FileCheckError(path, f"is a symbolic link (to {real}), not a regular file")
    if stat.S_ISLNK(st.st_mode):
        try:
            st = os.stat(path)
        except OSError:
            raise FileCheckError(path, f"is a symbolic link to {real}, which does not exist") from None
        if not stat.S_ISREG(st.st_mode):
            raise FileCheckError(path, f"is a symbolic link to {real}, which is {_kind(st.st_mode)}, "
                                       "not a regular file")
    if not stat.S_ISREG(st.st_mode):
        raise FileCheckError(path, f"is {_kind(st.st_mode)}, not a regular file")
    if root is not None and not _inside(real, os.path.realpath(root)):
        raise FileCheckError(path, f"leads to {real}, outside {root}; an artifact's files must stay in its folder")
    if st.st_size > max_bytes:
        raise FileCheckError(path, f"{st.st_size:,} bytes is more than the {max_bytes:,} allowed")
    return st.st_size


def open_checked(path: str | os.PathLike, *, max_bytes: int, root: str | os.PathLike | None = None,
                 links: bool = True) -> tuple[BinaryIO, int]:
    """(a binary handle, the size) of a file checked by :func:`check_file`; the caller closes the handle.

    The opened descriptor is checked again, so a file swapped for a FIFO, a device or a larger file after the
    check is refused too. The caller reads at most ``max_bytes`` (``size`` may grow while it reads).
    """
    check_file(path, max_bytes=max_bytes, root=root, links=links)
    # O_NONBLOCK: should the file have been replaced by a FIFO since the check, opening it does not wait.
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags if links else flags | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        raise FileCheckError(path, "is missing", missing=True) from None
    except OSError as exc:
        if exc.errno == errno.ELOOP and not links:
            raise FileCheckError(path, "is a symbolic link, not a regular file") from None
        raise FileCheckError(path, f"cannot be read ({exc.strerror or exc})") from None
    fh = os.fdopen(fd, "rb")
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise FileCheckError(path, f"is {_kind(st.st_mode)}, not a regular file")
        if st.st_size > max_bytes:
            raise FileCheckError(path, f"{st.st_size:,} bytes is more than the {max_bytes:,} allowed")
    except BaseException:
        fh.close()
        raise
    return fh, st.st_size


def _read(fh: BinaryIO, path: str | os.PathLike, size: int) -> bytes:
    try:
        return fh.read(size)
    except OSError as exc:
        raise FileCheckError(path, f"cannot be read ({exc.strerror or exc})") from None


def read_bytes(path: str | os.PathLike, *, max_bytes: int, root: str | os.PathLike | None = None,
               links: bool = True) -> bytes:
    """The bytes of a file checked by :func:`check_file`; never more than ``max_bytes``."""
    fh, _ = open_checked(path, max_bytes=max_bytes, root=root, links=links)
    with fh:
        data = _read(fh, path, max_bytes + 1)
    if len(data) > max_bytes:
        raise FileCheckError(path, f"more than the {max_bytes:,} bytes allowed")
    return data


BOM = b"\xef\xbb\xbf"
_BLOCK = 1 << 20


def decode_utf8(data: bytes, path: str | os.PathLike) -> str:
    """The bytes of a whole file as UTF-8 text, a leading byte-order mark dropped; bytes that are not UTF-8
    are a :class:`FileCheckError` naming the line they are on."""
    start = len(BOM) if data.startswith(BOM) else 0
    try:
        return data[start:].decode("utf-8")
    except UnicodeDecodeError as exc:
        line = 1 + data.count(b"\n", 0, start + exc.start)
        raise FileCheckError(path, f"not valid UTF-8 ({exc.reason})", line=line) from None


def read_text(path: str | os.PathLike, *, max_bytes: int, root: str | os.PathLike | None = None) -> str:
    """The UTF-8 text of a file checked by :func:`check_file` (see :func:`decode_utf8`)."""
    return decode_utf8(read_bytes(path, max_bytes=max_bytes, root=root), path)


def hash_file(digest, path: str | os.PathLike, *, max_bytes: int, root: str | os.PathLike | None = None) -> int:
    """Feed the bytes of a file checked by :func:`check_file` to ``digest`` (a ``hashlib`` object), a block at
    a time; returns how many there were (never more than ``max_bytes``)."""
    fh, _ = open_checked(path, max_bytes=max_bytes, root=root)
    total = 0
    with fh:
        while block := _read(fh, path, min(_BLOCK, max_bytes + 1 - total)):
            total += len(block)
            if total > max_bytes:
                raise FileCheckError(path, f"more than the {max_bytes:,} bytes allowed")
            digest.update(block)
    return total


def fingerprint_files(paths: Iterable[str | os.PathLike], *, max_bytes: int) -> str:
    """What a data set's records name it by: ``sha256:`` and the first 16 hex digits of the digest of each
    file's name and bytes, in order; each file is read by :func:`hash_file` (at most ``max_bytes``)."""
    digest = hashlib.sha256()
    for path in paths:
        digest.update(Path(path).name.encode())
        hash_file(digest, path, max_bytes=max_bytes)
    return "sha256:" + digest.hexdigest()[:16]


class TextLines:
    """The lines of a checked text file, read a block at a time: ``for number, line in lines`` (numbers from 1).

    Opening checks the file as :func:`check_file` does, so a FIFO or a device is refused at once instead of
    blocking or never ending. Each line keeps its ending; lines end at ``\\n``, and with ``universal`` (what
    the ``csv`` module expects of a file opened with ``newline=""``) at ``\\r\\n`` and a lone ``\\r`` too.
    A line longer than ``max_line_bytes``, more than ``max_bytes`` in all (a file that grows while it is
    read) and, when decoded, bytes that are not UTF-8 are a :class:`FileCheckError` naming the file and the
    line. A byte-order mark before the first line is dropped (spreadsheets save one). Use it in a ``with``
    block, which closes the file; :meth:`raw` gives the lines undecoded, :meth:`text` without numbers.
    Lines are split a block (a MiB) at a time, and the checks run on the block, so that the reader stays
    about as fast as the file objects it replaces.
    """

    def __init__(self, path: str | os.PathLike, *, max_bytes: int, max_line_bytes: int,
                 root: str | os.PathLike | None = None, universal: bool = False):
        self.path, self.max_bytes, self.max_line_bytes, self.universal = path, max_bytes, max_line_bytes, universal
        self._fh, self.size = open_checked(path, max_bytes=max_bytes, root=root)

    def __enter__(self) -> TextLines:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._fh.close()

    def __iter__(self) -> Iterator[tuple[int, str]]:
        for first, pieces in self._blocks():
            for number, piece in enumerate(pieces, first):
                yield number, self._decode(piece, number)

    def text(self) -> Iterator[str]:
        """The decoded lines without their numbers (what ``csv.reader`` takes)."""
        return (line for _, line in self)

    def raw(self) -> Iterator[tuple[int, bytes]]:
        """(number, the line's bytes, ending included), a leading byte-order mark dropped."""
        for first, pieces in self._blocks():
            yield from enumerate(pieces, first)

    def _decode(self, piece: bytes, number: int) -> str:
        try:
            return piece.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise FileCheckError(self.path, f"not valid UTF-8 ({exc.reason} at byte {exc.start})",
                                 line=number) from None

    def _blocks(self) -> Iterator[tuple[int, list[bytes]]]:
        """(the number of the first, the complete lines) of each block read; each line checked for length."""
        carry, total, first = b"", 0, 1
        while True:
            block = _read(self._fh, self.path, _BLOCK)
            total += len(block)
            if total > self.max_bytes:
                raise FileCheckError(self.path, f"more than the {self.max_bytes:,} bytes allowed")
            pieces = [carry] if carry else []
            if block:
                data = carry + block
                pieces = data.splitlines(keepends=True) if self.universal else io.BytesIO(data).readlines()
                # The last piece may go on in the next block (a "\r" may be the first half of "\r\n").
                carry = b"" if pieces[-1].endswith(b"\n") else pieces.pop()
            if pieces and max(map(len, pieces)) > self.max_line_bytes:
                raise self._too_long(first + next(i for i, p in enumerate(pieces) if len(p) > self.max_line_bytes))
            if first == 1 and pieces and pieces[0].startswith(BOM):
                pieces[0] = pieces[0][len(BOM):]
            if pieces:
                yield first, pieces
            first += len(pieces)
            if not block:
                return
            if len(carry) > self.max_line_bytes:
                raise self._too_long(first)

    def _too_long(self, number: int) -> FileCheckError:
        return FileCheckError(self.path, f"a line longer than the {self.max_line_bytes:,} bytes allowed",
                              line=number)


# ---------------------------------------------------------------- numpy files


@dataclass(frozen=True)
class ArrayLimits:
    """Bounds on an ``.npz``: its size on disk, each member's and all members' uncompressed sizes."""

    file_bytes: int = 64 * MiB
    member_bytes: int = 64 * MiB
    total_bytes: int = 256 * MiB
    members: int = 16
    # The JSON header of read_header_npz.
    header_bytes: int = 8 * MiB


# Array dtypes a weight or index file may hold: booleans, integers, floats. Never objects, text or records.
NUMERIC_KINDS = "biuf"


def _npy_header(fh, where: str) -> tuple[tuple[int, ...], bool, Any]:
    import numpy as np

    fmt = np.lib.format
    try:
        version = fmt.read_magic(fh)
        if version == (1, 0):
            shape, fortran, dtype = fmt.read_array_header_1_0(fh)
        elif version in ((2, 0), (3, 0)):
            shape, fortran, dtype = fmt.read_array_header_2_0(fh)
        else:
            raise ValueError(f"unknown .npy version {version}")
    except (ValueError, TypeError, SyntaxError, OSError, EOFError, zipfile.BadZipFile) as exc:
        raise FileCheckError(where, f"not a valid .npy array ({exc})") from None
    return tuple(int(n) for n in shape), bool(fortran), dtype


def _check_array_header(where: str, shape, dtype, payload: int, kinds: str) -> int:
    if dtype.hasobject or dtype.fields is not None or dtype.kind not in kinds:
        raise FileCheckError(where, f"holds {dtype} values; expected numbers")
    if any(n < 0 for n in shape):
        raise FileCheckError(where, f"has an impossible shape {shape}")
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes != payload:
        raise FileCheckError(where, f"declares shape {shape} of {dtype} ({nbytes:,} bytes) but holds "
                                    f"{payload:,} bytes")
    return nbytes


def _array_from(data: bytes, shape, fortran: bool, dtype):
    import numpy as np

    return np.frombuffer(data, dtype=dtype).reshape(shape, order="F" if fortran else "C").copy()


def read_npy(path: str | os.PathLike, *, max_bytes: int, root: str | os.PathLike | None = None,
             kinds: str = NUMERIC_KINDS):
    """One ``.npy`` array, its kind, size, dtype and shape checked before the data is read."""
    data = read_bytes(path, max_bytes=max_bytes, root=root)
    fh = io.BytesIO(data)
    shape, fortran, dtype = _npy_header(fh, str(path))
    offset = fh.tell()
    _check_array_header(str(path), shape, dtype, len(data) - offset, kinds)
    return _array_from(data[offset:], shape, fortran, dtype)


def read_npz(path: str | os.PathLike, names: Iterable[str], *, limits: ArrayLimits = ArrayLimits(),
             root: str | os.PathLike | None = None, kinds: str = NUMERIC_KINDS) -> dict[str, Any]:
    """The arrays ``names`` of an ``.npz``, each checked before it is inflated.

    Members other than ``names`` are bounded like the rest but not read.
    """
    data = read_bytes(path, max_bytes=limits.file_bytes, root=root)
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
        infos = archive.infolist()
    except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, OSError, EOFError) as exc:
        raise FileCheckError(path, f"not a valid .npz file ({exc})") from None
    if len(infos) > limits.members:
        raise FileCheckError(path, f"{len(infos)} members is more than the {limits.members} allowed")
    total = 0
    members: dict[str, zipfile.ZipInfo] = {}
    for info in infos:
        if info.file_size > limits.member_bytes:
            raise FileCheckError(path, f"member {info.filename!r} inflates to {info.file_size:,} bytes, more than "
                                       f"the {limits.member_bytes:,} allowed")
        total += info.file_size
        if total > limits.total_bytes:
            raise FileCheckError(path, f"its members inflate to more than the {limits.total_bytes:,} bytes allowed")
        if info.filename.endswith(".npy"):
            members[info.filename[:-4]] = info
    arrays = {}
    for name in names:
        info = members.get(name)
        if info is None:
            raise FileCheckError(path, f"has no array {name!r}")
        where = f"{path}[{name}]"
        try:
            with archive.open(info) as fh:
                shape, fortran, dtype = _npy_header(fh, where)
                offset = fh.tell()
                nbytes = _check_array_header(where, shape, dtype, info.file_size - offset, kinds)
                payload = fh.read(nbytes)
        except FileCheckError:
            raise
        except (zipfile.BadZipFile, ValueError, OSError, EOFError, NotImplementedError) as exc:
            raise FileCheckError(where, f"damaged ({type(exc).__name__}: {exc})") from None
        if len(payload) != nbytes:
            raise FileCheckError(where, "truncated")
        arrays[name] = _array_from(payload, shape, fortran, dtype)
    return arrays


def read_header_npz(path: str | os.PathLike, names: Iterable[str], *, limits: ArrayLimits = ArrayLimits(),
                    root: str | os.PathLike | None = None, header: str = "header") -> tuple[dict[str, Any], dict]:
    """(the JSON object in the ``header`` array, the arrays ``names``) of a weights file.

    The header is UTF-8 JSON stored as a 1-D ``uint8`` array; it must be an object.
    """
    from trace_dspy.core.safety import JSONLimitError, load_json

    arrays = read_npz(path, (*names, header), limits=limits, root=root)
    raw = arrays.pop(header)
    if raw.dtype.kind != "u" or raw.dtype.itemsize != 1 or raw.ndim != 1:
        raise FileCheckError(f"{path}[{header}]", f"expected bytes (uint8, one dimension), found {raw.dtype} "
                                                   f"of shape {raw.shape}")
    try:
        meta = load_json(raw.tobytes(), f"{path}[{header}]", max_bytes=limits.header_bytes)
    except JSONLimitError as exc:
        raise FileCheckError(f"{path}[{header}]", str(exc).removeprefix(f"{path}[{header}]: ")) from None
    if not isinstance(meta, dict):
        raise FileCheckError(f"{path}[{header}]", f"expected a JSON object, found {type(meta).__name__}")
    return meta, arrays


def write_header_npz(path: str | os.PathLike, header: dict[str, Any], arrays: dict[str, Any], *,
                     header_name: str = "header") -> Path:
    """Write ``arrays`` and the JSON object ``header`` (as a ``uint8`` array named ``header_name``, after the
    arrays) to a compressed ``.npz``: the format :func:`read_header_npz` reads. The file appears whole or not
    at all (written beside ``path``, then renamed)."""
    import numpy as np

    path = Path(path)
    raw = np.frombuffer(json.dumps(header, sort_keys=True).encode(), dtype=np.uint8)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as fh:
        np.savez_compressed(fh, **arrays, **{header_name: raw})
    os.replace(tmp, path)
    return path


def load_header_npz(path: str | os.PathLike, names: Iterable[str], *, limits: ArrayLimits, error: type[Exception],
                    what: str, hint: str = "", root: str | os.PathLike | None = None,
                    finite: bool = False) -> tuple[dict[str, Any], dict]:
    """:func:`read_header_npz` for a caller with its own error type: a missing file raises
    ``error("<what> not found: <path><hint>")``, any other problem ``error("<where>: damaged <what>: <reason>")``.
    ``finite``: NaN or infinite values count as damage too."""
    try:
        header, arrays = read_header_npz(path, names, limits=limits, root=root)
        if finite:
            check_finite(path, arrays)
    except FileCheckError as exc:
        if exc.missing:
            raise error(f"{what} not found: {path}{hint}") from None
        raise error(f"{exc.path}: damaged {what}: {exc.reason}") from None
    return header, arrays


def check_finite(where: str | os.PathLike, arrays: dict[str, Any]) -> None:
    """Refuse NaN or infinite values in any float array."""
    import numpy as np

    for name, array in arrays.items():
        if array.dtype.kind == "f" and not np.isfinite(array).all():
            raise FileCheckError(f"{where}[{name}]", "holds non-finite values (NaN or infinity)")


__all__ = ["ArrayLimits", "BOM", "FileCheckError", "MiB", "TextLines", "check_file", "check_finite", "decode_utf8",
           "fingerprint_files", "hash_file", "load_header_npz", "open_checked", "read_bytes", "read_header_npz",
           "read_npy", "read_npz", "read_text", "write_header_npz"]
