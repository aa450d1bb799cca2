"""Fast greedy decoding under a grammar, with a guard that cuts a free-text value that starts to loop."""

from __future__ import annotations

import ctypes
import math
import re

from trace_dspy.core.text import loop_start, sentence_spans
from trace_dspy.lm.model_files import LocalModelError, import_llama


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

    def allows(self, token: int) -> bool:
        """Does the grammar allow ``token`` next?"""
        lc = self.llama_cpp
        self.one[0].id, self.one[0].logit, self.one[0].p = token, 0.0, 0.0
        single = lc.llama_token_data_array(self.one, 1, -1, False)
        lc.llama_sampler_apply(self.sampler, ctypes.byref(single))
        return bool(math.isfinite(self.one[0].logit))

    def accept(self, token: int) -> None:
        self.llama_cpp.llama_sampler_accept(self.sampler, token)

    def free(self) -> None:
        """Free the sampler once; a second call does nothing."""
        if self.sampler is not None:
            self.llama_cpp.llama_sampler_free(self.sampler)
            self.sampler = None


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


def _reuse_prefix(llama, tokens: list[int]) -> None:
    """Evaluate the prompt, reusing the evaluated prefix (llama.eval drops the cache past n_tokens); at least
    one prompt token is evaluated, which refreshes the logits."""
    cached = list(llama.input_ids[: llama.n_tokens])
    keep = 0
    for a, b in zip(cached, tokens[:-1]):
        if a != b:
            break
        keep += 1
    llama.n_tokens = keep
    llama.eval(tokens[keep:])


def _only_closers(llama, logits):
    """The logits with every token masked but those that end a cut value: a line break or a closing quote."""
    import numpy as np

    masked = np.full(len(logits), -np.inf, dtype=np.float32)
    ids = _closers(llama)
    masked[ids] = logits[ids]
    return masked


def _loop_cut(llama, text: str, out: list[int], free_fields: frozenset) -> int | None:
    """How many of the ``out`` tokens to keep when the free-text value being written loops, else None."""
    marker = _guard_field(text) if not text.endswith("\n") else None
    if marker is None or marker[0] not in free_fields:
        return None
    value = text[marker[1]:]
    cut = loop_start(value)
    if cut is None or not value[:cut].strip():
        return None
    target = len(text) - len(value) + len(value[:cut].rstrip(" ,;"))
    return next(i for i in range(1, len(out) + 1)
                if len(llama.detokenize(out[:i]).decode("utf-8", errors="ignore")) >= target)


def _read_forced(llama, pick: _GrammarPick, forced: str, out: list[int]) -> int:
    """Read the forced text in one batch, each token checked by the grammar and accepted; how many were read
    (0: the grammar took none of them, and the model picks the next token as usual)."""
    taken = []
    for token in llama.tokenize(forced.encode("utf-8"), add_bos=False, special=False):
        if not pick.allows(token):
            break
        pick.accept(token)
        taken.append(token)
    if taken:
        out.extend(taken)
        llama.eval(taken)
    return len(taken)


