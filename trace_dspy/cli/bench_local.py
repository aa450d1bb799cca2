"""Measure the embedded model: speed, prefix reuse, parse failures, raw llama.cpp.

    python -m trace_dspy.bench_local --data ../shared/data/empathetic_dialogues --limit 100

1. Runs the program on ``--limit`` ED test dialogues (TRACE view, seeded) with
   the embedded model: seconds per dialogue, generated tokens/s, stage calls
   that failed to parse (first attempt and final).
2. Runs the first ``--reuse-limit`` of them again with prefix reuse switched
   off, for the with/without comparison.
3. Replays the exact prompts of step 1 through llama-cpp-python directly
   (``Llama.create_completion`` on the same rendered prompt, the same number of
   generated tokens, no grammar, no state restore): the raw llama.cpp baseline.

Prints a markdown table and writes JSON with ``--output``.
"""

from __future__ import annotations

import argparse
import platform
import sys
from pathlib import Path

from trace_dspy.bench.local import (
    _write_record,
    measure_batch_logits,
    measure_batching,
    measure_best_of,
    measure_guard,
    measure_profile,
    run_program,
    run_raw,
)
from trace_dspy.cli.common import setup_logging
from trace_dspy.core.config import ProgramConfig
from trace_dspy.core.jsonl import atomic_write_json
from trace_dspy.core.tables import markdown_table
from trace_dspy.data.sources import load_test


