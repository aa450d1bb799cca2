"""The embedded offline model: SmolLM2-135M-Instruct run in-process by llama.cpp.

``LlamaEngine`` is a DSPy 3.4 engine (``complete(Request) -> Response``):

- **Grammar-constrained decoding.** The output constraint passed with the call
  (``trace_dspy.lm.constraint``: the stage signature's typed output fields)
  becomes a GBNF grammar (``trace_dspy.lm.grammar``), decoded greedily by
  ``trace_dspy.lm.decoding``. A call without a constraint is read from its
  prompt; one in no recognised layout runs unconstrained.
- **Prompt-prefix reuse.** llama.cpp reuses the KV cache for the prefix that a
  call shares with the previous one. TRACE's four stages alternate, so each
  stage's context state (its instructions and demos) is kept in a small
  in-memory table and restored before the next call of that stage; only the
  new part of the prompt is read.
- **One model per process** (``trace_dspy.lm.models``). Loaded models are shared
  between engines by (path, context size, threads); one lock per model
  serialises calls, so the engine is thread-safe. It pickles (the model is
  reloaded lazily), and it saves its settings with ``dump_state`` / ``load_state``.

- **A LoRA adapter** (``adapter``, a llama.cpp LoRA GGUF such as ``trace_dspy.lm.finetune`` writes) is
  applied on top of the model by llama.cpp; the model is loaded and its states kept apart from the base's,
  and ``adapter_tag`` puts the adapter's digest in the LM's name (DSPy's cache key).

The model file and llama-cpp-python come with the ``local`` extra (``trace_dspy.lm.model_files``).
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dspy.lm15 import Message, Response, TextPart, Usage

from trace_dspy.core import env

from trace_dspy.lm.constraint import OutputConstraint, request_constraint
from trace_dspy.lm.decoding import first_sentences, greedy, sentence_stop
from trace_dspy.lm.forcing import Forcing
from trace_dspy.lm.grammar import (
    DEFAULT_QUOTE_FIELDS,
    DEFAULT_TEXT_LIMITS,
    call_options,
    constraint_grammar,
    prompt_constraint,
)
from trace_dspy.lm.model_files import default_model_path, import_llama
from trace_dspy.lm.models import LoadedModel, load_model, restore_context, save_context, set_threads
from trace_dspy.lm.state_files import StateFiles
from trace_dspy.lm.threads import DEFAULT_POLICY, ThreadPolicy, default_thread_count

# min-p for sampled calls: llama.cpp's own default is 0.05; at DSPy's Best-of-N temperature of 1.0 that lets
# the 135M model wander into incoherent stories, which the reward cannot always tell from an answer
# (docs/results/replies.md, "Coherent candidates").
SAMPLE_MIN_P = 0.3


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


def _system_text(request) -> str:
    return request.system if isinstance(request.system, str) else "".join(
        getattr(p, "text", "") for p in (request.system or ()))


class LlamaEngine:
    """A DSPy engine that runs a GGUF chat model in-process with llama.cpp."""

    # TraceLM hands this engine the output constraint that an adapter passes with the call.
    takes_output_constraint = True

    def __init__(
        self,
        model_path: str | os.PathLike | None = None,
        *,
        n_ctx: int = 4096,
        n_threads: int | None = None,
        thread_policy: str = DEFAULT_POLICY,
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
        jump_forward: bool = True,
        state_files: bool = True,
        flash_attn: bool = False,
        adapter: str | os.PathLike | None = None,
    ):
        self.model_path = str(model_path) if model_path else None
        self.adapter = str(adapter) if adapter else None  # a LoRA adapter GGUF on top (trace_dspy.lm.finetune)
        self._adapter_digest: str | None = None
        self.n_ctx = int(n_ctx)
        self.n_threads = int(n_threads or default_thread_count())
        # adaptive: each call gets the cores other processes leave free (trace_dspy.lm.threads); fixed: n_threads.
        self.thread_policy = ThreadPolicy(thread_policy, self.n_threads)
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
        # Fast greedy calls read the text their grammar forces in one batch (trace_dspy.lm.forcing).
        self.jump_forward = bool(jump_forward)
        # The state after a stage's system message is kept on disk for the next process (trace_dspy.lm.state_files).
        self.state_files = bool(state_files)
        # llama.cpp's flash attention reads a prompt about 15% faster on these CPUs, but each generated token
        # then costs more the longer the context: 16-20 ms at 500 tokens against 8-10 ms without it (two
        # cores, docs/results/latency.md). The program generates most of its tokens one at a time, so off.
        self.flash_attn = bool(flash_attn)
        self.guard_counts: dict[str, int] = {}
        self._grammars: dict[Any, Any] = {}
        self._grammar_lock = threading.Lock()
        self._sampled: dict[int, int] = {}
        self.stats = EngineStats()

    # -- settings, pickling, saving ---------------------------------------------

    def settings(self) -> dict[str, Any]:
        return {
            "model_path": self.model_path, "n_ctx": self.n_ctx, "n_threads": self.n_threads,
            "thread_policy": self.thread_policy.policy,
            "seed": self.seed, "constrained": self.constrained, "prefix_cache": self.prefix_cache,
            "max_states": self.max_states, "default_max_tokens": self.default_max_tokens,
            "quote_fields": dict(self.quote_fields), "text_limits": dict(self.text_limits),
            "fast_greedy": self.fast_greedy, "loop_guard": self.loop_guard, "sample_min_p": self.sample_min_p,
            "jump_forward": self.jump_forward, "state_files": self.state_files, "flash_attn": self.flash_attn,
            "adapter": self.adapter,
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

    def _model(self) -> LoadedModel:
        return load_model(str(self.resolved_path()), self.n_ctx, self.n_threads, self.seed, self.flash_attn,
                          adapter=self.adapter)

    def adapter_tag(self) -> str:
        """``+lora-<digest>`` of the adapter's bytes, for the LM's name (DSPy's cache key); "" without one.

        The digest is of the file's content, so an adapter trained again at the same path gets a new name."""
        if self.adapter is None:
            return ""
        if self._adapter_digest is None:
            from trace_dspy.lm.finetune.gguf_lora import adapter_digest

            self._adapter_digest = adapter_digest(self.adapter)
        return f"+lora-{self._adapter_digest[:16]}"

    def warm_up(self) -> None:
        """Load the model now rather than on the first call."""
        self._model()

    def call_constraint(self, request, user: str) -> OutputConstraint | None:
        """The constraint a request carries (``TraceLM`` passes the stage signature's); a request without
        one is read from its rendered prompt (DSPy's stock adapters, see ``prompt_constraint``)."""
        carried = request_constraint(request)
        return carried if carried is not None else prompt_constraint(_system_text(request), user)

    def _options(self, constraint: OutputConstraint | None) -> tuple[dict, dict]:
        """The call's verbatim quotes and candidate labels, read once for its grammar and its forcing."""
        return call_options(constraint, quote_fields=self.quote_fields) if constraint is not None else ({}, {})

    def _grammar(self, constraint: OutputConstraint | None, options: tuple[dict, dict]) -> tuple[Any, str | None]:
        """The compiled grammar for a call and its GBNF text, (None, None) when unconstrained."""
        if not self.constrained:
            return None, None
        quotes, choices = options
        text = constraint_grammar(constraint, limits=self.text_limits, quotes=quotes, choices=choices)
        with self._grammar_lock:
            if text not in self._grammars:
                grammar = None
                if text is not None:
                    grammar = import_llama().LlamaGrammar.from_string(text, verbose=False)
                if len(self._grammars) > 256:
                    self._grammars.clear()
                self._grammars[text] = (grammar, text)
            return self._grammars[text]

    # -- the engine contract ----------------------------------------------------

    def _sampling(self, cfg, messages: list[dict]) -> dict[str, Any]:
        """llama.cpp's sampling keywords for a request's config."""
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
        return kwargs

    def complete(self, request) -> Response:
        system = _system_text(request)
        messages = ([{"role": "system", "content": system}] if system else []) + [
            {"role": m.role, "content": m.text or ""} for m in request.messages
        ]
        kwargs = self._sampling(request.config, messages)
        # A last assistant message is a prefill, as llama.cpp's server reads it: the reply continues that
        # text, and the completion holds only what the model added.
        prefill = ""
        if len(messages) > 1 and messages[-1]["role"] == "assistant":
            prefill = messages[-1]["content"]
            messages = messages[:-1]
        constraint = self.call_constraint(request, messages[-1]["content"] if messages else "") \
            if self.constrained else None
        out = self._decode(messages, prefill, kwargs, constraint)
        usage = out.get("usage") or {}
        choice = out["choices"][0]
        text = choice.get("text") or ""
        finish = "length" if choice.get("finish_reason") == "length" else "stop"
        return Response(
            id=out.get("id"), model=str(request.model), message=Message.assistant([TextPart(text)]),
            finish_reason=finish,
            usage=Usage(input_tokens=usage.get("prompt_tokens", 0), output_tokens=usage.get("completion_tokens", 0),
                        total_tokens=usage.get("total_tokens", 0)),
        )

    def _decode(self, messages: list[dict], prefill: str, kwargs: dict[str, Any],
                constraint: OutputConstraint | None) -> dict:
        """Run one prompt on the model (greedy under a grammar on the fast path); a create_completion dict."""
        options = self._options(constraint)
        grammar, grammar_text = self._grammar(constraint, options)
        model = self._model()
        with model.lock:
            llama = model.llama
            set_threads(model, self.thread_policy.threads())
            full = model.formatter(messages=messages)
            tokens = llama.tokenize((full.prompt + prefill).encode("utf-8"), add_bos=not full.added_special,
                                    special=True)
            if len(tokens) >= self.n_ctx:
                from dspy.lm15 import ContextLengthError

                raise ContextLengthError(f"the prompt has {len(tokens)} tokens; the context holds {self.n_ctx}")
            started = time.perf_counter()
            base = None
            if prefill:  # the prompt without the text the reply continues: shared by every continuation
                base = llama.tokenize(full.prompt.encode("utf-8"), add_bos=not full.added_special, special=True)
            self._position(model, messages, tokens, sampled=kwargs["temperature"] > 0, base=base)
            stops = [*full.stop, *(kwargs["stop"] or [])]
            if self.fast_greedy and grammar_text is not None and kwargs["temperature"] == 0:
                free = frozenset(f.name for f in constraint.fields if f.kind == "text")
                out = greedy(llama, tokens, grammar_text, kwargs["max_tokens"], stops,
                             loop_guard=self.loop_guard, stats=self.guard_counts, free_fields=free,
                             forcing=self._forcing(constraint, options))
            else:
                limit = constraint.max_sentences if constraint is not None and constraint.layout == "plain" else 0
                out = llama.create_completion(prompt=tokens, grammar=grammar, **{**kwargs, "stop": stops},
                                              stopping_criteria=sentence_stop(llama, len(tokens), limit))
                if limit:
                    out["choices"][0]["text"] = first_sentences(out["choices"][0]["text"], limit)
            usage = out.get("usage") or {}
            self.stats.add(usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0),
                           time.perf_counter() - started, messages)
        return out

    def _forcing(self, constraint: OutputConstraint, options: tuple[dict, dict]) -> Forcing | None:
        """What the call's grammar forces (see ``trace_dspy.lm.forcing``); None with ``jump_forward`` off."""
        if not self.jump_forward:
            return None
        quotes, choices = options
        return Forcing(constraint, dict(self.text_limits), quotes, choices)

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

    def _position(self, model: LoadedModel, messages: list[dict], tokens: list[int], sampled: bool = False,
                  base: list[int] | None = None) -> None:
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

        A call that continues a prefill (``base``: its prompt without the
        prefill) has a second fixed point: the end of that prompt, which every
        continuation of the same conversation shares (a scaffolded reply's
        sentences, each candidate's). Its state is kept in memory too, so each
        such call reads only its own prefill.
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
        if base is not None and len(head) < len(base) < len(tokens) and tokens[: len(base)] == base:
            if self._restore(model, base):
                return
            self._to_head(model, messages, head)
            llama.eval(base[len(head):])
            self._keep(model, base, save_context(llama))
            return
        self._to_head(model, messages, head)

    def _restore(self, model: LoadedModel, tokens: list[int]) -> bool:
        """Restore the state saved in memory after exactly ``tokens``; False when there is none."""
        key = hash(tuple(tokens))
        saved = model.states.get(key)
        if saved is None or list(saved[2]) != tokens:
            return False
        restore_context(model.llama, saved)
        model.states.move_to_end(key)
        return True

    def _keep(self, model: LoadedModel, tokens: list[int], saved: tuple) -> None:
        model.states[hash(tuple(tokens))] = saved
        while len(model.states) > self.max_states:
            model.states.popitem(last=False)

    def _to_head(self, model: LoadedModel, messages: list[dict], head: list[int]) -> None:
        """The context at the end of the fixed part ``head``: from memory, from disk, or read and saved."""
        llama = model.llama
        if self._restore(model, head):
            return
        # A fixed part that is only the system message (a stage's instructions) is the same in every process.
        files = self._state_files(model) if len(messages) == 2 and messages[0]["role"] == "system" else None
        saved = files.load(head) if files is not None else None
        if saved is not None:
            restore_context(llama, saved)
        else:
            llama.reset()
            llama.eval(head)
            saved = save_context(llama)
            if files is not None:
                files.save(head, saved)
        self._keep(model, head, saved)

    def _state_files(self, model: LoadedModel) -> StateFiles | None:
        """The folder of saved system-message states (``trace_dspy.lm.state_files``); None with them off."""
        if not self.state_files:
            return None
        folder = env.cache_dir("llama-states")  # read at each use: the cache folder may be changed in-process
        if model.files is None or model.files.folder != folder:
            model.files = StateFiles(folder, str(self.resolved_path()), self.n_ctx, self.flash_attn,
                                     adapter=self.adapter)
        return model.files

    def stream(self, request):
        from dspy.lm15 import response_to_events

        return response_to_events(self.complete(request))

    def close(self) -> None:
        pass
