"""Stage spans for MLflow tracing, recorded only while a caller has turned tracing on.

With tracing off (the default) :func:`span` is a no-op that never imports MLflow, so the program's
overhead is what it was. :func:`tracing` turns it on for the calling context; worker threads started
through :func:`trace_dspy.core.console.with_dspy_context` inherit the switch.

Tracing and model logging stay separate: spans hold JSON-able inputs, outputs and attributes only.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

_ENABLED: contextvars.ContextVar[bool] = contextvars.ContextVar("trace_dspy_tracing", default=False)



def enabled() -> bool:
    return _ENABLED.get()


@contextmanager
def tracing(on: bool = True) -> Iterator[None]:
    """Record spans (``on``) or not inside the block; restores the previous setting after it."""
    token = _ENABLED.set(bool(on))
    try:
        yield
    finally:
        _ENABLED.reset(token)


def last_trace_id() -> str | None:
    """The id of the trace this thread finished last (None with tracing off)."""
    if not _ENABLED.get():
        return None
    import mlflow

    return mlflow.get_last_active_trace_id(thread_local=True)


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
    """An MLflow span named ``name`` around the block (a child of the active span, else a new trace)."""
    if not _ENABLED.get():
        yield NO_SPAN
        return
    import mlflow

    with mlflow.start_span(name=name, span_type=span_type) as live:
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
            self.open: dict[str, tuple[Any, Any, int]] = {}

        def on_lm_start(self, call_id: str, instance: Any, inputs: dict[str, Any]) -> None:
            if not _ENABLED.get():
                return
            import mlflow

            parent = mlflow.get_current_active_span()
            kwargs = dict(inputs.get("kwargs") or {})
            live = mlflow.start_span_no_context(
                name=f"lm {getattr(instance, 'model', 'lm')}", span_type="CHAT_MODEL", parent_span=parent,
                inputs=_plain({"messages": inputs.get("messages"), "prompt": inputs.get("prompt")}),
                attributes=_plain({"model": getattr(instance, "model", ""),
                                   **{k: v for k, v in kwargs.items() if k in ("temperature", "max_tokens", "n")}}))
            self.open[call_id] = (live, instance, inputs.get("messages") or inputs.get("prompt"))

        def on_lm_end(self, call_id: str, outputs: Any, exception: Exception | None = None) -> None:
            entry = self.open.pop(call_id, None)
            if entry is None:
                return
            live, instance, asked = entry
            # The LM's history is shared by threads: take the newest entry for this call's own messages.
            usage = {}
            for record in reversed((getattr(instance, "history", None) or [])[-32:]):
                if asked is not None and (record.get("messages") or record.get("prompt")) == asked:
                    usage = dict(record.get("usage") or {})
                    break
            if usage:
                live.set_attribute("mlflow.chat.tokenUsage", {
                    "input_tokens": int(usage.get("prompt_tokens") or 0),
                    "output_tokens": int(usage.get("completion_tokens") or 0),
                    "total_tokens": int(usage.get("total_tokens") or 0)})
            if exception is not None:
                live.set_status("ERROR")
                live.set_attribute("error", f"{type(exception).__name__}: {exception}"[:500])
            live.set_outputs(_plain(outputs))
            live.end()

    return LMSpans()


__all__ = ["NO_SPAN", "enabled", "last_trace_id", "lm_span_callback", "span", "tracing"]
