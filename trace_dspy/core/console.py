"""Console helpers the library shares with commands: progress on stderr, narrative lines, results on stdout,
warnings given once, DSPy context for worker threads.

Every line a command shows goes through this module (``out``, ``out_json``, ``say``, ``Progress``, the status
line; log records and Python warnings after ``escape_logs_and_warnings``), and each escapes what it writes
with ``terminal_safe`` or ``json_safe_dumps``: text from an artifact, a model or a user cannot drive the
terminal, whoever prints it. The only raw control sequence written is the status line's own "go to the start
of the line and clear it". ``tests/core/test_terminal_safe.py`` fails on a write to stdout or stderr anywhere
else in the package.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Hashable, Iterable, Iterator
from typing import Any, TextIO

from trace_dspy.core.safety import json_safe_dumps, terminal_safe

_WARNED: set[Hashable] = set()
_WARN_LOCK = threading.Lock()

# Off a terminal, a running phase prints a plain line at least this often (seconds); tests shorten it.
INTERVAL = 5.0
# Phases now running, innermost last: off a terminal only the innermost one prints.
_ACTIVE: list[Progress] = []
_STATE_LOCK = threading.Lock()
_LAST_OUTPUT = [0.0]  # time.monotonic() of the last line a phase or say() wrote


def warn_once(log: logging.Logger, key: Hashable, message: str, *args) -> bool:
    """Log ``message % args`` as a warning the first time this process sees ``key``; whether it was logged."""
    with _WARN_LOCK:
        if key in _WARNED:
            return False
        _WARNED.add(key)
    log.warning(message, *args)
    return True


def _isatty(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


class Progress:
    """One phase's progress on stderr, for as long as the phase runs.

    On a terminal it is a tqdm bar (a counter when ``total`` is known, else
    the elapsed time). Elsewhere (a pipe, a file, a log) it is a plain line
    at least every ``interval`` seconds, ``plans: 7/24 dialogues, 41 s``,
    written by a background timer, so a phase that counts nothing (``unit``
    None: an L-BFGS fit, an upload) still says that it is alive. Phases nest:
    off a terminal only the innermost running one writes. Use it as a context
    manager (or iterate it): the timer stops when the block ends, by return or
    by raise, and a phase that wrote lines writes one more that says how it
    ended. Nothing goes to stdout.
    """

    def __init__(self, desc: str, total: int | None = None, unit: str | None = "items", *,
                 iterable: Iterable | None = None, interval: float | None = None, stream: TextIO | None = None,
                 terminal: bool | None = None, leave: bool | None = None):
        if total is None and iterable is not None and hasattr(iterable, "__len__"):
            total = len(iterable)  # type: ignore[arg-type]
        self.desc, self.total, self.unit, self.n, self.detail = terminal_safe(desc), total, unit, 0, ""
        self.lines = 0  # plain lines written
        self._iterable = iterable
        self._interval = INTERVAL if interval is None else interval
        self._stream = stream if stream is not None else sys.stderr
        self._terminal = _isatty(self._stream) if terminal is None else terminal
        self._leave = (unit is not None) if leave is None else leave  # heartbeat bars vanish when done
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._bar: Any = None
        self._started = 0.0

    # ------------------------------------------------------------------ lifecycle

    def __enter__(self) -> Progress:
        self._started = time.monotonic()
        if self._terminal:
            from tqdm.std import tqdm  # the plain class: this Progress has decided where it draws

            fmt = None if self.unit is not None else "{desc}: {elapsed}{postfix}"
            self._bar = tqdm(total=self.total, desc=self.desc, file=self._stream, unit=self.unit or "it",
                             bar_format=fmt, leave=self._leave)
        with _STATE_LOCK:
            _ACTIVE.append(self)
        self._thread = threading.Thread(target=self._tick, name=f"progress: {self.desc}", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        self.close(error=exc_type)
        return False

    def __iter__(self) -> Iterator:
        if self._iterable is None:
            raise TypeError("this Progress was made without an iterable")
        with self:
            yield from self.track(self._iterable)

    def track(self, items: Iterable) -> Iterator:
        """``items``, one ``update`` after each (inside the ``with`` block, which closes the phase)."""
        for item in items:
            yield item
            self.update(1)

    def close(self, error: type[BaseException] | None = None) -> None:
        """Stop the timer (waiting for it) and close the bar; idempotent."""
        if self._stop.is_set():
            return
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        with _STATE_LOCK:
            if self in _ACTIVE:
                _ACTIVE.remove(self)
        if self._bar is not None:
            self._bar.close()
        elif self.lines:
            failed = error is not None and not issubclass(error, GeneratorExit)  # GeneratorExit: a loop left early
            ended = f"stopped ({error.__name__})" if failed else "done"
            self._write(self._line(f"{ended} after {self.elapsed():.0f} s"))

    # ------------------------------------------------------------------ reporting

    def update(self, n: int = 1) -> None:
        """``n`` more items done."""
        with self._lock:
            self.n += n
            if self._bar is not None:
                self._bar.update(n)

    def note(self, detail: str) -> None:
        """What the phase is doing now, shown beside the count (``registering the model``)."""
        self.detail = terminal_safe(detail)
        if self._bar is not None:
            self._bar.set_postfix_str(self.detail, refresh=False)

    def elapsed(self) -> float:
        return time.monotonic() - self._started if self._started else 0.0

    def line(self) -> str:
        """The plain line: ``plans: 7/24 dialogues, 41 s``."""
        return self._line(f"{self.elapsed():.0f} s")

    def _line(self, ending: str) -> str:
        parts = []
        if self.unit is not None:
            parts.append(f"{self.n}/{self.total} {self.unit}" if self.total is not None else f"{self.n} {self.unit}")
        if self.detail:
            parts.append(self.detail)
        return f"{self.desc}: " + ", ".join([*parts, ending])

    def _write(self, text: str) -> None:
        self.lines += 1
        _output(text, self._stream)

    def _tick(self) -> None:
        """The background timer: refresh the bar, or write a line when the innermost phase and nothing was
        written for ``interval`` seconds."""
        step = max(0.01, min(1.0, self._interval / 5))
        while not self._stop.wait(step):
            if self._bar is not None:
                with self._lock:
                    self._bar.refresh()
                continue
            with _STATE_LOCK:
                innermost = bool(_ACTIVE) and _ACTIVE[-1] is self
                due = time.monotonic() - max(_LAST_OUTPUT[0], self._started) >= self._interval
            if innermost and due and not self._stop.is_set():
                self._write(self.line())


def _output(text: str, stream: TextIO) -> None:
    """Write one line to ``stream`` beside any bar on it, control characters escaped, and note the time."""
    text = terminal_safe(text)
    with _STATE_LOCK:
        bars = any(p._bar is not None for p in _ACTIVE)
        _LAST_OUTPUT[0] = time.monotonic()
    if bars:
        from tqdm.std import tqdm

        tqdm.write(text, file=stream)
    else:
        print(text, file=stream, flush=True)


def say(message: str, stream: TextIO | None = None) -> None:
    """One line of a command's account of what it does, on stderr (above any progress bar)."""
    _output(message, stream if stream is not None else sys.stderr)


