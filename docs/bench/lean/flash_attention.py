#!/usr/bin/env python
"""llama.cpp's flash attention on and off, for the embedded model on this machine.

Usage: flash_attention.py OUT.json [ITEMS]

Two measurements, written to OUT.json:

- ``kernel``: the raw model (loaded as the engine loads it) reading a prompt of 100 and of 500 tokens, then
  generating 20 tokens one at a time after it; best and worst of 3 rounds, prompt tokens per second and
  milliseconds per generated token.
- ``program``: ``trace-dspy@v6`` on the first ITEMS (default 20) ED test items of the bench's seeded sample,
  once with each setting. The two programs alternate item by item (which one goes first alternates too), so
  that a change in the machine's speed during the run falls on both sides alike. DSPy's cache is off.

Needs TRACE_DSPY_DATA (the EmpatheticDialogues folder).
"""
import json
import platform
import sys
import time

import dspy
import llama_cpp

import trace_dspy
from trace_dspy.data.sources import load_test
from trace_dspy.lm.model_files import default_model_path, plain_weight_buffers

THREADS = 2
TEXT = "I was thinking about the weekend, and about how the week went at work with my friends. " * 40


def kernel() -> list[dict]:
    models = {}
    for fa in (True, False):
        with plain_weight_buffers(llama_cpp):
            models[fa] = llama_cpp.Llama(model_path=str(default_model_path()), n_ctx=2048, n_threads=THREADS,
                                         n_threads_batch=THREADS, flash_attn=fa, verbose=False)
    tokens = models[True].tokenize(TEXT.encode())
    runs = []
    for _ in range(3):
        for fa, llm in models.items():
            for length in (100, 500):
                llm.reset()
                start = time.perf_counter()
                llm.eval(tokens[:length])
                read = time.perf_counter() - start
                start = time.perf_counter()
                for i in range(20):
                    llm.eval([tokens[length + i]])
                runs.append({"flash_attn": fa, "context": length, "prompt_tokens_per_s": length / read,
                             "ms_per_generated_token": (time.perf_counter() - start) / 20 * 1000})
    for llm in models.values():
        llm.close()
    table = []
    for fa in (True, False):
        for length in (100, 500):
            same = [r for r in runs if r["flash_attn"] == fa and r["context"] == length]
            table.append({"flash_attn": fa, "context": length,
                          "prompt_tokens_per_s": [round(min(r["prompt_tokens_per_s"] for r in same)),
                                                  round(max(r["prompt_tokens_per_s"] for r in same))],
                          "ms_per_generated_token": [round(min(r["ms_per_generated_token"] for r in same), 1),
                                                     round(max(r["ms_per_generated_token"] for r in same), 1)]})
    return table


def program(items: int) -> dict:
    dspy.configure_cache(enable_disk_cache=False, enable_memory_cache=False)
    programs = {}
    for fa in (True, False):
        prog = trace_dspy.load("trace-dspy@v6")
        for lm in prog.stage_lms.values():
            lm.engine.flash_attn = fa
        assert prog.stage_lms, "the artifact attached no LMs"
        programs[fa] = prog
    examples = load_test(view="trace", limit=200, seed=0)[: items + 1]
    for prog in programs.values():  # loads the model, the encoder and the saved states
        prog(dialogue=examples[0].dialogue)
    seconds = {True: 0.0, False: 0.0}
    same = 0
    replies = []
    for n, example in enumerate(examples[1:]):
        out = {}
        for fa in ((True, False) if n % 2 == 0 else (False, True)):
            start = time.perf_counter()
            out[fa] = programs[fa](dialogue=example.dialogue).response
            seconds[fa] += time.perf_counter() - start
        same += out[True] == out[False]
        replies.append({"dialogue": example.dialogue, "flash_attn_on": out[True], "flash_attn_off": out[False]})
    return {"artifact": "trace-dspy@v6", "items": items,
            "seconds_per_dialogue": {"flash_attn_on": round(seconds[True] / items, 3),
                                     "flash_attn_off": round(seconds[False] / items, 3)},
            "ratio_off_to_on": round(seconds[False] / seconds[True], 3),
            "same_reply": same, "replies": replies}


def main(out_path: str, items: int = 20) -> None:
    record = {"command": " ".join(["python", *sys.argv]),
              "machine": {"cpus": THREADS, "platform": platform.platform(), "llama_cpp": llama_cpp.__version__},
              "kernel": kernel(), "program": program(items)}
    with open(out_path, "w", encoding="utf-8") as fh:
        json.dump(record, fh, indent=1)
    for row in record["kernel"]:
        print(row)
    print({k: v for k, v in record["program"].items() if k != "replies"})


if __name__ == "__main__":
    main(sys.argv[1], *(int(a) for a in sys.argv[2:3]))
