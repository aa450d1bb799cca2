"""Benchmarks: what the compiled program buys, what it costs, and the performance budget.

    python -m trace_dspy.bench                  # the quality bench (same as `bench quality`)
    python -m trace_dspy.bench quality --limit 200 --optimizers labeled,bootstrap
    python -m trace_dspy.bench overhead         # framework time per stage, zero-latency fake LM
    python -m trace_dspy.bench concurrency      # throughput by thread count, 200 ms loopback server
    python -m trace_dspy.bench embedded         # the embedded model against raw llama.cpp
    python -m trace_dspy.bench compile          # default compile, cold and then warm cache
    python -m trace_dspy.bench latency          # what a person waits for, start-up included, embedded model
    python -m trace_dspy.bench blind prepare --a A.jsonl --b B.jsonl --out DIR   # a blind reading of two
    python -m trace_dspy.bench blind score --dir DIR                             # programs' replies, tallied

Every sub-command but ``blind`` prints a markdown table, writes ``<name>.md`` and
``<name>.json`` (numbers only, no dataset text) to ``--output-dir`` and logs an
MLflow run to the ``trace-dspy-bench`` experiment. The quality bench compares,
on one seeded EmpatheticDialogues test subset and one LM:

- ``single_cot``: one ChainOfThought call from dialogue to emotion and reply;
- ``trace_paper``: the staged program with instructions that restate the
  published agents' prompts, uncompiled;
- ``trace``: this project's TraceProgram, uncompiled;
- ``compiled_<optimizer>``: TraceProgram compiled on the train split by each
  optimizer given with ``--optimizers``; and any ``--artifact`` references.

Each system gets the evaluation suite, paired-bootstrap 95% intervals of its
per-example differences against the first system, and its cost per dialogue
(LM calls, prompt and completion tokens, seconds), with what 1,000 dialogues
would cost on a hosted LM at ``--price-input`` and ``--price-output`` (USD per
million tokens), beside the single call's. The runs are
:mod:`trace_dspy.bench.runs`; the measurements are the library API in
:mod:`trace_dspy.bench.suite` (``run_quality``, ``measure_overhead``,
``measure_concurrency``, ``measure_compile``, ``measure_latency``).

The latency bench times whole processes on the embedded model: ``respond`` with a
new DSPy cache (``cold``), a batch of everyday messages against the raw model
answering them (``anchor``), and ``respond`` beside CPU-bound processes
(``contention``). It refuses to start on a machine whose load average is above
``--max-load`` (exit 2) unless ``--force``, and exits 1 when a run failed (the
others' numbers are kept in the record).
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from trace_dspy.bench.latency import BusyMachine
from trace_dspy.bench.records import BENCH_EXPERIMENT
from trace_dspy.bench.runs import DEFAULT_OUTPUT, Where, run_bench
from trace_dspy.bench.systems import BASE_SYSTEMS
from trace_dspy.cli.common import (
    add_pricing_args,
    add_run_args,
    add_situations_arg,
    command_parser,
    fail,
    failure_rate,
    output_dir,
    run_embedded_command,
    settings_from_args,
    setup_logging,
)
from trace_dspy.core.config import ConfigError
from trace_dspy.core.console import out, say
from trace_dspy.data.sources import DataError
from trace_dspy.workflows.evaluation import FailureRateExceeded

SUBCOMMANDS = ("quality", "overhead", "concurrency", "embedded", "compile", "scorer", "emotion", "prior", "scale",
               "latency", "blind")


def _int_list(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError("expected integers >= 1")
    return values


def _k_list(text: str) -> list[int]:
    from trace_dspy.core.config import MAX_PRIOR_K

    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 0 or max(values) > MAX_PRIOR_K:
        raise argparse.ArgumentTypeError(f"expected integers from 0 to {MAX_PRIOR_K}")
    return values


def _names(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


HELP = {
    "quality": "compare systems on the same ED test subset (the default)",
    "overhead": "framework time per stage call with a zero-latency fake LM",
    "concurrency": "throughput by thread count against a loopback fake server",
    "embedded": "the embedded model against raw llama.cpp (bench_local)",
    "compile": "wall time and LM calls of the default compile, cold then warm cache",
    "scorer": "milliseconds per example of the empathy metric, embeddings cold then cached",
    "emotion": "emotion accuracy: majority, the fitted prior, the stage with and without it",
    "prior": "the emotion prior's variants and the shipped prior on dev and all test items",
    "scale": "the plain batch against Spark local mode, same items, latency-bound fake LM",
    "latency": "what a person waits for on the embedded model, each phase in fresh processes (start-up included)",
    "blind": "a blind reading of two programs' replies to the same messages: prepare it, then score it",
}


def _quality_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--limit", type=int, default=200, help="test samples, seeded (default 200)")
    p.add_argument("--view", choices=("trace", "cem"), default="trace")
    p.add_argument("--systems", type=_names, default=list(BASE_SYSTEMS),
                   help=f"uncompiled systems, the first is the baseline (default {','.join(BASE_SYSTEMS)})")
    p.add_argument("--optimizers", type=_names, default=["labeled", "bootstrap"],
                   help="compile TraceProgram with each (default labeled,bootstrap; '' for none)")
    p.add_argument("--artifact", action="append", default=[], metavar="REF",
                   help="also compare a compiled artifact (repeatable)")
    p.add_argument("--train", type=int, default=16, help="train examples for the optimizers")
    p.add_argument("--dev", type=int, default=16, help="dev examples for the optimizers")
    p.add_argument("--threads", type=int, default=1,
                   help="evaluation threads (default 1, so that seconds per dialogue are not shared)")
    p.add_argument("--max-failure-rate", type=failure_rate, default=0.5)
    p.add_argument("--fresh", action="store_true", help="ignore rows of an earlier run")
    add_pricing_args(p)


def _overhead_args(p: argparse.ArgumentParser) -> None:
    from trace_dspy.bench.overhead import CLOCKS

    p.add_argument("--dialogues", type=int, default=100)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                   help="wall time, or the thread's CPU time (steadier on a shared machine)")
    p.add_argument("--trace", action="store_true",
                   help="record each dialogue as an MLflow trace, as evaluate does (a temporary store)")


def _concurrency_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--latency", type=float, default=0.2, help="server latency per call, seconds")
    p.add_argument("--levels", type=_int_list, default=[1, 2, 4, 8, 16, 32], help="thread counts")
    p.add_argument("--per-thread", type=int, default=4, help="dialogues per thread at each level")


def _emotion_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--limit", type=int, default=300, help="seeded test items for the stage (default 300)")
    p.add_argument("--k", type=_k_list, default=[0, 2, 3], help="candidate counts; 0 = the LM alone")
    p.add_argument("--prior", choices=("fitted", "shipped"), default="fitted",
                   help="fitted: fit one on the source's training side, as compile does (default); "
                        "shipped: the prior packaged with trace-dspy, as seed-set programs use")
    add_situations_arg(p)


def _scorer_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--limit", type=int, default=500, help="ED test items (default 500)")


def _scale_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--items", type=int, default=200, help="test dialogues, seeded (default 200)")
    p.add_argument("--latency", type=float, default=0.2, help="fake server latency per call, seconds")
    p.add_argument("--threads", type=_int_list, default=[1, 2], help="plain batch thread counts")
    p.add_argument("--master", default="local[2]", help="Spark master (default local[2])")
    p.add_argument("--partitions", type=int, default=None, help="Spark partitions (default: parallelism)")
    p.add_argument("--task-threads", type=_int_list, default=[1],
                   help="rows each Spark task answers at once, one Spark run per value (default 1)")


def _compile_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--optimizer", default=None, help="default: the compile command's default")
    p.add_argument("--train", type=int, default=16)
    p.add_argument("--dev", type=int, default=16)


def _latency_args(p: argparse.ArgumentParser) -> None:
    from trace_dspy.bench.latency import CONTENTION_MESSAGE, PHASES

    p.add_argument("--phases", type=_names, default=list(PHASES), help=f"default {','.join(PHASES)}")
    p.add_argument("--repeats", type=int, default=3,
                   help="cold: different messages, each in its own process; contention: rounds (default 3)")
    p.add_argument("--competing", type=_int_list, default=[1, 3], metavar="K,K",
                   help="CPU-bound processes beside respond in the contention phase (default 1,3)")
    p.add_argument("--messages", type=Path, metavar="FILE",
                   help='the anchor\'s dialogues, JSONL of {"turns": [...]}; the first 8 are used '
                        "(default docs/bench/everyday/messages.jsonl)")
    p.add_argument("--message", default=CONTENTION_MESSAGE, help="the contention phase's message")
    p.add_argument("--cold-cache", action="store_true",
                   help="cold runs also get a new, empty $TRACE_DSPY_CACHE (a first run ever); default: yours")
    p.add_argument("--program", help="passed to respond (default: respond's default program)")
    p.add_argument("--config", metavar="TOML", help="passed to respond")
    p.add_argument("--timeout", dest="run_timeout", type=float, default=300.0, metavar="SECONDS",
                   help="seconds one run may take; then its processes are killed and it is reported (default 300)")
    p.add_argument("--max-load", type=float, default=0.5,
                   help="refuse to start when the 1-minute load average is above this (default 0.5)")
    p.add_argument("--force", action="store_true", help="measure even on a busy machine (the record says so)")


# Each sub-command's own flags, and the names of the options its run takes (its flags' dests).
OWN_ARGS = {"quality": _quality_args, "overhead": _overhead_args, "concurrency": _concurrency_args,
            "emotion": _emotion_args, "prior": add_situations_arg, "scorer": _scorer_args, "scale": _scale_args,
            "compile": _compile_args, "latency": _latency_args}
OPTIONS = {
    "quality": ("limit", "view", "systems", "optimizers", "artifact", "train", "dev", "threads", "max_failure_rate",
                "fresh", "price_input", "price_output"),
    "overhead": ("dialogues", "warmup", "clock", "trace"),
    "concurrency": ("levels", "latency", "per_thread"),
    "emotion": ("limit", "k", "prior", "situations"),
    "prior": ("situations",),
    "scorer": ("limit",),
    "scale": ("items", "latency", "threads", "master", "partitions", "task_threads"),
    "compile": ("optimizer", "train", "dev"),
    "latency": ("phases", "repeats", "competing", "messages", "message", "cold_cache", "program", "config",
                "run_timeout", "max_load", "force"),
}


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    parser = command_parser("bench", __doc__, prog)
    sub = parser.add_subparsers(dest="command", metavar="{" + ",".join(SUBCOMMANDS) + "}")
    for name in SUBCOMMANDS:
        p = sub.add_parser(name, help=HELP[name], description=HELP[name])
        if name == "embedded":
            continue  # its flags are bench_local's
        if name == "blind":
            _blind_args(p)  # a reading by a person: no data source, model or MLflow run
            continue
        p.add_argument("--output-dir", type=output_dir, help="where tables and JSON go (default runs/bench)")
        add_run_args(p, model=name in ("quality", "compile", "emotion"))
        p.set_defaults(experiment=BENCH_EXPERIMENT)
        OWN_ARGS[name](p)
    return parser


def invalid(args) -> str | None:
    """What is wrong with the sub-command's numbers, if anything."""
    name = args.command
    if name in ("quality", "emotion", "scorer") and args.limit < 1:
        return "--limit must be at least 1"
    if name == "overhead" and args.dialogues < 1:
        return "--dialogues must be at least 1"
    if name == "concurrency" and (args.latency < 0 or args.per_thread < 1):
        return "--latency must be >= 0 and --per-thread >= 1"
    if name == "scale" and (args.items < 1 or args.latency < 0 or min(args.threads + args.task_threads) < 1):
        return "--items, --threads and --task-threads must be at least 1, and --latency >= 0"
    if name == "latency":
        from trace_dspy.bench.latency import LatencyOptions

        try:
            LatencyOptions(phases=args.phases, repeats=args.repeats, competing=args.competing,
                           timeout=args.run_timeout, max_load=args.max_load).check()
        except ValueError as exc:
            return str(exc)
    return None


