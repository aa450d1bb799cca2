"""The embedded-model bench behind ``python -m trace_dspy.bench_local`` (and ``bench embedded``).

:func:`run_embedded` measures one thing, as :class:`EmbeddedOptions` asks: by default the program on ED
test dialogues with prefix reuse on and off, fast greedy against llama.cpp's own sampler, and the same
prompts through raw llama.cpp; or only Best-of-N, batched logits, the loop guard, prompt reading against
generation, or decode steps by batch size. It returns the markdown to print and writes the JSON record
to ``output`` when one is named.
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trace_dspy.bench.local import (
    measure_batch_logits,
    measure_batching,
    measure_best_of,
    measure_guard,
    measure_profile,
    run_program,
    run_raw,
)
from trace_dspy.core.jsonl import atomic_write_json
from trace_dspy.core.tables import markdown_table


@dataclass
class EmbeddedOptions:
    """What to measure (the ``bench_local`` flags) and the command line recorded with it."""

    data: str | None = None
    limit: int = 100
    reuse_limit: int = 20
    seed: int = 0
    no_raw: bool = False
    no_reuse_run: bool = False
    best_of: list[int] | None = None
    threads: int | None = None
    batching: bool = False
    guard: bool = False
    profile: bool = False
    batch_logits: bool = False
    output: Path | None = None
    command: str = "python -m trace_dspy.bench_local"


def write_record(path: Path | None, command: str, machine: dict, payload: dict) -> None:
    """The JSON record of a measurement, when ``path`` names one."""
    if path:
        atomic_write_json(path, {"command": command, "machine": machine, **payload})


def run_embedded(options: EmbeddedOptions) -> str:
    """Measure what ``options`` asks for; returns the markdown to print."""
    machine = {"python": platform.python_version(), "cpus": os.cpu_count()}
    if options.best_of:
        return _best_of(options, machine)
    if options.batch_logits:
        rows = measure_batch_logits(threads=options.threads or 2)
        write_record(options.output, options.command, machine, {"batch_logits": rows})
        return markdown_table(["position in batch", "max logit difference", "same top token"],
                              [[r["position_in_batch"], f"{r['max_abs_logit_diff']:.4f}", r["same_top_token"]]
                               for r in rows], align="rrl")
    if options.guard or options.profile:
        return _guard_or_profile(options, machine)
    if options.batching:
        rows = measure_batching()
        write_record(options.output, options.command, machine, {"batching": rows})
        return markdown_table(["threads", "sequences per batch", "ms per step", "ms per token"],
                              [[r["threads"], r["sequences"], f"{r['ms_per_step']:.1f}", f"{r['ms_per_token']:.1f}"]
                               for r in rows], align="rrrr")
    return _speed(options)


def _best_of(options: EmbeddedOptions, machine: dict) -> str:
    from trace_dspy.data.sources import load_test

    examples = load_test(options.data, view="trace", limit=options.limit, seed=options.seed)
    rows = measure_best_of(examples, options.best_of, threads=options.threads)
    write_record(options.output, options.command, machine, {"dialogues": len(examples), "best_of": rows})
    return markdown_table(["N", "seconds per dialogue", "cost vs first", "LM calls", "completion tokens"],
                          [[r["n"], f"{r['seconds_per_dialogue']:.2f}", f"{r['cost_vs_n1']:.2f}", r["lm_calls"],
                            r["completion_tokens"]] for r in rows], align="rrrrr")


def _guard_or_profile(options: EmbeddedOptions, machine: dict) -> str:
    """The loop guard off and on, or prompt reading against generation, with retrieval from the data's pool."""
    from trace_dspy.data.sources import load_test, resolve_source
    from trace_dspy.workflows.loading import load_for_run
    from trace_dspy.workflows.settings import Settings

    source = resolve_source(options.data, seed=options.seed)
    examples = load_test(source, view="trace", limit=options.limit, seed=options.seed)
    retriever = load_for_run("default", Settings(), data=source, seed=options.seed).program.retriever
    if options.profile:
        result = measure_profile(examples, retriever=retriever)
        write_record(options.output, options.command, machine, result)
        return markdown_table(["measure", "value"], [[key, f"{value:.3f}" if isinstance(value, float) else value]
                                                     for key, value in result.items()])
    result = measure_guard(examples, retriever=retriever)
    write_record(options.output, options.command, machine, result)
    table = markdown_table(["loop guard", "seconds per dialogue", "completion tokens", "loops cut"],
                           [[name, f"{result[name]['seconds_per_dialogue']:.2f}", result[name]["completion_tokens"],
                             result[name]["loop_guard"].get("loops_cut", 0)] for name in ("guard_off", "guard_on")])
    return (f"{table}\nidentical outputs: {result['identical_outputs']} of {result['dialogues']}; "
            f"speed-up {result['speedup']:.2f}x")


