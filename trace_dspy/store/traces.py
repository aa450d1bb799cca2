"""MLflow's side of the program's traces: recording trace_dspy.core.spans as MLflow spans, and masking
credentials in every span before MLflow stores it. Nothing here runs at import; MLflow is imported lazily.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from contextlib import contextmanager
from typing import Any

from trace_dspy.core.safety import redact


_INSTALL_LOCK = threading.Lock()


def _masked(value: Any) -> Any:
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


class MlflowRecorder:
    """Records the spans of trace_dspy.core.spans as MLflow traces."""

    @contextmanager
    def start_span(self, name: str, span_type: str):
        """An MLflow span around the block: a child of the active span, else a new trace."""
        import mlflow

        install_redaction()  # again: a change of tracking URI resets MLflow's span processors
        with mlflow.start_span(name=name, span_type=span_type) as live:
            yield live

    def start_lm_span(self, name: str, *, inputs: Any, attributes: dict[str, Any]):
        """A chat-model span, a child of the active span, for an LM call that ends in :meth:`end_lm_span`."""
        import mlflow

        install_redaction()
        parent = mlflow.get_current_active_span()
        return mlflow.start_span_no_context(name=name, span_type="CHAT_MODEL", parent_span=parent, inputs=inputs,
                                            attributes=attributes)

    def end_lm_span(self, live, outputs: Any, *, usage: Mapping[str, Any], error: BaseException | None = None) -> None:
        """End a span of :meth:`start_lm_span` with the LM's outputs, its token usage and its error, if any."""
        if usage:
            live.set_attribute("mlflow.chat.tokenUsage", {
                "input_tokens": int(usage.get("prompt_tokens") or 0),
                "output_tokens": int(usage.get("completion_tokens") or 0),
                "total_tokens": int(usage.get("total_tokens") or 0)})
        if error is not None:
            live.set_status("ERROR")
            live.set_attribute("error", redact(f"{type(error).__name__}: {error}", limit=500))
        live.set_outputs(outputs)
        live.end()

    def last_trace_id(self) -> str | None:
        """The id of the trace this thread finished last."""
        import mlflow

        return mlflow.get_last_active_trace_id(thread_local=True)


MLFLOW_RECORDER = MlflowRecorder()


@contextmanager
def tracing(on: bool = True):
    """Record the program's spans (trace_dspy.core.spans) as MLflow traces inside the block when ``on``,
    each span's credentials masked; with ``on`` false, record none there."""
    from trace_dspy.core import spans

    if on:
        install_redaction()
    with spans.tracing(MLFLOW_RECORDER if on else None):
        yield


def flush_traces() -> None:
    """Wait until MLflow has stored the traces it logs in the background."""
    import mlflow

    mlflow.flush_trace_async_logging()