def _blind_args(p: argparse.ArgumentParser) -> None:
    actions = p.add_subparsers(dest="action", metavar="{prepare,score}", required=True)
    prepare = actions.add_parser("prepare", help="write reading.md, an empty verdicts.jsonl and key.json",
                                 description="Pair two respond outputs by id and write a blind reading of them.")
    prepare.add_argument("--a", required=True, type=Path, metavar="A.jsonl", help="program A's respond output")
    prepare.add_argument("--b", required=True, type=Path, metavar="B.jsonl",
                         help="program B's respond output, for the same input")
    prepare.add_argument("--out", required=True, type=output_dir, metavar="DIR", help="the reading's folder")
    prepare.add_argument("--seed", type=int, help="the shuffle's seed (default: a random one, kept in key.json)")
    score = actions.add_parser("score", help="unblind the filled verdicts.jsonl and tally it",
                               description="Unblind a filled verdicts.jsonl and tally it per program.")
    score.add_argument("--dir", required=True, type=Path, metavar="DIR", help="the folder prepare wrote")
    score.add_argument("--json", type=Path, metavar="OUT", help="also write the tally and every verdict here")


def _blind(args) -> int:
    """``bench blind prepare`` or ``bench blind score``: a user's mistake is one line and exit 2."""
    from trace_dspy.bench.blind import KEY, READING, VERDICTS, BlindError, prepare, score, score_text
    from trace_dspy.core.jsonl import atomic_write_json

    try:
        if args.action == "prepare":
            done = prepare(args.a, args.b, args.out, args.seed)
        else:
            result = score(args.dir)
    except BlindError as exc:
        return fail(str(exc))
    except OSError as exc:
        where = f"write the reading to {args.out}" if args.action == "prepare" else f"read {args.dir}"
        return fail(f"could not {where}: {exc.strerror or exc}")
    if args.action == "prepare":
        out(f"{done.items} items: give the reader {done.folder / READING} and {done.folder / VERDICTS}; "
            f"keep {done.folder / KEY} from them (it says which program is which)")
        return 0
    out(score_text(result))
    if args.json:
        try:
            atomic_write_json(args.json, result)
        except OSError as exc:
            return fail(f"could not write {args.json}: {exc.strerror or exc}; the tally is printed above")
        out(f"\nthe tally and every verdict: {args.json}")
    return 0


