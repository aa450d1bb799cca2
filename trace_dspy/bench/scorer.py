"""The scorer bench: milliseconds per example of the empathy metric, embeddings cold and then cached."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import dspy

from trace_dspy.core.tables import markdown_table


def measure_scorer(examples: Sequence[dspy.Example], metric) -> dict[str, Any]:
    """Per-example cost of ``metric.evaluate`` on the gold replies: a first pass that embeds
    (cold), then a pass with every embedding cached (tokenization redone); wall and thread-CPU clocks."""
    preds = [dspy.Prediction(response=e.response, emotion=e.emotion, strategy="EX", secondary_strategy="ER")
             for e in examples]
    from trace_dspy.optimize import tokens

    passes = {}
    for name in ("cold", "cached"):
        tokens._tokens.cache_clear()  # only the embeddings count as cached, not the tokenization
        wall0, cpu0 = time.perf_counter(), time.thread_time()
        for example, pred in zip(examples, preds):
            metric.evaluate(example, pred)
        passes[name] = {"wall_ms_per_example": 1000 * (time.perf_counter() - wall0) / len(examples),
                        "cpu_ms_per_example": 1000 * (time.thread_time() - cpu0) / len(examples)}
    return {"examples": len(examples), "torch_threads": _torch_threads(), **passes}


def _torch_threads() -> int | None:
    try:
        import torch

        return torch.get_num_threads()
    except ImportError:
        return None


def scorer_markdown(result: dict[str, Any]) -> str:
    table = markdown_table(["pass", "wall ms / example", "thread CPU ms / example"],
                           [[name, f"{result[name]['wall_ms_per_example']:.2f}",
                             f"{result[name]['cpu_ms_per_example']:.2f}"] for name in ("cold", "cached")])
    return f"{result['examples']} ED test items (gold replies), metric.evaluate per example\n\n{table}"
