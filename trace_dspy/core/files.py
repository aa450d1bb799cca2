"""Bounded, checked reads of the files an artifact, a cache or the package brings.

A file is looked at before a byte of it is read: it must be a regular file
(a FIFO would block the reader forever, a device such as ``/dev/zero`` never
ends), a symbolic link may only lead to a regular file, and inside ``root``
when one is given (an artifact's files stay inside its folder), and its size
must be within the caller's limit. The read itself goes through the opened
descriptor, checked again, and stops one byte past the limit, so a file that
is swapped or grows after the check is still bounded.

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

import io
import json
import math
import os
import stat
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MiB = 1024 * 1024


class FileCheckError(ValueError):
    """A file that may not or cannot be read; ``path`` and ``reason`` are set, the message is ``path: reason``.
    ``missing`` is true when the file does not exist at all (a caller may say "not found" instead)."""

    def __init__(self, path: str | os.PathLike, reason: str, *, missing: bool = False):
        self.path, self.reason, self.missing = str(path), reason, missing
        super().__init__(f"{path}: {reason}")


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISDIR, "a folder"), (stat.S_ISREG, "a regular file")):
        if test(mode):
            return name
    return "not a regular file"


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def check_file(path: str | os.PathLike, *, max_bytes: int, root: str | os.PathLike | None = None) -> int:
    """The size of ``path`` once it is known to be a regular file of at most ``max_bytes``.

    With ``root``, the file (every symbolic link on its way resolved) must lie inside that folder.
    """
    path = Path(path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise FileCheckError(path, "is missing", missing=True) from None
    except OSError as exc:
        raise FileCheckError(path, f"cannot be read ({exc.strerror or exc})") from None
    real = os.path.realpath(path)
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


def read_bytes(path: str | os.PathLike, *, max_bytes: int, root: str | os.PathLike | None = None) -> bytes:
    """The bytes of a file checked by :func:`check_file`; never more than ``max_bytes``."""
    check_file(path, max_bytes=max_bytes, root=root)
    try:
        # O_NONBLOCK: should the file have been replaced by a FIFO since the check, opening it does not wait.
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise FileCheckError(path, f"cannot be read ({exc.strerror or exc})") from None
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise FileCheckError(path, f"is {_kind(st.st_mode)}, not a regular file")
        try:
            data = fh.read(max_bytes + 1)
        except OSError as exc:
            raise FileCheckError(path, f"cannot be read ({exc.strerror or exc})") from None
    if len(data) > max_bytes:
        raise FileCheckError(path, f"more than the {max_bytes:,} bytes allowed")
    return data


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


__all__ = ["ArrayLimits", "FileCheckError", "MiB", "check_file", "check_finite", "load_header_npz", "read_bytes",
           "read_header_npz", "read_npy", "read_npz", "write_header_npz"]
