"""Child processes that a bench times: one run from spawn to exit with a timeout, and competing CPU-bound
processes that are always killed; the load average.

Every child starts in a session of its own, so that a timeout kills all it started, and (on Linux) dies with
the bench process even when that is killed outright.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass


@dataclass
class Finished:
    """One process, run to its end or killed at its timeout."""

    seconds: float
    returncode: int | None
    stdout: str
    stderr: str
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out


Runner = Callable[..., Finished]  # runner(argv, *, env, timeout) -> Finished


def _die_with_parent() -> Callable[[], None] | None:
    """A preexec function that has Linux kill the child when the bench process dies, even by SIGKILL."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None

    def preexec() -> None:
        prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG

    return preexec


def _kill_group(proc: subprocess.Popen) -> None:
    """Kill a child started in a session of its own, with everything it started."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        proc.kill()


def run_process(argv: Sequence[str], *, env: dict[str, str], timeout: float) -> Finished:
    """Run ``argv`` with ``env`` in a session of its own; wall seconds from spawn to exit.

    At ``timeout`` its process group is killed; any exception (Ctrl-C included) kills it before it propagates.
    """
    started = time.perf_counter()
    proc = subprocess.Popen(list(argv), env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, errors="replace", start_new_session=True,
                            preexec_fn=_die_with_parent())
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        seconds = time.perf_counter() - started
        try:
            out, err = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:  # a descendant outside the group holds the pipes
            out, err = "", ""
        return Finished(seconds, None, out or "", err or "", timed_out=True)
    except BaseException:
        _kill_group(proc)
        proc.wait()
        raise
    return Finished(time.perf_counter() - started, proc.returncode, out, err)


@contextlib.contextmanager
def competing(count: int, argv: Sequence[str], *, settle: float = 0.0,
              started: list | None = None) -> Iterator[list[subprocess.Popen]]:
    """``count`` processes running ``argv`` for the length of the block, after ``settle`` seconds of head start.

    Every one is killed and reaped on the way out, whatever ends the block (an error, Ctrl-C); each is also
    appended to ``started`` as it starts.
    """
    procs: list[subprocess.Popen] = []
    try:
        for _ in range(count):
            procs.append(subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                          stderr=subprocess.DEVNULL, start_new_session=True,
                                          preexec_fn=_die_with_parent()))
            if started is not None:
                started.append(procs[-1])
        if procs and settle > 0:
            time.sleep(settle)
        yield procs
    finally:
        for proc in procs:
            _kill_group(proc)
        for proc in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)


def load_average() -> list[float] | None:
    """The 1, 5 and 15-minute load averages, or None where the platform has none."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        return None
