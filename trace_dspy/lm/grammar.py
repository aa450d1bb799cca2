"""Output grammars: GBNF for the reply layout that a call's ``OutputConstraint`` describes.

Each output field's kind sets what its value may be: a ``Literal`` field can only produce an allowed label,
a ``list[str]`` field a JSON list of strings, free text stays on one bounded line. A tiny model then cannot
break the format. ``grammar_for_call`` adds verbatim quoting and candidate labels read from the call's inputs.

Calls that carry no constraint (DSPy's own modules, such as an optimizer's instruction proposer, call the LM
through DSPy's stock adapters) are read from their rendered prompt instead (``prompt_constraint``).
"""

from __future__ import annotations

import ast
import json
import re
import threading

from trace_dspy.core.text import split_sentences
from trace_dspy.lm.constraint import OutputConstraint, OutputField
from trace_dspy.lm.prompts import layout, output_fields, section, sections

# Free-text fields are one line of at most this many characters.
MAX_TEXT_CHARS = 300
MAX_LIST_ITEMS = 2
DEFAULT_QUOTE_FIELDS = {"trigger_spans": "dialogue"}
# The cause summary is one sentence (its description says so); past that a small model repeats itself.
DEFAULT_TEXT_LIMITS = {"reasoning": 200, "cause_summary": 150}
# Output label field -> the input field that lists its candidates.
DEFAULT_CHOICE_FIELDS = {"emotion": "emotion_candidates"}


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


def _value_rule(field: OutputField, as_json: bool, limit: int, quotes: list[str] | None,
                choices: list[str] | None = None) -> str:
    """GBNF for one field value."""
    if field.kind == "label":
        # Candidates narrow the label set; none of them allowed means they are ignored.
        narrowed = [v for v in field.labels if v in set(choices or ())]
        values = narrowed or field.labels
        return "(" + " | ".join(_gbnf_literal(json.dumps(v) if as_json else v) for v in values) + ")"
    if field.kind == "list":
        if quotes:
            item = "(" + " | ".join(_gbnf_literal(json.dumps(q)) for q in quotes) + ")"
        else:
            item = "(" + _jstr(min(limit, 200)) + ")"
        return f'"[" {item} (", " {item}){{0,{MAX_LIST_ITEMS - 1}}} "]"'
    if field.kind == "text":
        return "(" + (_jstr(limit) if as_json else _line(limit)) + ")"
    if field.kind == "bool":
        return '("true" | "false")' if as_json else '("True" | "False")'
    return "(" + _SCALARS[field.kind] + ")"


def constraint_grammar(
    constraint: OutputConstraint | None,
    *,
    limits: dict[str, int] | None = None,
    quotes: dict[str, list[str]] | None = None,
    choices: dict[str, list[str]] | None = None,
) -> str | None:
    """A GBNF grammar for the reply a constraint describes; None without a constraint (unconstrained).

    limits: maximum characters per free-text field (default MAX_TEXT_CHARS).
    quotes: for list fields, the only strings their items may be (verbatim quoting).
    choices: for label fields, the only labels allowed (e.g. the emotion prior's candidates); labels
        outside the field's set are ignored.
    """
    if constraint is None or constraint.layout == "plain":
        return None
    as_json = constraint.layout == "json"
    limits, quotes, choices = limits or {}, quotes or {}, choices or {}
    parts = []
    for i, field in enumerate(constraint.fields):
        name = field.name
        rule = _value_rule(field, as_json, limits.get(name, MAX_TEXT_CHARS), quotes.get(name), choices.get(name))
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


def speaker_sentences(text: str | None, max_items: int = 40) -> list[str]:
    """Sentences of the speaker's turns in a dialogue text, for verbatim quoting; lines that start with
    ``Speaker:`` are the speaker's (all lines if none do)."""
    if not text:
        return []
    lines = text.strip().splitlines()
    spoken = [ln.split(":", 1)[1] for ln in lines if ln.startswith("Speaker:")] or lines
    out: list[str] = []
    for turn in spoken:
        for sentence in split_sentences(turn.strip()):
            sentence = sentence.strip()
            if len(sentence) > 1 and sentence not in out:
                out.append(sentence[:400])
    return out[-max_items:]


_LISTED = re.compile(r"([a-z]+) \((\d+)%\)")


def candidate_labels(text: str | None) -> list[str]:
    """The labels listed as ``label (NN%), ...`` (the emotion prior's format)."""
    return [m.group(1) for m in _LISTED.finditer(text or "")]


