"""How many threads llama.cpp gets for one call: all it may have, or only the cores other processes leave free.

llama.cpp's worker threads meet at a barrier after every layer. When the machine is busy, a thread that
the scheduler has parked holds up the others, so two threads on two contended cores can be slower than one.
The ``adaptive`` policy measures how much CPU the rest of the machine used since the previous call (from
``/proc/stat``, less this process's own time) and gives the next call only the cores left free (at least
one, at most ``n_threads``). ``fixed`` always uses ``n_threads``. Where ``/proc/stat`` cannot be read (not
Linux), ``adaptive`` falls back to the load average.
"""

from __future__ import annotations

import os
import threading
import time

POLICIES = ("adaptive", "fixed")
DEFAULT_POLICY = "adaptive"
# Back-to-back calls reuse the last estimate rather than measure a window this short (seconds).
_MIN_WINDOW = 0.05


def default_thread_count() -> int:
    """The engine's thread count when none is configured: every core, at most four."""
    return min(4, os.cpu_count() or 1)


def _busy_seconds() -> float | None:
    """CPU seconds all processes have spent busy since boot (every core), or None where unknown."""
    try:
        # Not through trace_dspy.core.files: procfs reports a size of 0 for a file it makes up on each read, so
        # no size check applies; the path is the kernel's own, never a user's, and one bounded line is read.
        with open("/proc/stat", encoding="ascii") as fh:  # file-audit: the kernel's /proc/stat, one bounded line
            fields = fh.readline(4096).split()[1:]
    except OSError:
        return None
    ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    values = [int(v) for v in fields[:8]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
    return (sum(values) - idle) / ticks


def _own_seconds() -> float:
    times = os.times()
    return times.user + times.system


class ThreadPolicy:
    """Chooses the thread count of each call (thread-safe)."""

    def __init__(self, policy: str, n_threads: int, cores: int | None = None):
        if policy not in POLICIES:
            raise ValueError(f"unknown thread policy {policy!r}; expected one of {', '.join(POLICIES)}")
        self.policy = policy
        self.n_threads = max(1, int(n_threads))
        if cores is None:
            cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        self.cores = int(cores)
        self._lock = threading.Lock()
        # (wall, busy, own) at the last sample; own time (every thread of this process) is not the others'
        self._mark: tuple[float, float, float] | None = None
        self._others = 0.0  # cores the other processes used in the last window

    def _sample(self) -> tuple[float, float, float] | None:
        busy = _busy_seconds()
        return None if busy is None else (time.monotonic(), busy, _own_seconds())

    def others(self) -> float:
        """Cores the rest of the machine used lately (the load average where /proc/stat is not available)."""
        with self._lock:
            now = self._sample()
            if now is None:
                return max(0.0, os.getloadavg()[0] - 1.0) if hasattr(os, "getloadavg") else 0.0
            first = self._mark is None
            if first:  # first call: a short window of its own
                self._mark = now
                time.sleep(_MIN_WINDOW)
                now = self._sample()
            wall = now[0] - self._mark[0]
            if wall >= _MIN_WINDOW or (first and wall > 0):
                used = (now[1] - self._mark[1]) - (now[2] - self._mark[2])
                self._others = max(0.0, used / wall)
                self._mark = now
            return self._others

    def threads(self) -> int:
        """Threads for the next call."""
        if self.policy == "fixed":
            return self.n_threads
        free = self.cores - self.others()
        return max(1, min(self.n_threads, int(free + 0.5)))
