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

from trace_dspy.core.stages import stage_of_outputs
from trace_dspy.lm.prompts import instructions, layout, output_names, sections

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


class _PicklesWithoutLock:
    """Engines hold a lock, which cannot be pickled; a copy gets a new one (MLflow pickles LMs)."""

    def __getstate__(self):
        state = self.__dict__.copy()
        state.pop("_lock", None)
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._lock = threading.Lock()


def _system_text(request) -> str:
    return request.system if isinstance(request.system, str) else "".join(p.text for p in request.system or ())


@dataclass
class ScriptedEngine(_PicklesWithoutLock):
    """Answer each requested output field from ``responder`` or ``answers``.

    responder(outputs, inputs) -> {field: value} takes precedence; fields it
    leaves out come from ``answers`` and then from DEFAULT_ANSWERS. Values may be
    callables of (inputs) for per-call answers.

    By default every structured prompt is answered in the ``[[ ## field ## ]]`` sections layout, whatever it
    asks for: DSPy's JSON fallback then sees a reply it must reject, as from a model that ignores the format,
    which is what the fault-injection tests rely on. ``follow_layout=True`` answers a JSON-layout prompt
    (JSONAdapter) with a JSON object, as a model that follows the format would.
    """

    responder: Responder | None = None
    answers: dict[str, Any] = field(default_factory=dict)
    calls: list[Call] = field(default_factory=list)
    follow_layout: bool = False

    def __post_init__(self) -> None:
        self._lock = threading.Lock()

    def complete(self, request) -> Response:
        system = _system_text(request)
        user = [m for m in request.messages if m.role == "user"]
        # A last assistant message is a prefill (as llama.cpp's server and the embedded engine read it).
        last = request.messages[-1] if request.messages else None
        prefill = (last.text or "") if last is not None and last.role == "assistant" else ""
        text = self.reply_text(system, user[-1].text or "" if user else "", prefill=prefill)
        n_in = len(system.split()) + sum(len((m.text or "").split()) for m in request.messages)
        n_out = len(text.split())
        return Response(id=None, model="scripted", message=Message.assistant([TextPart(text)]),
                        finish_reason="stop", usage=Usage(input_tokens=n_in, output_tokens=n_out,
                                                          total_tokens=n_in + n_out))

    def reply_text(self, system: str, user_text: str, prefill: str = "") -> str:
        """The completion text for a DSPy chat prompt (system text, last user message, the assistant's prefill
        if any); records the call. A plain reply's responder sees the prefill as ``inputs["prefill"]`` and
        answers with its continuation."""
        outputs = output_names(system)
        plain = not outputs  # the chat-native reply layout (ChatReplyAdapter): the answer is the reply itself
        if plain:
            outputs, inputs = ("response",), {"message": user_text, "system": system, "prefill": prefill}
        else:
            inputs = sections(user_text)
        answer = dict(self.responder(outputs, inputs)) if self.responder else {}
        for name in outputs:
            if name not in answer:
                value = self.answers.get(name, DEFAULT_ANSWERS.get(name, f"<{name}>"))
                answer[name] = value(inputs) if callable(value) else value
        if plain:
            text, task = str(answer["response"]), system
        elif self.follow_layout and layout(system) == "json":
            text, task = json.dumps({k: answer[k] for k in outputs}), instructions(system)
        else:
            text = "\n\n".join(f"[[ ## {k} ## ]]\n{_render(answer[k])}" for k in outputs) + "\n\n[[ ## completed ## ]]"
            task = instructions(system)
        with self._lock:
            self.calls.append(Call(outputs, inputs, {k: answer[k] for k in outputs}, task))
        return text

    def close(self) -> None:
        pass

    def stage_order(self) -> list[str]:
        """The stage of each call, named by its main output field."""
        return [stage_of(c.outputs) for c in self.calls]


def stage_of(outputs: tuple[str, ...]) -> str:
    """The stage a prompt belongs to, by its output fields (see ``trace_dspy.core.stages``)."""
    return stage_of_outputs(outputs)