def out(text: str = "", stream: TextIO | None = None) -> None:
    """A command's result (a reply, a table, a path) on stdout, control characters escaped."""
    _output(text, stream if stream is not None else sys.stdout)


def out_json(value: Any, **options: Any) -> None:
    """``value`` as JSON on stdout (``json_safe_dumps``: controls and bidi controls as ``\\uXXXX``)."""
    out(json_safe_dumps(value, **options))


# Back to the start of the line, and clear it: how a self-overwriting status line redraws itself.
_CLEAR_LINE = "\r\x1b[K"


def status_line(text: str, stream: TextIO) -> None:
    """Replace the status line on ``stream`` (a terminal) with ``text``, control characters escaped."""
    stream.write(_CLEAR_LINE + terminal_safe(text))
    stream.flush()


def clear_status_line(stream: TextIO) -> None:
    """Erase the status line on ``stream``."""
    stream.write(_CLEAR_LINE)
    stream.flush()


class EscapedLogRecord(logging.LogRecord):
    """A log record whose message and traceback show control characters as escapes, whichever handler and
    formatter (the root's, DSPy's, MLflow's own) write it: a logged model reply cannot drive the terminal."""

    def getMessage(self) -> str:
        return terminal_safe(super().getMessage())

    @property
    def exc_text(self) -> str | None:  # the formatted traceback, which formatters cache here
        return self.__dict__.get("_exc_text")

    @exc_text.setter
    def exc_text(self, value: str | None) -> None:
        self.__dict__["_exc_text"] = None if value is None else terminal_safe(value)


