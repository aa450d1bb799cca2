"""Embedded-model measurements: seconds per dialogue, tokens/s, prefix reuse, parse failures and the raw
llama.cpp replay behind ``python -m trace_dspy.bench_local`` (see :mod:`trace_dspy.cli.bench_local`)."""

from __future__ import annotations

import time

import dspy

from trace_dspy.core.config import ProgramConfig
from trace_dspy.core.console import progress
from trace_dspy.program.pipeline import TraceProgram


def run_program(examples, *, prefix_cache: bool, program_config: ProgramConfig, fast_greedy: bool = True,
                loop_guard: bool = True, retriever=None) -> dict:
    from trace_dspy.lm.adapters import parse_failures
    from trace_dspy.lm.specs import local_lm

    lm = local_lm(cache=False, prefix_cache=prefix_cache, fast_greedy=fast_greedy, loop_guard=loop_guard)
    failures_before = sum(parse_failures().values())
    program = TraceProgram(program_config, retriever=retriever)
    engine = lm.engine
    engine.stats.log = []  # every engine call, for the raw replay (Best-of-N candidates included)
    stage_calls = final_failures = 0
    per_dialogue, outputs = [], []
    with dspy.context(lm=lm):
        for ex in progress(examples, desc=f"program (prefix reuse {'on' if prefix_cache else 'off'}, "
                                          f"fast greedy {'on' if fast_greedy else 'off'})"):
            started = time.perf_counter()
            stages_before = engine.stats.calls
            try:
                outputs.append(program(dialogue=ex.dialogue).toDict())
                stage_calls += 4 - len(program.config.disabled)
            except dspy.utils.exceptions.AdapterParseError:
                final_failures += 1
                stage_calls += 1  # the stage that failed; later stages never ran
                outputs.append(None)
            per_dialogue.append((time.perf_counter() - started, engine.stats.calls - stages_before))
    stats = engine.stats
    lm_calls = stats.calls
    first_failures = sum(parse_failures().values()) - failures_before
    return {
        "dialogues": len(examples),
        "seconds_per_dialogue": sum(t for t, _ in per_dialogue) / len(examples),
        "lm_calls": lm_calls,
        "stage_calls": stage_calls,
        # Counted in the adapters' parse (each is followed by DSPy's JSONAdapter fallback, one more LM call).
        "first_attempt_parse_failures": first_failures,
        "n_threads": engine.n_threads,
        "final_parse_failures": final_failures,
        "prompt_tokens": stats.prompt_tokens,
        "completion_tokens": stats.completion_tokens,
        "engine_seconds": stats.seconds,
        "loop_guard": dict(engine.guard_counts),
        "completion_tokens_by_stage": _tokens_by_stage(engine.stats.log),
        "generated_tokens_per_s": stats.completion_tokens / stats.seconds,
        "outputs": outputs,
        # One entry per engine call (a Best-of-N reply is several): what the raw replay runs again.
        "history": list(engine.stats.log),
    }


def _tokens_by_stage(history: list[dict]) -> dict[str, int]:
    """Completion tokens per stage, named by each call's first output field."""
    from trace_dspy.lm.prompts import output_fields

    out: dict[str, int] = {}
    for h in history:
        messages = h.get("messages") or []
        fields = output_fields(messages[0]["content"]) if messages and messages[0]["role"] == "system" else None
        name = fields[0][0] if fields else "response (chat layout)"
        out[name] = out.get(name, 0) + (h.get("completion_tokens") or 0)
    return out


def measure_guard(examples, retriever=None) -> dict:
    """The same dialogues with the loop guard off, then on: time, tokens, what changed."""
    config = ProgramConfig()
    run_program(examples[:1], prefix_cache=True, program_config=config, retriever=retriever)  # warm the prefixes
    off = run_program(examples, prefix_cache=True, program_config=config, loop_guard=False, retriever=retriever)
    on = run_program(examples, prefix_cache=True, program_config=config, retriever=retriever)
    keys = ("seconds_per_dialogue", "lm_calls", "prompt_tokens", "completion_tokens", "engine_seconds",
            "loop_guard", "completion_tokens_by_stage")
    return {"dialogues": len(examples), "retrieval": retriever is not None,
            "guard_off": {k: off[k] for k in keys}, "guard_on": {k: on[k] for k in keys},
            "identical_outputs": sum(a == b for a, b in zip(off["outputs"], on["outputs"])),
            "speedup": off["seconds_per_dialogue"] / on["seconds_per_dialogue"]}


