"""Fake language models for tests and benchmarks.

``ScriptedEngine`` is a DSPy 3.4 engine (``complete(Request) -> Response``)
that reads the output fields a prompt asks for, answers each one from a
responder, and records every call. It speaks DSPy's chat format, so programs
run through the real adapter and parser, unchanged.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import dspy
from dspy.lm15 import Message, Response, TextPart, Usage

_OUTPUTS_BLOCK = re.compile(r"Your output fields are:\n(.*?)\nAll interactions", re.DOTALL)
_FIELD_LINE = re.compile(r"^\d+\. `(\w+)`", re.MULTILINE)
_SECTION = re.compile(r"\[\[ ## (\w+) ## \]\]\n(.*?)(?=\n\n\[\[ ## |\n\nRespond with|\Z)", re.DOTALL)

# Plausible answers for every TRACE field, so that a default engine runs the
# whole program.
DEFAULT_ANSWERS: dict[str, Any] = {
    "reasoning": "The speaker describes what happened and how it felt.",
    "emotion": "sad",
    "trigger_spans": ["I failed my driving test again."],
    "cause_summary": "The speaker failed an important test.",
    "cause_category": "Loss & Failure",
    "strategy": "ER",
    "secondary_strategy": "EX",
    "response": "I'm sorry the driving test went that way again; how are you holding up?",
    "x_intent": "to pass the test",
    "x_need": "to practise driving",
    "x_want": "to try again",
    "x_effect": "loses confidence",
    "x_react": "disappointed",
    "emotion_consistent": True,
    "spans_quoted": True,
    "strategy_followed": True,
    "detail_reused": True,
    "advice_avoided": True,
    "faulty_stage": "none",
    "critique": "Nothing to fix.",
}


@dataclass
class Call:
    """One recorded LM call: which outputs were asked for and with which inputs."""

    outputs: tuple[str, ...]
    inputs: dict[str, str]
    answer: dict[str, Any]
    instructions: str = ""


Responder = Callable[[tuple[str, ...], dict[str, str]], Mapping[str, Any]]


@dataclass
class ScriptedEngine:
    """Answer each requested output field from ``responder`` or ``answers``.

    responder(outputs, inputs) -> {field: value} takes precedence; fields it
    leaves out come from ``answers`` and then from DEFAULT_ANSWERS. Values may be
    callables of (inputs) for per-call answers.
    """

    responder: Responder | None = None
    answers: dict[str, Any] = field(default_factory=dict)
    calls: list[Call] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()

    def __getstate__(self):
        state = self.__dict__.copy()
        state.pop("_lock", None)
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def complete(self, request) -> Response:
        system = request.system if isinstance(request.system, str) else "".join(p.text for p in request.system or ())
        outputs = tuple(_output_fields(system))
        user = [m for m in request.messages if m.role == "user"]
        inputs = _sections(user[-1].text or "") if user else {}
        answer = dict(self.responder(outputs, inputs)) if self.responder else {}
        for name in outputs:
            if name not in answer:
                value = self.answers.get(name, DEFAULT_ANSWERS.get(name, f"<{name}>"))
                answer[name] = value(inputs) if callable(value) else value
        text = "\n\n".join(f"[[ ## {k} ## ]]\n{_render(answer[k])}" for k in outputs) + "\n\n[[ ## completed ## ]]"
        instructions = system.rsplit("your objective is:", 1)[-1].strip()
        with self._lock:
            self.calls.append(Call(outputs, inputs, {k: answer[k] for k in outputs}, instructions))
        n_in = len(system.split()) + sum(len((m.text or "").split()) for m in request.messages)
        n_out = len(text.split())
        return Response(id=None, model="scripted", message=Message.assistant([TextPart(text)]),
                        finish_reason="stop", usage=Usage(input_tokens=n_in, output_tokens=n_out,
                                                          total_tokens=n_in + n_out))

    def close(self) -> None:
        pass

    def stage_order(self) -> list[str]:
        """The stage of each call, named by its main output field."""
        return [stage_of(c.outputs) for c in self.calls]


_STAGE_BY_OUTPUT = {
    "emotion": "recognize_emotion",
    "x_intent": "infer_commonsense",
    "faulty_stage": "reflect",
    "cause_summary": "analyze_cause",
    "strategy": "plan_strategy",
    "response": "generate_response",
}


def stage_of(outputs: tuple[str, ...]) -> str:
    for name in outputs:
        if name in _STAGE_BY_OUTPUT:
            return _STAGE_BY_OUTPUT[name]
    return "unknown"


def _output_fields(system: str) -> list[str]:
    block = _OUTPUTS_BLOCK.search(system)
    return _FIELD_LINE.findall(block.group(1)) if block else []


def _sections(text: str) -> dict[str, str]:
    return {m.group(1): m.group(2).strip() for m in _SECTION.finditer(text)}


def _render(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value)


def fake_lm(responder: Responder | None = None, **answers: Any) -> tuple[dspy.LM, ScriptedEngine]:
    """A ``dspy.LM`` backed by a fresh ScriptedEngine (no cache), and the engine."""
    engine = ScriptedEngine(responder=responder, answers=answers)
    return dspy.LM("fake/scripted", engine=engine, cache=False), engine
