"""Stage spans for tracing, recorded only while a caller has turned tracing on.

With tracing off (the default) :func:`span` is a no-op that never imports MLflow, so the program's
overhead is what it was. :func:`tracing` turns it on for the calling context with a :class:`Recorder`;
worker threads started through :func:`trace_dspy.core.console.with_dspy_context` inherit it.

This module decides when a span is recorded and what it holds (JSON-able inputs, outputs and attributes
only); the recorder does the recording. The MLflow one, which masks credentials in every span before
MLflow stores it, is ``trace_dspy.store.traces.tracing``: the layers above turn tracing on through it.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any, Protocol


class Recorder(Protocol):
    """What records spans: a live span has ``set_inputs``, ``set_outputs``, ``set_attributes``."""

    def start_span(self, name: str, span_type: str) -> AbstractContextManager[Any]: ...

    def start_lm_span(self, name: str, *, inputs: Any, attributes: dict[str, Any]) -> Any: ...

    def end_lm_span(self, live: Any, outputs: Any, *, usage: dict[str, Any],
                    error: BaseException | None = None) -> None: ...

    def last_trace_id(self) -> str | None: ...


_RECORDER: contextvars.ContextVar[Recorder | None] = contextvars.ContextVar("trace_dspy_tracing", default=None)


def enabled() -> bool:
    return _RECORDER.get() is not None


def recorder() -> Recorder | None:
    """The recorder of the calling context; None with tracing off."""
    return _RECORDER.get()


@contextmanager
def tracing(recorder: Recorder | None) -> Iterator[None]:
    """Record spans with ``recorder`` inside the block (None: record none); restores the previous setting
    after it."""
    token = _RECORDER.set(recorder)
    try:
        yield
    finally:
        _RECORDER.reset(token)


def last_trace_id() -> str | None:
    """The id of the trace this thread finished last (None with tracing off)."""
    current = _RECORDER.get()
    return None if current is None else current.last_trace_id()


def _plain(value: Any) -> Any:
    """A JSON-able copy: strings, numbers, lists and dicts stay; anything else becomes its text."""
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return str(value)


class _NoSpan:
    """What :func:`span` yields with tracing off: accepts the same calls and drops them."""

    def set_inputs(self, inputs: Any) -> None:
        pass

    def set_outputs(self, outputs: Any) -> None:
        pass

    def set_attributes(self, attributes: dict[str, Any]) -> None:
        pass


NO_SPAN = _NoSpan()


@contextmanager
def span(name: str, *, inputs: Any = None, span_type: str = "CHAIN", attributes: dict[str, Any] | None = None):
    """A span named ``name`` around the block (a child of the active span, else a new trace)."""
    current = _RECORDER.get()
    if current is None:
        yield NO_SPAN
        return
    with current.start_span(name, span_type) as live:
        if inputs is not None:
            live.set_inputs(_plain(inputs))
        if attributes:
            live.set_attributes(_plain(attributes))
        yield _Recorder(live)


class _Recorder:
    """The live span, with values made JSON-able on the way in."""

    def __init__(self, live):
        self.live = live

    def set_inputs(self, inputs: Any) -> None:
        self.live.set_inputs(_plain(inputs))

    def set_outputs(self, outputs: Any) -> None:
        self.live.set_outputs(_plain(outputs))

    def set_attributes(self, attributes: dict[str, Any]) -> None:
        self.live.set_attributes(_plain(attributes))


def lm_span_callback():
    """A DSPy callback that records every LM call as a span: the messages, the completion and the
    token usage. Install it with ``dspy.context(callbacks=[...])`` while tracing is on."""
    from dspy.utils.callback import BaseCallback

    class LMSpans(BaseCallback):
        def __init__(self):
            self.open: dict[str, tuple[Recorder, Any, Any, Any]] = {}

        def on_lm_start(self, call_id: str, instance: Any, inputs: dict[str, Any]) -> None:
            current = _RECORDER.get()
            if current is None:
                return
            kwargs = dict(inputs.get("kwargs") or {})
            live = current.start_lm_span(
                f"lm {getattr(instance, 'model', 'lm')}",
                inputs=_plain({"messages": inputs.get("messages"), "prompt": inputs.get("prompt")}),
                attributes=_plain({"model": getattr(instance, "model", ""),
                                   **{k: v for k, v in kwargs.items() if k in ("temperature", "max_tokens", "n")}}))
            self.open[call_id] = (current, live, instance, inputs.get("messages") or inputs.get("prompt"))

        def on_lm_end(self, call_id: str, outputs: Any, exception: Exception | None = None) -> None:
            entry = self.open.pop(call_id, None)
            if entry is None:
                return
            current, live, instance, asked = entry
            # The LM's history is shared by threads: take the newest entry for this call's own messages.
            usage = {}
            for record in reversed((getattr(instance, "history", None) or [])[-32:]):
                if asked is not None and (record.get("messages") or record.get("prompt")) == asked:
                    usage = dict(record.get("usage") or {})
                    break
            current.end_lm_span(live, _plain(outputs), usage=usage, error=exception)

    return LMSpans()


__all__ = ["NO_SPAN", "Recorder", "enabled", "last_trace_id", "lm_span_callback", "recorder", "span", "tracing"]