def _render(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value)


def fake_lm(responder: Responder | None = None, *, follow_layout: bool = False,
            **answers: Any) -> tuple[dspy.LM, ScriptedEngine]:
    """A ``dspy.LM`` backed by a fresh ScriptedEngine (no cache), and the engine (see ScriptedEngine)."""
    engine = ScriptedEngine(responder=responder, answers=answers, follow_layout=follow_layout)
    return dspy.LM("fake/scripted", engine=engine, cache=False), engine


# ---------------------------------------------------------------- fault injection

# Transport faults a provider can return; DSPy retries them (``num_retries``).
RETRYABLE_FAULTS = ("timeout", "server_error", "rate_limit")
# Faults in the reply itself; no retry can be assumed to fix them.
REPLY_FAULTS = ("garbage", "truncated", "bad_label")
FAULTS = RETRYABLE_FAULTS + REPLY_FAULTS

# Output fields with a closed label set, and a value outside each set.
_OUT_OF_SET = {
    "emotion": "hangry",
    "cause_category": "Weather",
    "strategy": "XX",
    "secondary_strategy": "XX",
    "faulty_stage": "everything",
}
_GARBAGE_WORDS = ("lorem", "ipsum", "###", "{", "}", "null", "\u2603", "<|im_end|>", "[[", "]]", "0x7f")


@dataclass(frozen=True)
class Injection:
    """One injected fault: which, in which stage, on which attempt at that prompt."""

    fault: str
    stage: str
    attempt: int


