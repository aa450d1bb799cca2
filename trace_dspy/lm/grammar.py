"""Output grammars: GBNF for the reply layout that a stage's typed output fields ask for.

Each output field's type sets what its value may be: ``Literal`` fields can only produce an allowed label,
``list[str]`` fields a JSON list of strings, free text stays on one bounded line. A tiny model then cannot
break the format. Types without a rule leave the whole call unconstrained.
"""

from __future__ import annotations

import ast
import json
import re
import threading

from trace_dspy.lm.prompts import layout, output_fields, section

# Free-text fields are one line of at most this many characters.
MAX_TEXT_CHARS = 300
MAX_LIST_ITEMS = 2
DEFAULT_QUOTE_FIELDS = {"trigger_spans": "dialogue"}
DEFAULT_TEXT_LIMITS = {"reasoning": 200}





def _gbnf_literal(text: str) -> str:
    return json.dumps(text)  # a JSON string literal is also a GBNF string literal


def _line(limit: int) -> str:
    # Starts like a sentence and stays on one line. Braces, brackets and '#'
    # are excluded: a small model otherwise drifts into copying the
    # "[[ ## field ## ]]" markers of the prompt ("[## ## ## ..." until the cap).
    return f'[A-Za-z0-9"\'] [^\\n{{}}\\[\\]#]{{0,{limit - 1}}}'


def _jstr(limit: int) -> str:
    return f'"\\"" [A-Za-z0-9\'] [^"\\\\\\n{{}}\\[\\]#]{{0,{limit - 1}}} "\\""'


_SCALARS = {
    "int": '"-"? [0-9]{1,9}',
    "float": '"-"? [0-9]{1,9} ("." [0-9]{1,6})?',
}


# CPython 3.11's ast.parse keeps its recursion bookkeeping in shared state: two threads parsing at once can
# fail with "SystemError: AST constructor recursion depth mismatch". Stage calls run in threads (--threads,
# Best-of-N under MLflow serving), so label sets are parsed under a lock, once per type string.
_AST_LOCK = threading.Lock()
_LITERALS: dict[str, tuple | None] = {}


def _literal_values(inner: str) -> tuple | None:
    """The values of ``Literal[<inner>]``, or None when they are not literals."""
    with _AST_LOCK:
        if inner not in _LITERALS:
            if len(_LITERALS) >= 256:
                _LITERALS.clear()
            try:
                _LITERALS[inner] = ast.literal_eval("(" + inner + ",)")
            except (SyntaxError, ValueError):
                _LITERALS[inner] = None
        return _LITERALS[inner]


def _value_rule(type_str: str, as_json: bool, limit: int, quotes: list[str] | None,
                choices: list[str] | None = None) -> str | None:
    """GBNF for one field value, or None when the type is not supported."""
    if type_str.startswith("Literal[") and type_str.endswith("]"):
        values = _literal_values(type_str[len("Literal["):-1])
        if values is None:
            return None
        if not all(isinstance(v, str) for v in values):
            return None
        # Candidates narrow the label set; none of them allowed means they are ignored.
        narrowed = [v for v in values if v in set(choices or ())]
        values = narrowed or values
        return "(" + " | ".join(_gbnf_literal(json.dumps(v) if as_json else v) for v in values) + ")"
    if type_str == "list[str]":
        if quotes:
            item = "(" + " | ".join(_gbnf_literal(json.dumps(q)) for q in quotes) + ")"
        else:
            item = "(" + _jstr(min(limit, 200)) + ")"
        return f'"[" {item} (", " {item}){{0,{MAX_LIST_ITEMS - 1}}} "]"'
    if type_str == "str":
        return "(" + (_jstr(limit) if as_json else _line(limit)) + ")"
    if type_str == "bool":
        return '("true" | "false")' if as_json else '("True" | "False")'
    if type_str in _SCALARS:
        return "(" + _SCALARS[type_str] + ")"
    return None


def output_grammar(
    system: str,
    *,
    limits: dict[str, int] | None = None,
    quotes: dict[str, list[str]] | None = None,
    choices: dict[str, list[str]] | None = None,
) -> str | None:
    """A GBNF grammar for the reply that a DSPy chat or JSON adapter prompt asks for.

    limits: maximum characters per free-text field (default MAX_TEXT_CHARS).
    quotes: for list fields, the only strings their items may be (verbatim quoting).
    choices: for label (``Literal``) fields, the only labels allowed (e.g. the
        emotion prior's candidates); labels outside the field's type are ignored.
    Returns None when the prompt is not in a recognised layout or a field has
    an unsupported type; the call then runs unconstrained.
    """
    kind = layout(system)
    if kind is None:
        return None
    fields, as_json = output_fields(system), kind == "json"
    limits, quotes, choices = limits or {}, quotes or {}, choices or {}
    parts = []
    for i, (name, type_str) in enumerate(fields):
        rule = _value_rule(type_str, as_json, limits.get(name, MAX_TEXT_CHARS), quotes.get(name), choices.get(name))
        if rule is None:
            return None
        if as_json:
            sep = "" if i == 0 else '", " '
            parts.append(f'{sep}"\\"{name}\\": " {rule}')
        else:
            sep = "" if i == 0 else '"\\n\\n" '
            parts.append(f'{sep}"[[ ## {name} ## ]]\\n" {rule}')
    body = " ".join(parts)
    if as_json:
        return f'root ::= "{{" {body} "}}"\n'
    return f'root ::= {body} "\\n\\n[[ ## completed ## ]]"\n'


_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def quotable_sentences(user_message: str, field: str, max_items: int = 40) -> list[str]:
    """Sentences of the speaker's turns in an input section, for verbatim quoting.

    Reads the ``[[ ## field ## ]]`` section of a chat-adapter user message; lines
    that start with ``Speaker:`` are the speaker's (all lines if none do).
    """
    text = section(user_message, field)
    if not text:
        return []
    lines = text.strip().splitlines()
    spoken = [ln.split(":", 1)[1] for ln in lines if ln.startswith("Speaker:")] or lines
    out: list[str] = []
    for text in spoken:
        for sentence in _SENTENCE_END.split(text.strip()):
            sentence = sentence.strip()
            if len(sentence) > 1 and sentence not in out:
                out.append(sentence[:400])
    return out[-max_items:]


_LISTED = re.compile(r"([a-z]+) \((\d+)%\)")
# Output label field -> the input field that lists its candidates.
DEFAULT_CHOICE_FIELDS = {"emotion": "emotion_candidates"}


def listed_choices(user_message: str, field: str) -> list[str]:
    """The labels listed as ``label (NN%), ...`` in an input section (the emotion prior's format)."""
    return [m.group(1) for m in _LISTED.finditer(section(user_message, field) or "")]


def grammar_for(system: str, user: str, *, limits: dict[str, int] | None = None,
                quote_fields: dict[str, str] | None = None,
                choice_fields: dict[str, str] | None = None) -> str | None:
    """The output grammar for one prompt, with quoting and candidate labels read from its user message."""
    quotes, choices = {}, {}
    for out_field, in_field in (quote_fields or {}).items():
        if f"`{out_field}`" in system and (sentences := quotable_sentences(user, in_field)):
            quotes[out_field] = sentences
    for out_field, in_field in (DEFAULT_CHOICE_FIELDS if choice_fields is None else choice_fields).items():
        if f"`{out_field}`" in system and (labels := listed_choices(user, in_field)):
            choices[out_field] = labels
    return output_grammar(system, limits=limits, quotes=quotes, choices=choices)
