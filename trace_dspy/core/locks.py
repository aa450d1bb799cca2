"""One writer per output file: an exclusive lock beside the file for as long as a run writes it.

Two runs that write one output at the same time lose answers: each rewrites
the file from what it read when it started. Every command that writes an
output file (``respond --input``, ``respond --engine spark``, ``chat``'s
``/save``) therefore does all of its reading and writing of that file inside
:func:`output_lock`: an exclusive, non-blocking ``flock`` on
``<output>.lock``, taken before the earlier output is read and released
after the last rename. A second run waits up to a second (long enough for a
``/save`` to finish) and is then refused with one line that names the lock
and the process that holds it; it reads and changes nothing.

The lock file exists only while a run holds it: the holder removes it before
letting go. A run that is killed (SIGKILL, a power cut) leaves it behind, but
the kernel drops its lock with the process, so the next run takes it over,
and removes it when that run ends. A symbolic link, anything that is not a
regular file, or a file that this module did not write, at the lock's path
is refused and left as it is.
"""

from __future__ import annotations

import errno
import os
import stat
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

# The lock file's first bytes; the holder's process id follows.
LOCK_MARK = b"trace-dspy output lock"
_POLL_S = 0.05
_HELD: set[str] = set()  # absolute lock paths this process holds
_HELD_GUARD = threading.Lock()


class OutputLockError(ValueError):
    """The output is being written by another run, or its lock path is unusable; nothing was read or changed."""


def lock_path(output: str | os.PathLike) -> Path:
    """The lock file of an output: ``<output>.lock``, beside it."""
    output = Path(output)
    return output.with_name(output.name + ".lock")


def holds_lock(output: str | os.PathLike) -> bool:
    """Whether this process holds the lock of ``output`` (writers check it before they touch the file)."""
    with _HELD_GUARD:
        return str(lock_path(output).absolute()) in _HELD


@contextmanager
def output_lock(output: str | os.PathLike, *, wait: float = 1.0) -> Iterator[Path]:
    """Hold the exclusive lock of ``output`` for the block; yields the lock file's path.

    Waits up to ``wait`` seconds for another holder to let go, then raises
    :class:`OutputLockError` with one line naming the lock file and, when it
    says, the process that holds it. The output's folder is created if it is
    missing (the lock file lives there).
    """
    path = lock_path(output)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputLockError(f"cannot create the folder of {output}: {exc.strerror or exc}") from None
    deadline = time.monotonic() + wait
    while True:
        fd = _try_lock(path, output)
        if fd is not None:
            break
        if time.monotonic() >= deadline:
            raise OutputLockError(_busy(path, output))
        time.sleep(_POLL_S)
    key = str(path.absolute())
    with _HELD_GUARD:
        _HELD.add(key)
    try:
        yield path
    finally:
        with _HELD_GUARD:
            _HELD.discard(key)
        _release(path, fd)


def _try_lock(path: Path, output: str | os.PathLike) -> int | None:
    """The descriptor of the locked lock file, or None while another run holds it."""
    import fcntl

    for _ in range(100):  # another holder may remove the file between our open and our lock: open it again
        try:
            # file-audit: the lock file, opened without following links or waiting, checked regular, then locked
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise OutputLockError(_unusable(path, output, exc)) from None
        try:
            opened = os.fstat(fd)
            if not stat.S_ISREG(opened.st_mode):
                raise OutputLockError(f"{path} (the lock of {output}) is not a regular file; it was left as it "
                                      "is. Move it away, or choose another output")
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                return None
            try:
                now = os.stat(path, follow_symlinks=False)
            except FileNotFoundError:
                now = None
            if now is None or (now.st_dev, now.st_ino) != (opened.st_dev, opened.st_ino):
                os.close(fd)  # its holder removed it: this descriptor locks nothing anyone else sees
                continue
            _claim(fd, path, output)
            return fd
        except BaseException:
            os.close(fd)
            raise
    raise OutputLockError(f"{path} (the lock of {output}) keeps being replaced; another run is starting and "
                          "ending on it. Try again, or choose another output")


def _claim(fd: int, path: Path, output: str | os.PathLike) -> None:
    """Write this process's id into the lock file, once it is known to be a lock (empty, or ours)."""
    held = os.pread(fd, 256, 0)
    if held and not held.startswith(LOCK_MARK):
        raise OutputLockError(f"{path} exists and is not a lock file of trace-dspy (it would be the lock of "
                              f"{output}); it was left as it is. Move it away, or choose another output")
    os.ftruncate(fd, 0)
    os.pwrite(fd, LOCK_MARK + f" pid {os.getpid()}\n".encode(), 0)


def _release(path: Path, fd: int) -> None:
    """Remove the lock file while still holding it (so nobody is left locking a removed file), then let go."""
    try:
        opened, now = os.fstat(fd), os.stat(path, follow_symlinks=False)
        if (now.st_dev, now.st_ino) == (opened.st_dev, opened.st_ino):
            path.unlink()
    except OSError:
        pass  # already gone, or the folder is read-only now: the kernel still drops the lock below
    finally:
        os.close(fd)


def _busy(path: Path, output: str | os.PathLike) -> str:
    """The one line that refuses a run whose output another run is writing."""
    holder = ""
    try:
        # file-audit: the holder's lock file, opened without following links or waiting; 256 bytes read at most
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            text = os.read(fd, 256)
        finally:
            os.close(fd)
        pid = text.removeprefix(LOCK_MARK).split()[-1] if text.startswith(LOCK_MARK) else b""
        holder = f" (process {pid.decode()})" if pid.isdigit() else ""
    except (OSError, IndexError):
        pass
    return (f"{output} is being written by another run{holder}, which holds its lock {path}; nothing was read "
            "or changed. Wait for that run to end, or choose another output")


def _unusable(path: Path, output: str | os.PathLike, exc: OSError) -> str:
    if exc.errno == errno.EISDIR:
        return f"{path} (the lock of {output}) is a folder; move it away, or choose another output"
    if exc.errno == errno.ELOOP:
        return (f"{path} (the lock of {output}) is a symbolic link; it was left as it is. Move it away, or choose "
                "another output")
    reason = os.strerror(exc.errno) if exc.errno else str(exc)
    return f"cannot create {path} (the lock of {output}): {reason}"


__all__ = ["LOCK_MARK", "OutputLockError", "holds_lock", "lock_path", "output_lock"]