def measure_profile(examples, retriever=None) -> dict:
    """Where the engine's time goes: prompt tokens read in batches against tokens generated one by one."""
    import llama_cpp

    from trace_dspy.lm.specs import local_lm

    config = ProgramConfig()
    lm = local_lm(cache=False)
    program = TraceProgram(config, retriever=retriever)
    with dspy.context(lm=lm):
        program(dialogue=examples[0].dialogue)  # warm the stage prefixes
    parts = {"prompt": [0, 0.0], "generated": [0, 0.0]}
    plain_eval = llama_cpp.Llama.eval

    def timed_eval(self, tokens):
        started = time.perf_counter()
        plain_eval(self, tokens)
        part = parts["generated" if len(tokens) == 1 else "prompt"]
        part[0] += len(tokens)
        part[1] += time.perf_counter() - started

    llama_cpp.Llama.eval = timed_eval
    try:
        started = time.perf_counter()
        with dspy.context(lm=lm):
            for ex in progress(examples, desc="profile"):
                program(dialogue=ex.dialogue)
        total = time.perf_counter() - started
    finally:
        llama_cpp.Llama.eval = plain_eval
    n = len(examples)
    return {"dialogues": n, "retrieval": retriever is not None, "seconds_per_dialogue": total / n,
            **{f"{name}_tokens_per_dialogue": count / n for name, (count, _) in parts.items()},
            **{f"{name}_ms_per_token": 1000 * secs / max(1, count) for name, (count, secs) in parts.items()},
            **{f"{name}_share_of_time": secs / total for name, (_, secs) in parts.items()}}


def measure_batch_logits(threads: int = 2, positions: int = 16) -> list[dict]:
    """Do logits read in one batch equal those of one token at a time? Max difference per position.

    Identical greedy answers from multi-token or multi-sequence batches need
    identical logits; this checks it on the embedded model.
    """
    import llama_cpp
    import numpy as np

    from trace_dspy.lm.model_files import default_model_path

    llm = llama_cpp.Llama(model_path=str(default_model_path()), n_ctx=1024, n_threads=threads,
                          n_threads_batch=threads, verbose=False)
    text = ("Speaker: I lost my wallet on the bus today and I do not know what to do now. "
            "Listener: Oh no, that is awful, did anyone hand it in?")
    ids = llm.tokenize(text.encode())[: 10 + positions]
    llm.eval(ids[:10])
    start, vocab = llm.n_tokens, llm.n_vocab()

    def last() -> np.ndarray:
        return np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1), shape=(vocab,)).copy()

    single = []
    for t in ids[10:]:
        llm.eval([t])
        single.append(last())
    llm.n_tokens = start
    llm._ctx.kv_cache_seq_rm(-1, start, -1)
    batch = ids[10:]
    llm._batch.set_batch(batch=batch, n_past=start, logits_all=True)
    llm._ctx.decode(llm._batch)
    rows = []
    for i, ref in enumerate(single):
        got = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm._ctx.ctx, i), shape=(vocab,))
        rows.append({"position_in_batch": i, "max_abs_logit_diff": round(float(np.abs(got - ref).max()), 4),
                     "same_top_token": bool(np.argmax(got) == np.argmax(ref))})
    llm.close()
    return rows


def run_raw(history: list[dict], n_threads: int) -> dict:
    """The same prompts straight through llama-cpp-python, no grammar, no state restore.

    Timed as the engine times itself: from the tokenized prompt to the last generated token, per call, summed
    (rendering and tokenizing are outside both clocks). The end-of-generation tokens are banned, so every
    call generates exactly the engine's number of tokens; ``n_threads`` is the engine's.
    """
    import llama_cpp
    from llama_cpp import Llama

    from trace_dspy.lm.model_files import default_model_path
    from trace_dspy.lm.models import chat_formatters

    llama = Llama(str(default_model_path()), n_ctx=4096, n_threads=n_threads, n_threads_batch=n_threads, seed=0,
                  verbose=False)
    fmt, _ = chat_formatters(llama)
    vocab = llama._model.vocab
    banned = {t: float("-inf") for t in range(llama.n_vocab()) if llama_cpp.llama_vocab_is_eog(vocab, t)}
    seconds = 0.0
    prompt_tokens = completion_tokens = 0
    for item in progress(history, desc="raw llama.cpp"):
        rendered = fmt(messages=item["messages"])
        tokens = llama.tokenize(rendered.prompt.encode(), add_bos=not rendered.added_special, special=True)
        n = max(1, item["completion_tokens"])
        started = time.perf_counter()
        out = llama.create_completion(prompt=tokens, max_tokens=n, temperature=0.0, stop=[], logit_bias=banned)
        seconds += time.perf_counter() - started
        prompt_tokens += len(tokens)
        completion_tokens += out["usage"]["completion_tokens"]
    return {"calls": len(history), "n_threads": n_threads, "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens, "seconds": seconds,
            "generated_tokens_per_s": completion_tokens / seconds}


