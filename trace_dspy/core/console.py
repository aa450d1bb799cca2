"""Console helpers the library shares with commands: progress bars, warnings given once, DSPy context for
worker threads."""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Hashable

_WARNED: set[Hashable] = set()
_WARN_LOCK = threading.Lock()


def warn_once(log: logging.Logger, key: Hashable, message: str, *args) -> bool:
    """Log ``message % args`` as a warning the first time this process sees ``key``; whether it was logged."""
    with _WARN_LOCK:
        if key in _WARNED:
            return False
        _WARNED.add(key)
    log.warning(message, *args)
    return True


def progress(iterable=None, **kwargs):
    """A tqdm bar on an interactive terminal, silent otherwise."""
    from tqdm import tqdm

    return tqdm(iterable, disable=not sys.stderr.isatty(), file=sys.stderr, **kwargs)


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
