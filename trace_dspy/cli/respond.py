"""Answer a message, or a JSONL file of dialogues, with the TRACE program.

    python -m trace_dspy.respond "I failed my driving test again."
    python -m trace_dspy.respond --show-stages "I failed my driving test again."
    python -m trace_dspy.respond --input dialogues.jsonl --output replies.jsonl
    python -m trace_dspy.respond --engine spark --input dialogues.jsonl --output replies.jsonl

Batch input: one JSON object per line with ``turns`` (a list of turns, ending
on the speaker) or ``dialogue`` (a string of Speaker:/Listener: lines, or a
list), and optionally ``id`` (default: the line number). Each output line
holds the id, ``line``, ``dialogue_sha256`` (what it answered) and
``trace_dspy_output: 1``, and either the reply with every stage's output,
or the error for that line. A rerun keeps an answer only for the dialogue
it answered (same id and hash; a line without an id takes any earlier
answer to its dialogue), asks changed and failed lines again, and moves
earlier rows the input no longer asks for to ``<output>.stale.jsonl``;
the file is rewritten in input order when the run ends. An --output that
holds anything but this command's rows is refused and left unchanged.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from pathlib import Path

import dspy

from trace_dspy.cli.common import (
    add_model_args,
    add_trace_arg,
    command_parser,
    enter_tracing,
    fail,
    settings_from_args,
    setup_logging,
)
from trace_dspy.core import env as env_vars
from trace_dspy.core.config import ConfigError
from trace_dspy.core.dialogue import DialogueError, normalize_dialogue
from trace_dspy.core.console import out, out_json, say
from trace_dspy.workflows.batch import (
    BatchError,
    OutputWriteError,
    check_batch_paths,
    check_output_free,
    format_stages,
    respond_batch,
)
from trace_dspy.workflows.preflight import PreflightError, check_environment, check_output_file, check_tracking_store

# Exit code of a command stopped by Ctrl-C (128 + SIGINT), as shells report it.
INTERRUPTED = 130




def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    parser = command_parser("respond", __doc__, prog)
    parser.add_argument("message", nargs="*", help="the speaker's message (or a Speaker:/Listener: dialogue)")
    parser.add_argument("--show-stages", action="store_true", help="print every stage's output")
    parser.add_argument("--input", type=Path, help="JSONL file of dialogues to answer")
    parser.add_argument("--output", type=Path, help="JSONL file to write replies to (with --input)")
    parser.add_argument("--threads", type=int, default=1, help="parallel calls for --input (default 1); with --engine spark, per "
                        "Spark task (a remote LM only)")
    parser.add_argument("--engine", choices=("local", "spark"), default="local",
                        help="local: this process (default); spark: Apache Spark through the program's MLflow "
                             "model (with --input; needs the spark extra and Java)")
    parser.add_argument("--spark-master", default="local[2]",
                        help="Spark master for --engine spark (default local[2]: two workers on this machine)")
    parser.add_argument("--partitions", type=int, default=None,
                        help="Spark partitions for --engine spark (default: the session's parallelism)")
    parser.add_argument("--json", action="store_true", help="print the whole prediction as JSON")
    parser.add_argument("--program", default=None,
                        help="default: the newest artifact not worse than the uncompiled program on its dev "
                             "set, else the uncompiled one; or 'default' (uncompiled), NAME@vN, NAME@latest, an "
                             "artifact folder, champion, models:/..., runs:/...")
    parser.add_argument("--data", help="pool for retrieved exemplars (default: $TRACE_DSPY_DATA, else the seed set)")
    parser.add_argument("-v", "--verbose", action="store_true")
    add_trace_arg(parser)
    add_model_args(parser)
    return parser


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    args = build_parser(prog).parse_args(argv)
    setup_logging(args.verbose)
    try:
        return _run(args)
    except KeyboardInterrupt:  # Ctrl-C while the model loads, or in a one-thread batch
        where = f"; the finished replies are in {args.output}. Rerun the same command to answer the rest" \
            if args.input else ""
        say(f"\ninterrupted{where}")
        return INTERRUPTED


def _run(args: argparse.Namespace) -> int:
    if args.input and args.message:
        return fail("give either a message or --input, not both")
    if bool(args.input) != bool(args.output):
        return fail("--input and --output go together")
    if not args.input and not args.message:
        return fail("nothing to answer: give a message, or --input and --output")
    if args.threads < 1:
        return fail("--threads must be at least 1")
    if args.input and not args.input.is_file():
        return fail(f"no such input file: {args.input}")
    try:
        _preflight(args)
    except PreflightError as exc:
        return fail(str(exc))
    if args.input:
        try:
            check_batch_paths(args.input, args.output)
            check_output_free(args.output)
        except BatchError as exc:
            return fail(str(exc))
    if args.engine == "spark":
        if not args.input:
            return fail("--engine spark answers files: give --input and --output")
        if args.partitions is not None and args.partitions < 1:
            return fail("--partitions must be at least 1")
        return _run_spark(args)
    message = None
    if not args.input:
        message = " ".join(args.message)
        if message == "-":
            # Bytes, so that undecodable input reaches the dialogue check (a clear error) in any locale.
            raw = getattr(sys.stdin, "buffer", None)
            message = raw.read().decode("utf-8", "surrogateescape") if raw else sys.stdin.read()
        message = message.replace("\\n", "\n")
        try:  # an unusable message is refused before anything is loaded or fitted
            normalize_dialogue(message)
        except DialogueError as exc:
            return fail(str(exc))
    try:
        settings = settings_from_args(args)
        from trace_dspy.workflows.loading import load_for_run

        loaded = load_for_run(args.program, settings, data=settings.data_source(args.data), announce_seed=False,
                              remember_openings=True)
        program, default_lm = loaded.program, loaded.lms.default
    except (ConfigError, RuntimeError, ImportError, ValueError) as exc:
        return fail(str(exc))

    with contextlib.ExitStack() as stack:
        code = enter_tracing(stack, args, settings)
        if code is not None:
            return code
        return _answer(args, message, program, default_lm)


def _preflight(args: argparse.Namespace) -> None:
    """The settings respond reads and the file it writes, checked before anything is loaded."""
    check_environment(env_vars.CACHE)
    if args.trace:
        check_tracking_store(None)
    check_output_file(args.output, "--output", make_parent=True)


def _answer(args: argparse.Namespace, message: str | None, program, default_lm) -> int:
    if args.input:
        try:
            report = respond_batch(program, args.input, args.output, threads=args.threads, lm=default_lm)
        except BatchError as exc:
            return fail(str(exc))
        except OutputWriteError as exc:  # disk full: the rows written so far are on disk
            return fail(str(exc), code=1)
        except KeyboardInterrupt:
            if args.threads <= 1:
                raise
            say(f"\ninterrupted; the finished replies are in {args.output}. Rerun the same command to answer "
                "the rest")
            # Worker threads may be inside a model call; do not wait for them (every row is already on disk).
            os._exit(INTERRUPTED)
        say(f"{report.total} dialogues: {report.answered} answered now, {report.skipped} already done, "
            f"{report.failed} failed (see the 'error' field in {args.output})")
        return 0 if report.ok else 1

    from trace_dspy.cli.common import (
        TerminalStatus,
        stage_status_callback,
        warm_up_with_status,
    )

    status = TerminalStatus()
    try:
        if status.enabled:
            warm_up_with_status(default_lm, status)
        callbacks = [stage_status_callback(program, status)] if status.enabled else []
        with dspy.context(lm=default_lm, callbacks=[*dspy.settings.callbacks, *callbacks]):
            pred = program(dialogue=message)
    except DialogueError as exc:
        status.clear()
        return fail(str(exc))
    except KeyboardInterrupt:
        status.clear()
        say("\ninterrupted")
        return INTERRUPTED
    except Exception as exc:
        status.clear()
        return fail(f"the model call failed: {type(exc).__name__}: {exc}", code=1)
    status.clear()
    if args.json:
        out_json(pred.toDict(), indent=2)
    elif args.show_stages:
        out(format_stages(pred))
    else:
        out(pred.response)
    return 0


def _run_spark(args: argparse.Namespace) -> int:
    """--engine spark: the program's MLflow pyfunc model on Spark, with respond's batch file contract."""
    try:
        settings = settings_from_args(args)
        from trace_dspy.store.tracking import use_tracking_store
        from trace_dspy.workflows.spark import (
            SparkUnavailable,
            lm_environment,
            model_uri_for,
            respond_spark,
            temporary_workdir,
        )
    except (ConfigError, ValueError) as exc:
        return fail(str(exc))
    use_tracking_store(None)
    env = lm_environment(settings.lm) if settings.lm_explicit else {}
    if settings.trust_artifact_lm:
        env[env_vars.TRUST_ARTIFACT_LM] = "1"
    if args.threads > 1:
        env[env_vars.THREADS] = str(args.threads)  # per Spark task, remote LMs only
    with temporary_workdir() as workdir:
        try:
            uri = model_uri_for(args.program, workdir=Path(workdir), allow_unverified=settings.allow_unverified_model)
            report = respond_spark(args.input, args.output, uri, master=args.spark_master,
                                   partitions=args.partitions, executor_env=env)
        except (BatchError, SparkUnavailable, ValueError, FileNotFoundError) as exc:
            return fail(str(exc))
        except OutputWriteError as exc:
            return fail(str(exc), code=1)
        except Exception as exc:  # a Spark job that failed as a whole (rows answered so far are on disk)
            return fail(f"the Spark job failed: {type(exc).__name__}: {str(exc).splitlines()[0][:500]}; the rows "
                        f"answered before it are in {args.output}, and a rerun answers the rest", code=1)
    say(f"{report.total} dialogues: {report.answered} answered now, {report.skipped} already done, "
        f"{report.failed} failed (see the 'error' field in {args.output})")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
