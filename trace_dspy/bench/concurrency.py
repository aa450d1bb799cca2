"""The concurrency bench: dialogues per second by thread count against a loopback server."""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import dspy

from trace_dspy.core.console import progress, with_dspy_context
from trace_dspy.core.tables import markdown_table


def measure_concurrency(examples: Sequence[dspy.Example], program, *, levels: Sequence[int] = (1, 2, 4, 8, 16, 32),
                        latency: float = 0.2, per_thread: int = 4, min_dialogues: int = 8) -> dict[str, Any]:
    """Dialogues per second at each thread count against a loopback server with a fixed latency."""
    from trace_dspy.testing.server import FakeChatServer

    if not examples or not levels or min(levels) < 1:
        raise ValueError("need examples and thread counts >= 1")
    results = []
    with FakeChatServer(latency=latency) as server:
        lm = dspy.LM("openai/fake", api_base=server.api_base, api_key="unused", cache=False, num_retries=0)
        with dspy.context(lm=lm):
            program(dialogue=examples[0].dialogue)  # warm up the client and its connection pool
            for threads in progress(levels, desc="concurrency"):
                count = max(min_dialogues, per_thread * threads)
                batch = [examples[i % len(examples)] for i in range(count)]
                requests_before = server.requests
                work = with_dspy_context(lambda ex: program(dialogue=ex.dialogue))
                started = time.perf_counter()
                with ThreadPoolExecutor(max_workers=threads) as pool:
                    list(pool.map(work, batch))
                wall = time.perf_counter() - started
                results.append({"threads": threads, "dialogues": count, "seconds": wall,
                                "dialogues_per_second": count / wall,
                                "lm_calls": server.requests - requests_before})
    base = results[0]["dialogues_per_second"]
    for r in results:
        r["speedup"] = r["dialogues_per_second"] / base
    return {"latency_s": latency, "levels": results}


def concurrency_markdown(result: dict[str, Any]) -> str:
    return markdown_table(
        ["threads", "dialogues", "LM calls", "seconds", "dialogues/s", "speedup vs 1"],
        [[r["threads"], r["dialogues"], r["lm_calls"], f"{r['seconds']:.2f}", f"{r['dialogues_per_second']:.2f}",
          f"{r['speedup']:.1f}x"] for r in result["levels"]], align="rrrrrr")
