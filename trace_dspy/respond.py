"""Answer a message, or a JSONL file of dialogues, with the TRACE program.

    python -m trace_dspy.respond "I failed my driving test again."
    python -m trace_dspy.respond --show-stages "I failed my driving test again."
    python -m trace_dspy.respond --input dialogues.jsonl --output replies.jsonl

Batch input: one JSON object per line with ``turns`` (a list of turns, ending
on the speaker) or ``dialogue`` (a string of Speaker:/Listener: lines, or a
list), and optionally ``id`` (default: the line number). Each output line
holds the id and either the reply with every stage's output, or the error
for that line. A rerun skips the ids already answered and retries the
failed ones; the file is rewritten in input order when the run ends.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dspy

from trace_dspy.cli import add_model_args, fail, progress, settings_from_args, setup_logging, with_dspy_context
from trace_dspy.config import ConfigError
from trace_dspy.dialogue import DialogueError
from trace_dspy.jsonl import AppendWriter, atomic_write_lines, read_records

STAGE_FIELDS = (
    "emotion_candidates", "emotion_path", "emotion", "emotion_group", "trigger_spans", "cause_summary", "cause_category",
    "strategy", "secondary_strategy",
)


def stage_outputs(pred: dspy.Prediction) -> dict[str, Any]:
    """Every stage output of a prediction except the reply, in pipeline order."""
    data = pred.toDict()
    keys = [k for k in data if k not in ("dialogue", "exemplars", "response")]
    order = {k: i for i, k in enumerate(STAGE_FIELDS)}
    return {k: data[k] for k in sorted(keys, key=lambda k: order.get(k, len(order)))}


def format_stages(pred: dspy.Prediction) -> str:
    lines = []
    for key, value in stage_outputs(pred).items():
        if isinstance(value, list):
            value = " | ".join(map(str, value))
        lines.append(f"{key:<28} {value}")
    lines.append(f"{'response':<28} {pred.response}")
    return "\n".join(lines)


# ---------------------------------------------------------------- batch


@dataclass
class BatchReport:
    total: int
    answered: int  # in this run
    skipped: int  # already answered by an earlier run
    failed: int

    @property
    def ok(self) -> bool:
        return self.failed == 0


class InputLineError(ValueError):
    pass


def read_batch_input(path: Path) -> list[tuple[str, Any, int]]:
    """(id, dialogue or an InputLineError, line number) for every non-blank line."""
    items: list[tuple[str, Any, int]] = []
    seen: set[str] = set()
    with open(path, "rb") as fh:
        for n, raw in enumerate(fh, 1):
            if not raw.strip():
                continue
            item_id, dialogue = f"line-{n}", None
            try:
                obj = json.loads(raw.decode("utf-8"))
                if not isinstance(obj, dict):
                    raise InputLineError(f"expected a JSON object, got {type(obj).__name__}")
                given = str(obj.get("id", item_id))
                if given in seen:  # keep the first; this line's error gets its own id
                    raise InputLineError(f"duplicate id {given!r}")
                item_id = given
                dialogue = obj.get("turns", obj.get("dialogue"))
                if dialogue is None:
                    raise InputLineError("needs 'turns' or 'dialogue'")
            except UnicodeDecodeError as exc:
                dialogue = InputLineError(f"not valid UTF-8 ({exc.reason})")
            except json.JSONDecodeError as exc:
                dialogue = InputLineError(f"invalid JSON: {exc.msg} (column {exc.colno})")
            except InputLineError as exc:
                dialogue = exc
            seen.add(item_id)
            items.append((item_id, dialogue, n))
    return items


def respond_batch(
    program: dspy.Module,
    input_path: str | os.PathLike,
    output_path: str | os.PathLike,
    *,
    threads: int = 1,
    lm: dspy.LM | None = None,
) -> BatchReport:
    """Answer every dialogue of a JSONL file; resumable, per-line failures kept."""
    input_path, output_path = Path(input_path), Path(output_path)
    items = read_batch_input(input_path)
    previous = read_records(output_path)
    todo = [it for it in items if "response" not in previous.get(it[0], {})]
    failed = 0

    def answer(item: tuple[str, Any, int]) -> dict:
        item_id, dialogue, line = item
        if isinstance(dialogue, Exception):
            return {"id": item_id, "line": line, "error": f"{input_path}:{line}: {dialogue}"}
        try:
            if lm is not None:
                with dspy.context(lm=lm):
                    pred = program(dialogue=dialogue)
            else:
                pred = program(dialogue=dialogue)
        except DialogueError as exc:
            return {"id": item_id, "line": line, "error": f"{input_path}:{line}: {exc}"}
        except Exception as exc:  # one bad line must not stop the batch
            return {"id": item_id, "line": line, "error": f"{type(exc).__name__}: {exc}"}
        return {"id": item_id, "line": line, "dialogue": pred.dialogue, "response": pred.response,
                "stages": stage_outputs(pred)}

    with AppendWriter(output_path) as out, progress(total=len(todo), desc="respond") as bar:
        def write(rec: dict) -> None:  # called from this thread only
            nonlocal failed
            out.write(rec)
            failed += "error" in rec
            previous[rec["id"]] = rec
            bar.update(1)

        if threads <= 1:
            for item in todo:
                write(answer(item))
        else:
            with ThreadPoolExecutor(max_workers=threads) as pool:
                for rec in pool.map(with_dspy_context(answer), todo):
                    write(rec)

    # Rewrite once, in input order, one record per id (atomic replace).
    atomic_write_lines(output_path, (previous[item_id] for item_id, _, _ in items))
    total_failed = sum("error" in previous[i] for i, _, _ in items)
    return BatchReport(total=len(items), answered=len(todo) - failed, skipped=len(items) - len(todo),
                       failed=total_failed)


# ---------------------------------------------------------------- CLI


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m trace_dspy.respond", description=__doc__.split("\n\n")[0])
    parser.add_argument("message", nargs="*", help="the speaker's message (or a Speaker:/Listener: dialogue)")
    parser.add_argument("--show-stages", action="store_true", help="print every stage's output")
    parser.add_argument("--input", type=Path, help="JSONL file of dialogues to answer")
    parser.add_argument("--output", type=Path, help="JSONL file to write replies to (with --input)")
    parser.add_argument("--threads", type=int, default=1, help="parallel calls for --input (default 1)")
    parser.add_argument("--json", action="store_true", help="print the whole prediction as JSON")
    parser.add_argument("--program", default="default",
                        help="'default' (uncompiled) or a compiled program: trace-dspy@latest, an artifact "
                             "folder, champion, models:/..., runs:/...")
    parser.add_argument("--data", help="pool for retrieved exemplars (default: $TRACE_DSPY_DATA, else the seed set)")
    parser.add_argument("-v", "--verbose", action="store_true")
    add_model_args(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.verbose)
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
        settings = settings_from_args(args)
        from trace_dspy.artifacts import load_for_run

        loaded = load_for_run(args.program, settings, data=settings.data_source(args.data), announce_seed=False)
        program, default_lm = loaded.program, loaded.lms.default
    except (ConfigError, RuntimeError, ImportError, ValueError) as exc:
        return fail(str(exc))

    if args.input:
        report = respond_batch(program, args.input, args.output, threads=args.threads, lm=default_lm)
        print(f"{report.total} dialogues: {report.answered} answered now, {report.skipped} already done, "
              f"{report.failed} failed (see the 'error' field in {args.output})", file=sys.stderr)
        return 0 if report.ok else 1

    message = " ".join(args.message)
    if message == "-":
        # Bytes, so that undecodable input reaches the dialogue check (a clear error) in any locale.
        raw = getattr(sys.stdin, "buffer", None)
        message = raw.read().decode("utf-8", "surrogateescape") if raw else sys.stdin.read()
    message = message.replace("\\n", "\n")
    from trace_dspy.cli import TerminalStatus, stage_status_callback, warm_up_with_status

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
    except Exception as exc:
        status.clear()
        return fail(f"the model call failed: {type(exc).__name__}: {exc}", code=1)
    status.clear()
    if args.json:
        print(json.dumps(pred.toDict(), ensure_ascii=False, indent=2))
    elif args.show_stages:
        print(format_stages(pred))
    else:
        print(pred.response)
    return 0


if __name__ == "__main__":
    sys.exit(main())