def escape_logs_and_warnings() -> None:
    """Make every log line and Python warning from now on escape control characters: a logged model reply, or a
    warning that quotes an artifact, cannot drive the terminal. (A log record factory someone else installed
    is left as it is.)"""
    import warnings

    if logging.getLogRecordFactory() is logging.LogRecord:
        logging.setLogRecordFactory(EscapedLogRecord)
    if not getattr(warnings.showwarning, "escapes", False):
        def show(message, category, filename, lineno, file=None, line=None) -> None:
            text = warnings.formatwarning(message, category, filename, lineno, line)
            _output(text.rstrip("\n"), file if file is not None else sys.stderr)

        show.escapes = True  # type: ignore[attr-defined]
        warnings.showwarning = show


def progress(iterable: Iterable | None = None, *, desc: str = "", total: int | None = None,
             unit: str | None = "items", **options) -> Progress:
    """A :class:`Progress` for ``desc`` (over ``iterable``, when given): a bar on a terminal, plain lines
    at least every ``INTERVAL`` seconds elsewhere."""
    return Progress(desc, total=total, unit=unit, iterable=iterable, **options)


def heartbeat(desc: str, **options) -> Progress:
    """A :class:`Progress` for a phase that cannot count its items: ``emotion prior: 41 s`` every
    ``INTERVAL`` seconds off a terminal, the elapsed time on one."""
    return Progress(desc, unit=None, **options)


def counting_dspy_calls(phase: Progress):
    """A ``dspy.context`` in which every LM call (``N LM calls`` in ``phase``'s detail) and every finished
    ``dspy.Evaluate`` (``phase.update``) is reported: how the loops inside DSPy's optimizers show progress.
    Earlier callbacks (MLflow's autolog, span recorders) stay."""
    import dspy
    from dspy.utils.callback import BaseCallback

    class Counting(BaseCallback):
        def __init__(self):
            self.calls = 0
            self.lock = threading.Lock()

        def on_lm_end(self, call_id, outputs, exception=None):
            with self.lock:
                self.calls += 1
                calls = self.calls
            phase.note(f"{calls} LM calls")

        def on_evaluate_end(self, call_id, outputs, exception=None):
            phase.update(1)

    return dspy.context(callbacks=[*(dspy.settings.config.get("callbacks") or []), Counting()])


def with_dspy_context(fn):
    """Wrap ``fn`` so that worker threads see the caller's DSPy LM, adapter and callbacks, and its
    span recorder (trace_dspy.core.spans).

    Threads of a plain ThreadPoolExecutor start from the global settings, not
    from the caller's ``dspy.context``.
    """
    import dspy

    from trace_dspy.core import spans

    # The LM and adapter, plus an active usage tracker so that LM calls made in
    # the workers are counted by the caller (e.g. the compile bench).
    overrides = {k: v for k, v in dspy.settings.config.items()
                 if k in ("lm", "adapter", "callbacks") or (k == "usage_tracker" and v is not None)}
    recorder = spans.recorder()

    def run(*args, **kwargs):
        with dspy.context(**overrides), spans.tracing(recorder):
            return fn(*args, **kwargs)

    return run