def grammar_for_call(constraint: OutputConstraint | None, *, limits: dict[str, int] | None = None,
                     quote_fields: dict[str, str] | None = None,
                     choice_fields: dict[str, str] | None = None) -> str | None:
    """The grammar for one call, with quoting and candidate labels read from its input texts.

    quote_fields: output list field -> the input field whose speaker sentences its items must quote.
    choice_fields: output label field -> the input field that lists its candidates
        (default DEFAULT_CHOICE_FIELDS).
    """
    if constraint is None:
        return None
    quotes, choices = call_options(constraint, quote_fields=quote_fields, choice_fields=choice_fields)
    return constraint_grammar(constraint, limits=limits, quotes=quotes, choices=choices)


def call_options(constraint: OutputConstraint, *, quote_fields: dict[str, str] | None = None,
                 choice_fields: dict[str, str] | None = None) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """The verbatim quotes (list field -> sentences) and candidate labels (label field -> labels) that one
    call's input texts give its grammar (see ``grammar_for_call``)."""
    quotes, choices = {}, {}
    for out_field, in_field in (quote_fields or {}).items():
        if out_field in constraint.names and (sentences := speaker_sentences(constraint.input_text(in_field))):
            quotes[out_field] = sentences
    for out_field, in_field in (DEFAULT_CHOICE_FIELDS if choice_fields is None else choice_fields).items():
        if out_field in constraint.names and (labels := candidate_labels(constraint.input_text(in_field))):
            choices[out_field] = labels
    return quotes, choices


# ---------------------------------------------------------------- calls without a constraint: the prompt

# CPython 3.11's ast.parse keeps its recursion bookkeeping in shared state: two threads parsing at once can
# fail with "SystemError: AST constructor recursion depth mismatch". Stage calls run in threads (--threads,
# Best-of-N under MLflow serving), so label sets are parsed under a lock, once per type string.
_AST_LOCK = threading.Lock()
_LITERALS: dict[str, tuple | None] = {}
_TYPES = {"list[str]": "list", "str": "text", "bool": "bool", "int": "int", "float": "float"}


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


def field_from_type(name: str, type_str: str) -> OutputField | None:
    """The output field for a type as a prompt names it, or None when it has no rule."""
    if type_str.startswith("Literal[") and type_str.endswith("]"):
        values = _literal_values(type_str[len("Literal["):-1])
        if values is None or not all(isinstance(v, str) for v in values):
            return None
        return OutputField(name, "label", tuple(values))
    kind = _TYPES.get(type_str)
    return None if kind is None else OutputField(name, kind)


def prompt_constraint(system: str, user: str = "") -> OutputConstraint | None:
    """The constraint that a rendered DSPy chat or JSON adapter prompt asks for, or None when the prompt is
    not in a recognised layout or a field has an unsupported type."""
    kind = layout(system)
    if kind is None:
        return None
    fields = [field_from_type(name, type_str) for name, type_str in output_fields(system)]
    if any(f is None for f in fields):
        return None
    return OutputConstraint(kind, tuple(fields), tuple(sections(user).items()))


def output_grammar(system: str, *, limits: dict[str, int] | None = None,
                   quotes: dict[str, list[str]] | None = None,
                   choices: dict[str, list[str]] | None = None) -> str | None:
    """A GBNF grammar for the reply that a rendered prompt asks for (see ``constraint_grammar``)."""
    return constraint_grammar(prompt_constraint(system), limits=limits, quotes=quotes, choices=choices)


def quotable_sentences(user_message: str, field: str, max_items: int = 40) -> list[str]:
    """The speaker's sentences in one ``[[ ## field ## ]]`` section of a rendered user message."""
    return speaker_sentences(section(user_message, field), max_items)


def listed_choices(user_message: str, field: str) -> list[str]:
    """The candidate labels listed in one section of a rendered user message."""
    return candidate_labels(section(user_message, field))


def grammar_for(system: str, user: str, *, limits: dict[str, int] | None = None,
                quote_fields: dict[str, str] | None = None,
                choice_fields: dict[str, str] | None = None) -> str | None:
    """The grammar for a rendered prompt that carries no constraint (see ``grammar_for_call``)."""
    return grammar_for_call(prompt_constraint(system, user), limits=limits, quote_fields=quote_fields,
                            choice_fields=choice_fields)