def _speed(options: EmbeddedOptions) -> str:
    """The default measurement: speed, prefix reuse on and off, fast greedy on and off, raw llama.cpp."""
    from trace_dspy.core.config import ProgramConfig
    from trace_dspy.data.sources import load_test

    examples = load_test(options.data, view="trace", limit=options.limit, seed=options.seed)
    config = ProgramConfig()
    runs: dict[str, Any] = {"with_reuse": run_program(examples, prefix_cache=True, program_config=config)}
    subset = examples[: options.reuse_limit]
    runs["subset"] = len(subset)
    if subset and not options.no_reuse_run:
        runs["without_reuse"] = run_program(subset, prefix_cache=False, program_config=config)
        # Same subset with reuse, for a like-for-like comparison.
        runs["with_reuse_subset_s"] = run_program(subset, prefix_cache=True,
                                                  program_config=config)["seconds_per_dialogue"]
    # The same subset with llama.cpp's own grammar sampler: the decoding before fast greedy.
    runs["slow"] = run_program(subset, prefix_cache=True, program_config=config, fast_greedy=False) if subset else None
    runs["fast_subset"] = runs["with_reuse"]["outputs"][: len(subset)]
    if runs["slow"]:
        runs["fast_s"] = run_program(subset, prefix_cache=True, program_config=config)["seconds_per_dialogue"]
    with_reuse = runs["with_reuse"]
    runs["raw"] = None if options.no_raw else run_raw(with_reuse["history"], with_reuse["n_threads"])
    if options.output:
        atomic_write_json(options.output, _speed_record(options.command, runs))
    return "| measure | value |\n| --- | --- |\n" + "\n".join(f"| {name} | {value} |"
                                                          for name, value in _speed_rows(runs))


def _speed_rows(runs: dict[str, Any]) -> list[tuple[str, Any]]:
    with_reuse, slow, raw, n = runs["with_reuse"], runs["slow"], runs["raw"], runs["subset"]
    without_reuse, with_reuse_subset_s = runs.get("without_reuse"), runs.get("with_reuse_subset_s")
    failures = with_reuse["first_attempt_parse_failures"]
    rows = [
        ("dialogues", with_reuse["dialogues"]),
        ("stage calls", with_reuse["stage_calls"]),
        ("stage calls that failed to parse on the first attempt",
         f"{failures} ({100 * failures / max(1, with_reuse['stage_calls']):.2f}%)"),
        ("stage calls that failed after the JSON fallback", with_reuse["final_parse_failures"]),
        ("seconds per dialogue (prefix reuse on)", f"{with_reuse['seconds_per_dialogue']:.2f}"),
        ("generated tokens/s, engine", f"{with_reuse['generated_tokens_per_s']:.1f}"),
        (f"seconds per dialogue, first {n}, reuse on / off",
         f"{with_reuse_subset_s:.2f} / {without_reuse['seconds_per_dialogue']:.2f}" if with_reuse_subset_s else "-"),
        ("prompt tokens per LM call", f"{with_reuse['prompt_tokens'] / max(1, with_reuse['lm_calls']):.0f}"),
    ]
    if slow:
        rows += [
            (f"seconds per dialogue, first {n}, fast greedy on / off (llama.cpp's sampler)",
             f"{runs['fast_s']:.2f} / {slow['seconds_per_dialogue']:.2f}"),
            (f"identical outputs, fast greedy on / off, first {n}",
             f"{sum(a == b for a, b in zip(runs['fast_subset'], slow['outputs']))} of {n}"),
        ]
    if raw:
        rows += [
            ("generated tokens, engine / raw (end tokens banned on the raw side)",
             f"{with_reuse['completion_tokens']} / {raw['completion_tokens']}"),
            (f"raw llama.cpp seconds, same prompts, {raw['n_threads']} threads", f"{raw['seconds']:.1f}"),
            (f"engine seconds on the same calls, {with_reuse['n_threads']} threads",
             f"{with_reuse['engine_seconds']:.1f}"),
            ("engine time / raw time", f"{with_reuse['engine_seconds'] / raw['seconds']:.2f}"),
            ("generated tokens/s, raw (prompt reading included)", f"{raw['generated_tokens_per_s']:.1f}"),
        ]
    return rows


def _speed_record(command: str, runs: dict[str, Any]) -> dict[str, Any]:
    def numbers(run: dict | None) -> dict:
        return {k: v for k, v in (run or {}).items() if k not in ("history", "outputs")}

    slow = runs["slow"]
    return {
        "command": command,
        "machine": {"python": platform.python_version(), "processor": platform.processor(), "cpus": os.cpu_count()},
        "with_reuse": numbers(runs["with_reuse"]),
        "fast_greedy_off": numbers(slow),
        "fast_greedy_on_subset_seconds_per_dialogue": runs.get("fast_s"),
        "identical_outputs_fast_vs_off": (sum(a == b for a, b in zip(runs["fast_subset"], slow["outputs"]))
                                          if slow else None),
        "without_reuse": numbers(runs.get("without_reuse")),
        "with_reuse_subset_seconds_per_dialogue": runs.get("with_reuse_subset_s"),
        "raw": runs["raw"],
    }