@dataclass
class FaultyEngine(_PicklesWithoutLock):
    """A DSPy 3.4 engine that wraps another one and injects faults at set rates.

    ``rates`` maps a fault in FAULTS to the probability that a call gets it
    (the rates must sum to at most 1):

    - ``timeout``, ``server_error``, ``rate_limit`` raise ``dspy.lm15``'s
      TimeoutError, ServerError (503) and RateLimitError (429), which
      ``dspy.LM`` retries ``num_retries`` times with exponential backoff
      (``retry_after`` is sent as the provider's hint when set);
    - ``garbage`` replaces the reply with random words;
    - ``truncated`` cuts the reply off inside its last output field's header
      (finish_reason ``length``), so that field is missing;
    - ``bad_label`` puts an out-of-set label in the first labelled output
      field (emotion, cause_category, strategy ...); a call without such a
      field passes through unchanged.

    Which fault a call gets depends only on the seed, the prompt and how many
    times that prompt was sent before, never on thread scheduling: the same
    run gives the same faults with 1 or 8 threads. ``latency`` seconds are
    slept per call. Every injection is recorded in ``injected``.
    """

    inner: Any = field(default_factory=ScriptedEngine)
    rates: dict[str, float] = field(default_factory=dict)
    seed: int = 0
    retry_after: float | None = None
    latency: float = 0.0
    injected: list[Injection] = field(default_factory=list)
    attempts: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        unknown = set(self.rates) - set(FAULTS)
        if unknown:
            raise ValueError(f"unknown fault(s) {', '.join(sorted(unknown))}; choose from {', '.join(FAULTS)}")
        if any(r < 0 for r in self.rates.values()) or sum(self.rates.values()) > 1 + 1e-9:
            raise ValueError("fault rates must be >= 0 and sum to at most 1")
        self._lock = threading.Lock()

    # -- the engine protocol

    def complete(self, request) -> Response:
        import hashlib

        system = _system_text(request)
        prompt = system + "\x00" + "\x00".join(m.text or "" for m in request.messages)
        key = hashlib.sha256(prompt.encode("utf-8", "surrogatepass")).hexdigest()
        with self._lock:
            attempt = self.attempts.get(key, 0) + 1
            self.attempts[key] = attempt
        digest = hashlib.sha256(f"{self.seed}:{key}:{attempt}".encode()).digest()
        draw = int.from_bytes(digest[:8], "big") / 2**64
        fault = self._pick(draw)
        outputs = output_names(system)
        stage = stage_of(outputs)
        if self.latency:
            import time

            time.sleep(self.latency)
        if fault in RETRYABLE_FAULTS:
            self._record(fault, stage, attempt)
            raise self._transport_error(fault)
        response = self.inner.complete(request)
        if fault is None:
            return response
        text = "".join(p.text for p in response.message.parts if getattr(p, "text", None))
        corrupted = self._corrupt(fault, text, outputs, digest)
        if corrupted is None:  # bad_label on a call without labelled fields
            return response
        self._record(fault, stage, attempt)
        return Response(id=None, model=response.model, message=Message.assistant([TextPart(corrupted)]),
                        finish_reason="length" if fault == "truncated" else "stop", usage=response.usage)

    def close(self) -> None:
        pass

    # -- what happened

    def counts(self) -> dict[str, int]:
        """Injected faults by kind."""
        out: dict[str, int] = {}
        for inj in self.injected:
            out[inj.fault] = out.get(inj.fault, 0) + 1
        return out

    @property
    def calls(self) -> int:
        """Every call that reached this engine, faulty or not."""
        return sum(self.attempts.values())

    def retried_prompts(self) -> int:
        """Prompts that were sent more than once (a retry, or a rerun of the same prompt)."""
        return sum(n > 1 for n in self.attempts.values())

    # -- internals

    def _pick(self, draw: float) -> str | None:
        edge = 0.0
        for fault in FAULTS:
            edge += self.rates.get(fault, 0.0)
            if draw < edge:
                return fault
        return None

    def _record(self, fault: str, stage: str, attempt: int) -> None:
        with self._lock:
            self.injected.append(Injection(fault, stage, attempt))

    def _transport_error(self, fault: str) -> Exception:
        from dspy import lm15

        hint = {"retry_after": self.retry_after}
        if fault == "timeout":
            return lm15.TimeoutError("injected fault: the request timed out", **hint)
        if fault == "server_error":
            return lm15.ServerError("injected fault: 503 Service Unavailable", status=503, **hint)
        return lm15.RateLimitError("injected fault: 429 Too Many Requests", status=429, **hint)

    @staticmethod
    def _corrupt(fault: str, text: str, outputs: tuple[str, ...], digest: bytes) -> str | None:
        if fault == "garbage":
            import random

            rng = random.Random(digest)
            return " ".join(rng.choice(_GARBAGE_WORDS) for _ in range(rng.randint(3, 12)))
        if fault == "truncated":
            last = outputs[-1] if outputs else None
            header = f"[[ ## {last} ## ]]" if last else ""
            cut = text.rfind(header) if header else -1
            cut = cut + len(header) // 2 if cut >= 0 else len(text) // 2
            return text[:cut]
        labelled = next((name for name in outputs if name in _OUT_OF_SET), None)
        if labelled is None:
            return None
        section = re.compile(rf"(\[\[ ## {labelled} ## \]\]\n)(.*?)(?=\n\n\[\[ ## |\Z)", re.DOTALL)
        return section.sub(lambda m: m.group(1) + _OUT_OF_SET[labelled], text, count=1)


def faulty_lm(rates: Mapping[str, float] | None = None, *, seed: int = 0, num_retries: int = 3,
              retry_after: float | None = None, latency: float = 0.0, inner: Any = None,
              **answers: Any) -> tuple[dspy.LM, FaultyEngine]:
    """A ``dspy.LM`` (no cache) over a FaultyEngine that wraps ``inner`` or a ScriptedEngine."""
    engine = FaultyEngine(inner=inner if inner is not None else ScriptedEngine(answers=answers),
                          rates=dict(rates or {}), seed=seed, retry_after=retry_after, latency=latency)
    return dspy.LM("fake/faulty", engine=engine, cache=False, num_retries=num_retries), engine
