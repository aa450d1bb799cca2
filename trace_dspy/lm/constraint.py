"""The output constraint of one LM call, built from the stage's typed signature and passed with the call.

An adapter that knows the signature (``trace_dspy.lm.adapters``) describes the reply it asks for as an
``OutputConstraint``: the layout (``[[ ## name ## ]]`` sections or a JSON object), each output field with
the kind of value its type allows (a label of a ``Literal``, free text, a list of strings, a number, a
truth value), and the input texts that quoting and candidate labels are read from. It travels as the LM
call's ``output_constraint`` keyword; ``TraceLM`` hands it to an engine that decodes under it (the embedded
engine) and drops it for any other. The grammar therefore never depends on how a prompt is worded.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass
from typing import Any, Literal

# The LM call keyword that carries the constraint, and the key it has in the request's metadata.
CONSTRAINT_KWARG = "output_constraint"
METADATA_KEY = "trace_dspy_output_constraint"
# sections: ``[[ ## name ## ]]`` blocks; json: one JSON object; plain: the whole completion is one free text.
LAYOUTS = ("sections", "json", "plain")
KINDS = ("label", "text", "list", "bool", "int", "float")
_PLAIN_KINDS = {str: "text", bool: "bool", int: "int", float: "float"}


@dataclass(frozen=True)
class OutputField:
    """One output field: its name, the kind of value it holds and, for a label, the labels allowed."""

    name: str
    kind: str
    labels: tuple[str, ...] = ()

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"unknown output kind {self.kind!r}; expected one of {', '.join(KINDS)}")

    @classmethod
    def from_annotation(cls, name: str, annotation: Any) -> OutputField | None:
        """The field for a type annotation, or None when decoding cannot be constrained to that type."""
        if typing.get_origin(annotation) is Literal:
            labels = typing.get_args(annotation)
            return cls(name, "label", labels) if labels and all(isinstance(v, str) for v in labels) else None
        if typing.get_origin(annotation) is list and typing.get_args(annotation) == (str,):
            return cls(name, "list")
        kind = _PLAIN_KINDS.get(annotation)
        return None if kind is None else cls(name, kind)


@dataclass(frozen=True)
class OutputConstraint:
    """The reply layout of one call: its output fields in order and the input texts it may draw on."""

    layout: str
    fields: tuple[OutputField, ...]
    inputs: tuple[tuple[str, str], ...] = ()
    # Plain layout: end the completion after this many complete sentences (0: no limit).
    max_sentences: int = 0

    def __post_init__(self):
        if self.layout not in LAYOUTS:
            raise ValueError(f"unknown layout {self.layout!r}; expected one of {', '.join(LAYOUTS)}")
        if self.max_sentences < 0:
            raise ValueError(f"max_sentences must be 0 or more, got {self.max_sentences}")

    @classmethod
    def plain_text(cls, name: str, *, max_sentences: int = 0) -> OutputConstraint:
        """A completion that is one free text (no grammar), ended after ``max_sentences`` sentences if set."""
        return cls("plain", (OutputField(name, "text"),), max_sentences=max_sentences)

    @classmethod
    def from_signature(cls, signature, layout: str, inputs: dict[str, Any] | None = None) -> OutputConstraint | None:
        """The constraint for a DSPy signature's outputs, or None when a field's type has no rule (the call
        then runs unconstrained). ``inputs`` are the call's input values, kept as the prompt renders them."""
        from dspy.adapters.utils import format_field_value

        fields = []
        for name, info in signature.output_fields.items():
            field = OutputField.from_annotation(name, info.annotation)
            if field is None:
                return None
            fields.append(field)
        if not fields:
            return None
        texts = tuple((name, str(format_field_value(field_info=info, value=inputs[name])))
                      for name, info in signature.input_fields.items() if name in (inputs or {}))
        return cls(layout, tuple(fields), texts)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.fields)

    def input_text(self, name: str) -> str | None:
        """The text of one input field, or None when the call has no such input."""
        return dict(self.inputs).get(name)

    def to_json(self) -> dict[str, Any]:
        data = {"layout": self.layout, "inputs": [list(pair) for pair in self.inputs],
                "fields": [{"name": f.name, "kind": f.kind, "labels": list(f.labels)} for f in self.fields]}
        if self.max_sentences:
            data["max_sentences"] = self.max_sentences
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> OutputConstraint:
        fields = tuple(OutputField(f["name"], f["kind"], tuple(f.get("labels") or ())) for f in data["fields"])
        return cls(data["layout"], fields, tuple((str(k), str(v)) for k, v in data.get("inputs") or ()),
                   int(data.get("max_sentences") or 0))


def constraint_kwargs(lm, lm_kwargs: dict[str, Any], signature, inputs: dict[str, Any],
                      layout: str | None) -> dict[str, Any]:
    """``lm_kwargs`` with this call's constraint, for an LM that takes one (``TraceLM``); unchanged otherwise
    (a plain ``dspy.LM`` refuses keywords it does not know). A layout of None drops any constraint."""
    if not getattr(lm, "takes_output_constraint", False):
        return lm_kwargs
    kwargs = {k: v for k, v in lm_kwargs.items() if k != CONSTRAINT_KWARG}
    constraint = OutputConstraint.from_signature(signature, layout, inputs) if layout else None
    return kwargs if constraint is None else {**kwargs, CONSTRAINT_KWARG: constraint}


def request_constraint(request) -> OutputConstraint | None:
    """The constraint that a DSPy request carries in its metadata (see ``TraceLM``), or None."""
    extensions = getattr(request.config, "extensions", None) or {}
    data = (extensions.get("metadata") or {}).get(METADATA_KEY)
    return None if data is None else OutputConstraint.from_json(data)