def main(argv: list[str] | None = None, prog: str = "python -m trace_dspy.bench_local") -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", help="data source (default: $TRACE_DSPY_DATA, else the seed set)")
    parser.add_argument("--limit", type=int, default=100)
    parser.add_argument("--reuse-limit", type=int, default=20, help="dialogues for the no-reuse run")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-raw", action="store_true", help="skip the raw llama.cpp replay")
    parser.add_argument("--no-reuse-run", action="store_true", help="skip the prefix-reuse-off run")
    parser.add_argument("--best-of", type=lambda v: [int(x) for x in v.split(",")], metavar="N,N,...",
                        help="only measure Best-of-N on the reply stage for these N (the first is the baseline)")
    parser.add_argument("--threads", type=int, help="llama.cpp threads (default: the engine's)")
    parser.add_argument("--batching", action="store_true",
                        help="only measure decode steps with 1-8 sequences per llama.cpp batch")
    parser.add_argument("--guard", action="store_true",
                        help="only compare the loop guard off and on (with retrieval from the data's pool)")
    parser.add_argument("--profile", action="store_true",
                        help="only time prompt reading against generation (with retrieval from the data's pool)")
    parser.add_argument("--batch-logits", action="store_true",
                        help="only check whether batched logits equal one-token-at-a-time logits")
    parser.add_argument("--output", type=Path, help="write the results as JSON")
    args = parser.parse_args(argv)
    setup_logging()
    command = "python -m trace_dspy.bench_local " + " ".join(argv if argv is not None else sys.argv[1:])
    machine = {"python": platform.python_version(), "cpus": __import__("os").cpu_count()}
    if args.best_of:
        examples = load_test(args.data, view="trace", limit=args.limit, seed=args.seed)
        rows = measure_best_of(examples, args.best_of, threads=args.threads)
        print(markdown_table(["N", "seconds per dialogue", "cost vs first", "LM calls", "completion tokens"],
                             [[r["n"], f"{r['seconds_per_dialogue']:.2f}", f"{r['cost_vs_n1']:.2f}", r["lm_calls"],
                               r["completion_tokens"]] for r in rows], align="rrrrr"))
        _write_record(args.output, command, machine, {"dialogues": len(examples), "best_of": rows})
        return 0
    if args.batch_logits:
        rows = measure_batch_logits(threads=args.threads or 2)
        print(markdown_table(["position in batch", "max logit difference", "same top token"],
                             [[r["position_in_batch"], f"{r['max_abs_logit_diff']:.4f}", r["same_top_token"]]
                              for r in rows], align="rrl"))
        _write_record(args.output, command, machine, {"batch_logits": rows})
        return 0
    if args.guard or args.profile:
        from trace_dspy.cli.common import Settings
        from trace_dspy.data.sources import resolve_source
        from trace_dspy.workflows.loading import load_for_run

        source = resolve_source(args.data, seed=args.seed)
        examples = load_test(source, view="trace", limit=args.limit, seed=args.seed)
        retriever = load_for_run("default", Settings(), data=source, seed=args.seed).program.retriever
        if args.profile:
            result = measure_profile(examples, retriever=retriever)
            print(markdown_table(["measure", "value"], [[key, f"{value:.3f}" if isinstance(value, float) else value]
                                                        for key, value in result.items()]))
            _write_record(args.output, command, machine, result)
            return 0
        result = measure_guard(examples, retriever=retriever)
        print(markdown_table(["loop guard", "seconds per dialogue", "completion tokens", "loops cut"],
                             [[name, f"{result[name]['seconds_per_dialogue']:.2f}", result[name]["completion_tokens"],
                               result[name]["loop_guard"].get("loops_cut", 0)] for name in ("guard_off", "guard_on")]))
        print(f"identical outputs: {result['identical_outputs']} of {result['dialogues']}; "
              f"speed-up {result['speedup']:.2f}x")
        _write_record(args.output, command, machine, result)
        return 0
    if args.batching:
        rows = measure_batching()
        print(markdown_table(["threads", "sequences per batch", "ms per step", "ms per token"],
                             [[r["threads"], r["sequences"], f"{r['ms_per_step']:.1f}", f"{r['ms_per_token']:.1f}"]
                              for r in rows], align="rrrr"))
        _write_record(args.output, command, machine, {"batching": rows})
        return 0

    examples = load_test(args.data, view="trace", limit=args.limit, seed=args.seed)
    config = ProgramConfig()
    with_reuse = run_program(examples, prefix_cache=True, program_config=config)
    subset = examples[: args.reuse_limit]
    without_reuse, with_reuse_subset_s = None, None
    if subset and not args.no_reuse_run:
        without_reuse = run_program(subset, prefix_cache=False, program_config=config)
        # Same subset with reuse, for a like-for-like comparison.
        with_reuse_subset_s = run_program(subset, prefix_cache=True, program_config=config)["seconds_per_dialogue"]
    # The same subset with llama.cpp's own grammar sampler: the decoding before fast greedy.
    slow = run_program(subset, prefix_cache=True, program_config=config, fast_greedy=False) if subset else None
    fast_subset = with_reuse["outputs"][: len(subset)]
    fast_s = None
    if slow:
        fast_s = run_program(subset, prefix_cache=True, program_config=config)["seconds_per_dialogue"]
    raw = None if args.no_raw else run_raw(with_reuse["history"], with_reuse["n_threads"])

    rows = [
        ("dialogues", with_reuse["dialogues"]),
        ("stage calls", with_reuse["stage_calls"]),
        ("stage calls that failed to parse on the first attempt",
         f"{with_reuse['first_attempt_parse_failures']} ({100 * with_reuse['first_attempt_parse_failures'] / max(1, with_reuse['stage_calls']):.2f}%)"),
        ("stage calls that failed after the JSON fallback", with_reuse["final_parse_failures"]),
        ("seconds per dialogue (prefix reuse on)", f"{with_reuse['seconds_per_dialogue']:.2f}"),
        ("generated tokens/s, engine", f"{with_reuse['generated_tokens_per_s']:.1f}"),
        (f"seconds per dialogue, first {len(subset)}, reuse on / off",
         f"{with_reuse_subset_s:.2f} / {without_reuse['seconds_per_dialogue']:.2f}" if with_reuse_subset_s else "-"),
        ("prompt tokens per LM call", f"{with_reuse['prompt_tokens'] / max(1, with_reuse['lm_calls']):.0f}"),
    ]
    if slow:
        rows += [
            (f"seconds per dialogue, first {len(subset)}, fast greedy on / off (llama.cpp's sampler)",
             f"{fast_s:.2f} / {slow['seconds_per_dialogue']:.2f}"),
            (f"identical outputs, fast greedy on / off, first {len(subset)}",
             f"{sum(a == b for a, b in zip(fast_subset, slow['outputs']))} of {len(subset)}"),
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
    print("| measure | value |\n| --- | --- |")
    for name, value in rows:
        print(f"| {name} | {value} |")
    if args.output:
        result = {
            "command": "python -m trace_dspy.bench_local " + " ".join(argv if argv is not None else sys.argv[1:]),
            "machine": {"python": platform.python_version(), "processor": platform.processor(),
                        "cpus": __import__("os").cpu_count()},
            "with_reuse": {k: v for k, v in with_reuse.items() if k not in ("history", "outputs")},
            "fast_greedy_off": {k: v for k, v in (slow or {}).items() if k not in ("history", "outputs")},
            "fast_greedy_on_subset_seconds_per_dialogue": fast_s,
            "identical_outputs_fast_vs_off": (sum(a == b for a, b in zip(fast_subset, slow["outputs"]))
                                              if slow else None),
            "without_reuse": {k: v for k, v in (without_reuse or {}).items() if k not in ("history", "outputs")},
            "with_reuse_subset_seconds_per_dialogue": with_reuse_subset_s,
            "raw": raw,
        }
        atomic_write_json(args.output, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