def _preflight(args) -> None:
    """The settings a bench reads and the folders it writes, checked before it measures (``PreflightError``)."""
    from trace_dspy.workflows.preflight import check_output_folder, check_run_settings

    check_run_settings(args.tracking_uri, tracked=not args.no_mlflow)
    check_output_folder(args.output_dir or DEFAULT_OUTPUT, "--output-dir")


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0].startswith("-") and argv[0] not in ("-h", "--help"):
        argv = ["quality", *argv]
    parser = build_parser(prog)
    if argv[0] == "embedded":
        return run_embedded_command(argv[1:], f"{parser.prog} embedded", HELP["embedded"])
    args = parser.parse_args(argv)
    if args.command == "blind":
        return _blind(args)
    setup_logging(args.verbose)
    for key in ("config", "lm", "api_base", "api_key_env", "analysis_lm", "response_lm", "judge_lm", "prompt_lm"):
        if not hasattr(args, key):  # sub-commands that use fake LMs (latency has --config, for respond)
            setattr(args, key, None)
    problem = invalid(args)
    if problem:
        return fail(problem)
    try:
        _preflight(args)
        where = Where(settings_from_args(args), data=args.data, seed=args.seed, output_dir=args.output_dir,
                      command="python -m trace_dspy.bench " + shlex.join(argv), mlflow=not args.no_mlflow,
                      tracking_uri=args.tracking_uri, experiment=args.experiment)
        run = run_bench(args.command, where, **{key: getattr(args, key) for key in OPTIONS[args.command]})
    except FailureRateExceeded as exc:
        return fail(str(exc), code=1)
    except (BusyMachine, ConfigError, DataError, FileNotFoundError, ValueError, ImportError) as exc:
        return fail(str(exc))
    except KeyboardInterrupt:
        record = (args.output_dir or DEFAULT_OUTPUT) / "latency.json"
        kept = (f"the runs measured so far are in {record}" if args.command == "latency"
                else "finished quality rows are kept and a rerun resumes them")
        say(f"\ninterrupted; {kept}")
        return 130
    out(run.table)
    out(f"\n{run.name}.md and {run.name}.json in {run.out_dir}")
    if run.charts:
        out("charts: " + ", ".join(str(c) for c in run.charts))
    if run.mlflow_run_id:
        out(f"mlflow run {run.mlflow_run_id} (experiment {args.experiment})")
    failures = run.result.get("failures") or []
    if failures:
        said = "; ".join(f"{f['phase']}, {f['label']}: {f['reason']}" for f in failures)
        return fail(f"{len(failures)} run(s) failed, the others' numbers are in the record: {said}", code=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
