"""DSPy's "LM response was truncated" warning, kept out of the program's own calls.

The reply stage writes under a token budget and keeps the first sentences of what comes back, so a reply
cut at its cap is expected; DSPy logs a WARNING on ``dspy.clients.lm`` for every such call, which buried the
replies under repeated warnings, from ``respond`` and from a program called in Python alike. A TraceProgram
call runs inside :func:`quiet_truncation`, which drops that one message while the call is under way (in its
own thread or task: other code's LM calls keep their warnings); :func:`show_truncation_warnings` lets it
through again (``respond -v``).
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
from collections.abc import Iterator

LOGGER = "dspy.clients.lm"
MESSAGE_PREFIX = "LM response was truncated"

_inside = contextvars.ContextVar("trace_dspy_quiet_truncation", default=False)
_shown = [False]


class _DropTruncation(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return _shown[0] or not _inside.get() or not str(record.getMessage()).startswith(MESSAGE_PREFIX)


_FILTER = _DropTruncation()


@contextlib.contextmanager
def quiet_truncation() -> Iterator[None]:
    """Drop DSPy's truncation warnings logged inside the block (by this thread or task)."""
    logger = logging.getLogger(LOGGER)
    if _FILTER not in logger.filters:
        logger.addFilter(_FILTER)
    token = _inside.set(True)
    try:
        yield
    finally:
        _inside.reset(token)


def show_truncation_warnings(show: bool) -> None:
    """Let the truncation warnings through (True) or drop them inside program calls (False, the default)."""
    _shown[0] = bool(show)