def measure_batching(thread_counts=(1, 2), sequence_counts=(1, 2, 4, 8), steps: int = 30) -> list[dict]:
    """What one decode step costs with several sequences in one llama.cpp batch.

    Each sequence first reads the same short chat prompt; then ``steps`` decode
    steps each add one token to every sequence. Returns ms per step and per token.
    """
    import llama_cpp

    from trace_dspy.lm.model_files import default_model_path

    llama = llama_cpp.Llama(model_path=str(default_model_path()), n_ctx=512, n_threads=1, verbose=False)
    prompt = llama.tokenize(b"<|im_start|>user\nI failed my driving test again and I feel awful about it."
                            b"<|im_end|>\n<|im_start|>assistant\n", add_bos=False, special=True)
    rows = []
    try:
        for threads in thread_counts:
            params = llama_cpp.llama_context_default_params()
            params.n_ctx, params.n_batch, params.n_ubatch = 4096, 512, 512
            params.n_seq_max, params.kv_unified = max(sequence_counts), True
            params.n_threads = params.n_threads_batch = threads
            ctx = llama_cpp.llama_init_from_model(llama._model.model, params)
            batch = llama_cpp.llama_batch_init(512, 0, max(sequence_counts))
            try:
                for n_seq in sequence_counts:
                    llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(ctx), True)
                    k = 0
                    for seq in range(n_seq):
                        for i, token in enumerate(prompt):
                            batch.token[k], batch.pos[k], batch.n_seq_id[k] = token, i, 1
                            batch.seq_id[k][0], batch.logits[k] = seq, i == len(prompt) - 1
                            k += 1
                    batch.n_tokens = k
                    llama_cpp.llama_decode(ctx, batch)
                    started = time.perf_counter()
                    for step in range(steps):
                        for seq in range(n_seq):
                            batch.token[seq], batch.pos[seq], batch.n_seq_id[seq] = 100 + step, len(prompt) + step, 1
                            batch.seq_id[seq][0], batch.logits[seq] = seq, True
                        batch.n_tokens = n_seq
                        llama_cpp.llama_decode(ctx, batch)
                    ms = 1000 * (time.perf_counter() - started) / steps
                    rows.append({"threads": threads, "sequences": n_seq, "ms_per_step": round(ms, 2),
                                 "ms_per_token": round(ms / n_seq, 2)})
            finally:
                llama_cpp.llama_batch_free(batch)
                llama_cpp.llama_free(ctx)
    finally:
        llama.close()
    return rows


def measure_best_of(examples, sizes=(1, 2, 4), threads: int | None = None) -> list[dict]:
    """Seconds per dialogue when the reply stage is ``dspy.BestOfN`` with N candidates.

    N = 1 is the plain program (greedy). For N > 1 DSPy's BestOfN calls the reply
    stage N times at temperature 1.0 with distinct rollout ids; the reward here
    never reaches its threshold, so all N candidates are drawn: the cost of the
    worst case.
    """
    from trace_dspy.lm.specs import local_lm

    kwargs = {} if threads is None else {"n_threads": threads}
    with dspy.context(lm=local_lm(cache=False, **kwargs)):  # load the model and the stages' prefixes first
        TraceProgram(ProgramConfig())(dialogue=examples[0].dialogue)
    rows = []
    for n in sizes:
        lm = local_lm(cache=False, **kwargs)
        program = TraceProgram(ProgramConfig())
        if n > 1:
            plain_call = program._call

            def call(stage, state, n=n, plain_call=plain_call, program=program):
                if stage != "generate_response":
                    return plain_call(stage, state)
                writer = program.writer()
                with program._stage_context(stage, writer):
                    fields = program.generate_response.signature.input_fields
                    selection, inputs = writer.selection(program, program.generate_response,
                                                         {name: state[name] for name in fields})
                    return dspy.BestOfN(module=selection.module, N=n, reward_fn=lambda args, pred: 0.0,
                                        threshold=1.0)(**inputs)

            program._call = call
        replies = []
        started = time.perf_counter()
        with dspy.context(lm=lm):
            for ex in progress(examples, desc=f"best of {n}"):
                replies.append(program(dialogue=ex.dialogue).response)
        seconds = (time.perf_counter() - started) / len(examples)
        rows.append({"n": n, "seconds_per_dialogue": round(seconds, 3), "lm_calls": lm.engine.stats.calls,
                     "completion_tokens": lm.engine.stats.completion_tokens})
    base = rows[0]["seconds_per_dialogue"]
    for r in rows:
        r["cost_vs_n1"] = round(r["seconds_per_dialogue"] / base, 3)
    return rows




