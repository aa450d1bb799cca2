"""Stage spans for MLflow tracing, recorded only while a caller has turned tracing on.

With tracing off (the default) :func:`span` is a no-op that never imports MLflow, so the program's
overhead is what it was. :func:`tracing` turns it on for the calling context; worker threads started
through :func:`trace_dspy.core.console.with_dspy_context` inherit the switch.

Tracing and model logging stay separate: spans hold JSON-able inputs, outputs and attributes only.
Whenever tracing is on, :func:`redact_span` masks credentials in every span before MLflow stores it.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

_ENABLED: contextvars.ContextVar[bool] = contextvars.ContextVar("trace_dspy_tracing", default=False)
_INSTALL_LOCK = threading.Lock()



def enabled() -> bool:
    return _ENABLED.get()


@contextmanager
def tracing(on: bool = True) -> Iterator[None]:
    """Record spans (``on``) or not inside the block; restores the previous setting after it."""
    if on:
        install_redaction()
    token = _ENABLED.set(bool(on))
    try:
        yield
    finally:
        _ENABLED.reset(token)


def _masked(value: Any) -> Any:
    from trace_dspy.core.safety import redact

    return redact(value, limit=None) if isinstance(value, str) else value


def redact_span(span) -> None:
    """An MLflow span processor: mask credentials in everything a span carries before it is exported.

    Its name, every attribute (inputs and outputs are JSON text in attributes), every event (an
    exception event holds the message and the stack trace) and its status message. Spans that MLflow's
    autologgers or libraries make pass through it as well as the program's own.
    """
    otel = getattr(span, "_span", None)
    if otel is None:
        return
    name = getattr(otel, "name", None)
    if isinstance(name, str) and _masked(name) != name:
        otel.update_name(_masked(name))
    for key, value in list((otel.attributes or {}).items()):
        masked = _masked(value)
        if masked != value:
            otel.set_attribute(key, masked)
    events = getattr(otel, "_events", None)
    if events:
        from opentelemetry.sdk.trace import Event

        changed = False
        cleaned = []
        for event in list(events):
            attributes = {k: _masked(v) for k, v in (event.attributes or {}).items()}
            if attributes != dict(event.attributes or {}) or _masked(event.name) != event.name:
                event = Event(_masked(event.name), attributes, event.timestamp)
                changed = True
            cleaned.append(event)
        if changed:
            from opentelemetry.sdk.util import BoundedList

            otel._events = BoundedList.from_seq(getattr(getattr(events, "_dq", None), "maxlen", None), cleaned)
    status = getattr(otel, "_status", None)
    description = getattr(status, "description", None)
    if description and _masked(description) != description:
        from opentelemetry.trace import Status

        otel._status = Status(status.status_code, _masked(description))
    if getattr(span, "parent_id", None) is None:
        _redact_trace_info(span)


def _redact_trace_info(root) -> None:
    """Mask the tags and metadata of the root span's trace (its name is a tag, taken at its start)."""
    try:
        from mlflow.tracing.trace_manager import InMemoryTraceManager

        with InMemoryTraceManager.get_instance().get_trace(root.trace_id) as trace:
            if trace is None:
                return
            for table in (trace.info.tags, trace.info.trace_metadata):
                for key, value in list(table.items()):
                    if _masked(value) != value:
                        table[key] = _masked(value)
    except ImportError:  # an MLflow without the in-memory trace manager: span contents are masked still
        return


def install_redaction() -> None:
    """Make :func:`redact_span` one of MLflow's span processors (once per process), so that no span of
    a trace this program records, or lets an autologger record, is stored with a credential in it."""
    import mlflow.tracing
    from mlflow.tracing.config import get_config

    with _INSTALL_LOCK:
        current = list(get_config().span_processors or [])
        if redact_span not in current:
            mlflow.tracing.configure(span_processors=[*current, redact_span])


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

    install_redaction()  # again: a change of tracking URI resets MLflow's span processors
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

            install_redaction()
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
                from trace_dspy.core.safety import redact

                live.set_attribute("error", redact(f"{type(exception).__name__}: {exception}", limit=500))
            live.set_outputs(_plain(outputs))
            live.end()

    return LMSpans()


__all__ = ["NO_SPAN", "enabled", "install_redaction", "last_trace_id", "lm_span_callback", "redact_span", "span",
           "tracing"]