def greedy(llama, tokens: list[int], grammar_text: str, max_tokens: int, stops: list[str],
           loop_guard: bool = False, free_fields: frozenset = frozenset(), stats: dict | None = None,
           forcing=None) -> dict:
    """Greedy decoding under a grammar, checking the grammar on the top token first.

    llama.cpp's grammar sampler tests every one of the 49k vocabulary entries
    at every step (about 15 ms a token here). Under greedy decoding only the
    best allowed token matters: when the model's top token is allowed it is
    that token, and only otherwise is the whole vocabulary masked. The result
    is the token create_completion would pick, at a fraction of the cost.

    With ``loop_guard``, a free-text value that starts to repeat itself (see
    ``trace_dspy.core.text.loop_start``; only the ``free_fields``) is cut back to its first statement and closed: greedy
    decoding of a small model otherwise repeats the loop until the length cap,
    spending tokens on text that only lowers the reply's worth.
    With ``forcing`` (``trace_dspy.lm.forcing.Forcing``), text the grammar leaves no choice about is read in
    one batch instead of one pass per token, and the closing header is written without the model.
    Returns a create_completion-shaped dict.
    """
    import numpy as np

    llama_cpp = import_llama()
    n_vocab, ctx, vocab = llama.n_vocab(), llama._ctx.ctx, llama._model.vocab
    _reuse_prefix(llama, tokens)
    pick = _GrammarPick(llama, grammar_text)
    counts = stats if stats is not None else {}
    out: list[int] = []
    finish, text, closing = "length", "", False
    try:
        while len(out) < max_tokens:
            if forcing is not None and not closing:
                text, step = _forced_step(llama, pick, forcing, text, out, counts)
                if step == "stop":
                    finish = "stop"
                    break
                if step == "read":
                    continue
            logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, -1), shape=(n_vocab,))
            if closing:  # end the cut value: only a line break or a closing quote
                logits, closing = _only_closers(llama, logits), False
            token = pick(logits)
            if llama_cpp.llama_vocab_is_eog(vocab, token):
                finish = "stop"
                break
            pick.accept(token)
            out.append(token)
            text = llama.detokenize(out).decode("utf-8", errors="ignore")
            hit = min((text.find(s) for s in stops if s and s in text), default=-1)
            if hit >= 0:
                text, finish = text[:hit], "stop"
                break
            size = _loop_cut(llama, text, out, free_fields) if loop_guard else None
            if size is not None:
                pick = _cut_back(llama, pick, grammar_text, out, size, len(tokens), counts)
                closing = True
            llama.eval([out[-1]])
    finally:
        pick.free()
    return _completion(text, finish, len(tokens), out)


def _completion(text: str, finish: str, prompt_tokens: int, out: list[int]) -> dict:
    """A create_completion-shaped result for ``out``, the completion's tokens, and its ``text``."""
    return {"id": f"greedy-{id(out)}", "choices": [{"text": text, "finish_reason": finish}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": len(out),
                      "total_tokens": prompt_tokens + len(out)}}


def _forced_step(llama, pick: _GrammarPick, forcing, text: str, out: list[int],
                 counts: dict) -> tuple[str, str | None]:
    """Let ``forcing`` write what the grammar leaves no choice about. ("stop", the text with the closing header)
    when the rest is forced; ("read", the new text) when forced tokens were read in one batch; else (``text``,
    None), and the model picks the next token."""
    forced, complete = forcing.next_text(text)
    if complete:  # the rest is the closing header: nothing for the model to choose
        counts["forced_chars"] = counts.get("forced_chars", 0) + len(forced)
        return text + forced, "stop"
    if forced and _read_forced(llama, pick, forced, out):
        counts["forced_reads"] = counts.get("forced_reads", 0) + 1
        return llama.detokenize(out).decode("utf-8", errors="ignore"), "read"
    return text, None


def _cut_back(llama, pick: _GrammarPick, grammar_text: str, out: list[int], size: int, prompt_tokens: int,
              counts: dict) -> _GrammarPick:
    """Keep the first ``size`` of the ``out`` tokens after a loop: the grammar is replayed over them and the
    model's cache rewound to the last one (evaluated again next). Returns the replayed grammar pick."""
    counts["loops_cut"] = counts.get("loops_cut", 0) + 1
    counts["tokens_cut"] = counts.get("tokens_cut", 0) + len(out) - size
    replayed = _GrammarPick(llama, grammar_text)
    try:
        for t in out[:size]:
            replayed.accept(t)
    except BaseException:
        replayed.free()  # the caller still holds, and frees, the pick it passed in
        raise
    pick.free()
    del out[size:]
    llama.n_tokens = prompt_tokens + size - 1
    return replayed


def _ended(text: str) -> list:
    """The sentences of ``text`` that end in sentence marks."""
    return [s for s in sentence_spans(text) if s.marks]


def first_sentences(text: str, count: int) -> str:
    """``text`` up to the end of its ``count``-th sentence (all of it when it has fewer complete ones)."""
    done = _ended(text)[:count]
    return text[: done[-1].end] if len(done) == count else text


def sentence_stop(llama, prompt_tokens: int, count: int):
    """llama.cpp stopping criteria that end a completion once it holds ``count`` complete sentences and a
    character after the last one (so that a run of marks such as "?!" is whole); None for ``count`` 0."""
    if not count:
        return None

    def done(input_ids, _logits) -> bool:
        text = llama.detokenize(list(input_ids[prompt_tokens:])).decode("utf-8", errors="ignore")
        ended = _ended(text)
        return len(ended) >= count and len(text) > ended[count - 1].end

    return import_llama().StoppingCriteriaList([done])
