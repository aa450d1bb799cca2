"""This project's adapters: they pass each call's output constraint, and a compact chat layout for small models.

Every adapter here passes the stage signature's ``OutputConstraint`` with the LM call
(``trace_dspy.lm.constraint``), so that a grammar-constrained LM decodes the fields and types the signature
declares, however the prompt is worded.

``CompactChatAdapter``: DSPy's ChatAdapter spends many tokens on layout: a template of every field,
type notes repeated in the system and the user message. A 135M model reads
that slowly and tends to copy the template placeholders. When decoding is
grammar-constrained (the embedded engine, or a llama.cpp server with
``server_grammar``), the layout is enforced anyway, so this adapter (the compact
writer's, ``trace_dspy.compact.writer``) keeps the
instructions first, lists the fields once, and drops the per-call reminder.
Replies use the same ``[[ ## field ## ]]`` sections, so ChatAdapter's parser,
demos and fallbacks apply unchanged.
"""

from __future__ import annotations

import textwrap
import threading
from collections import Counter

import dspy

from trace_dspy.lm.constraint import constraint_kwargs

# Replies this project's adapters could not parse, counted where the parse fails (the adapter then falls back
# to DSPy's JSONAdapter, one more LM call). Keyed by the signature's name; read with parse_failures().
_PARSE_FAILURES: Counter[str] = Counter()
_PARSE_LOCK = threading.Lock()


def parse_failures() -> dict[str, int]:
    """A snapshot of the parse failures counted so far, by signature name (benchmarks read differences)."""
    with _PARSE_LOCK:
        return dict(_PARSE_FAILURES)


def counting_parse(parse, signature, completion):
    """``parse(signature, completion)``, counting a failure under the signature's name before it is raised."""
    try:
        return parse(signature, completion)
    except Exception:
        with _PARSE_LOCK:
            _PARSE_FAILURES[getattr(signature, "__name__", "signature")] += 1
        raise


class _Constraining:
    """Adds the call's output constraint (``layout``: how the reply is laid out) to the LM keywords."""

    layout = "sections"

    def constraint_layout(self, signature) -> str | None:
        """The layout to constrain this signature's reply to; None leaves the call unconstrained."""
        return self.layout

    def _constrained(self, lm, lm_kwargs, signature, inputs):
        return constraint_kwargs(lm, lm_kwargs, signature, inputs, self.constraint_layout(signature))

    def __call__(self, lm, lm_kwargs, signature, demos, inputs):
        return super().__call__(lm, self._constrained(lm, lm_kwargs, signature, inputs), signature, demos, inputs)

    async def acall(self, lm, lm_kwargs, signature, demos, inputs):
        return await super().acall(lm, self._constrained(lm, lm_kwargs, signature, inputs), signature, demos,
                                   inputs)


class ConstrainedJSONAdapter(_Constraining, dspy.JSONAdapter):
    """DSPy's JSONAdapter, passing the output constraint of its JSON layout."""

    layout = "json"


class ConstrainedChatAdapter(_Constraining, dspy.ChatAdapter):
    """DSPy's ChatAdapter, passing the output constraint; its JSON fallback passes the JSON layout's."""

    def _make_json_adapter_fallback(self):
        return ConstrainedJSONAdapter(use_native_function_calling=self.use_native_function_calling,
                                      parallel_tool_calls=self.parallel_tool_calls)


class CompactChatAdapter(ConstrainedChatAdapter):
    """The chat layout in fewer tokens: instructions first, the fields listed once, no per-call reminder."""

    def parse(self, signature, completion):
        return counting_parse(super().parse, signature, completion)

    def format_system_message(self, signature) -> str:
        instructions = textwrap.dedent(signature.instructions).strip()
        return (
            f"{instructions}\n\n"
            f"{self.format_field_description(signature)}\n"
            "Answer with each output field under its [[ ## name ## ]] header, in order, "
            "then [[ ## completed ## ]]."
        )

    def user_message_output_requirements(self, signature) -> str:
        return ""


# One shared instance: the adapter holds no per-call state.
COMPACT = CompactChatAdapter()
ADAPTERS = {"chat": ConstrainedChatAdapter, "compact": CompactChatAdapter, "json": ConstrainedJSONAdapter}


def make_adapter(name: str) -> dspy.Adapter:
    try:
        return ADAPTERS[name]()
    except KeyError:
        raise ValueError(f"unknown adapter {name!r}; choose from {', '.join(ADAPTERS)}") from None
