"""Reading a rendered DSPy prompt: its output fields and layout, and the input sections of its user message.

One parser for every component that looks inside prompts: the scripted test LMs, and the grammar of a call
that carries no output constraint (``trace_dspy.lm.grammar.prompt_constraint``: DSPy's own modules calling
through its stock adapters; this project's adapters pass the constraint with the call). The adapters it knows:

- ``chat``: DSPy's ChatAdapter (``[[ ## field ## ]]`` sections, ``All interactions will be structured...``);
- ``compact``: this project's CompactChatAdapter (the same sections, ``Answer with each output field...``);
- ``json``: DSPy's JSONAdapter (``Outputs will be a JSON object...``);
- any other prompt (the chat-native reply layout, a plain question) has no output fields.
"""

from __future__ import annotations

import re

# The block that lists output fields ends where each adapter's closing sentence starts.
_OUTPUTS = re.compile(r"Your output fields are:\n(.*?)\n(?:All interactions|Outputs will be|Answer with)", re.DOTALL)
_FIELD = re.compile(r"^\d+\. `(\w+)` \((.+?)\)(?::|$)", re.MULTILINE)
# An input section runs to the next section header, to the closing "Respond with ..." line, or to the end.
# An empty value at the very end (the compact layout has no closing line) leaves the header with no line break.
_SECTION = re.compile(r"\[\[ ## (\w+) ## \]\](?:\n|\Z)(.*?)(?=\n\n\[\[ ## |\n\nRespond with |\Z)", re.DOTALL)
CHAT_MARKER = "[[ ## completed ## ]]"
JSON_MARKER = "Outputs will be a JSON object"


def output_fields(system: str) -> list[tuple[str, str]]:
    """(name, type) of each output field the system message asks for, in order; empty when it lists none."""
    block = _OUTPUTS.search(system)
    return [(name, kind.strip()) for name, kind in _FIELD.findall(block.group(1))] if block else []


def output_names(system: str) -> tuple[str, ...]:
    return tuple(name for name, _ in output_fields(system))


def layout(system: str) -> str | None:
    """``json`` or ``sections`` for a structured prompt, None for any other (the reply is free text)."""
    if not output_fields(system):
        return None
    if JSON_MARKER in system and CHAT_MARKER not in system:
        return "json"
    return "sections" if CHAT_MARKER in system else None


def instructions(system: str) -> str:
    """The task instructions inside a system message: after ChatAdapter's "your objective is:", or, in the
    compact layout, the text before the field list; a system message of neither kind is returned whole."""
    if "your objective is:" in system:
        return system.rsplit("your objective is:", 1)[-1].strip()
    head, found, _ = system.partition("Your input fields are:")
    return head.strip() if found else system.strip()


def sections(user_message: str) -> dict[str, str]:
    """Every ``[[ ## name ## ]]`` section of a user message, name -> text (stripped)."""
    return {m.group(1): m.group(2).strip() for m in _SECTION.finditer(user_message)}


def section(user_message: str, name: str) -> str | None:
    """The text of one input section, or None when the message has no such section."""
    return next((m.group(2) for m in _SECTION.finditer(user_message) if m.group(1) == name), None)


__all__ = ["CHAT_MARKER", "JSON_MARKER", "instructions", "layout", "output_fields", "output_names", "section", "sections"]
