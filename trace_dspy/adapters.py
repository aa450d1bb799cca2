"""A compact chat adapter for small local models.

DSPy's ChatAdapter spends many tokens on layout: a template of every field,
type notes repeated in the system and the user message. A 135M model reads
that slowly and tends to copy the template placeholders. When decoding is
grammar-constrained (the embedded engine, or a llama.cpp server with
``server_grammar``), the layout is enforced anyway, so this adapter keeps the
instructions first, lists the fields once, and drops the per-call reminder.
Replies use the same ``[[ ## field ## ]]`` sections, so ChatAdapter's parser,
demos and fallbacks apply unchanged.
"""

from __future__ import annotations

import textwrap

import dspy


class CompactChatAdapter(dspy.ChatAdapter):
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


_COMPACT = CompactChatAdapter()
ADAPTERS = {"chat": dspy.ChatAdapter, "compact": CompactChatAdapter, "json": dspy.JSONAdapter}


def make_adapter(name: str) -> dspy.Adapter:
    try:
        return ADAPTERS[name]()
    except KeyError:
        raise ValueError(f"unknown adapter {name!r}; choose from {', '.join(ADAPTERS)}") from None


def is_constrained(lm) -> bool:
    """Does this LM enforce the reply layout with a grammar?"""
    from trace_dspy.lms import GrammarLM
    from trace_dspy.local_lm import LlamaEngine

    if isinstance(lm, GrammarLM):
        return True
    engine = getattr(lm, "engine", None)
    return isinstance(engine, LlamaEngine) and engine.constrained


def choose_adapter(choice: str, lm) -> dspy.Adapter | None:
    """The adapter for a stage call; None keeps whatever dspy.settings holds."""
    if choice == "auto":
        return _COMPACT if lm is not None and is_constrained(lm) else None
    return make_adapter(choice)
