"""Answer a JSONL file of dialogues: validated input rows, resumable output that only gains rows, threads."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dspy

from trace_dspy.core.console import progress, with_dspy_context
from trace_dspy.core.dialogue import DialogueError
from trace_dspy.core.jsonl import AppendWriter, atomic_write_lines, read_records

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
        if key == "reply_plans" and isinstance(value, list):  # each plan written for, with its reply's reward
            value = " | ".join(f"{t.get('plan')} {t.get('reward')}" if isinstance(t, dict) else str(t)
                               for t in value)
        elif isinstance(value, list):
            value = " | ".join(map(str, value))
        lines.append(f"{key:<28} {value}")
    lines.append(f"{'response':<28} {pred.response}")
    return "\n".join(lines)


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


class BatchError(ValueError):
    """The batch cannot start (its input or output is unusable); nothing was asked or changed."""


def read_batch_input(path: Path) -> list[tuple[str, Any, int]]:
    """(id, dialogue or an InputLineError, line number) for every non-blank line.

    Ids must be unique, whether given or generated (``line-N``): a repeated id
    would let one answer overwrite another on resume, so it is refused
    (``BatchError``) before any model call.
    """
    from trace_dspy.core.safety import JSONLimitError, load_json

    items: list[tuple[str, Any, int]] = []
    first_line: dict[str, int] = {}
    repeated: list[str] = []
    with open(path, "rb") as fh:
        for n, raw in enumerate(fh, 1):
            if not raw.strip():
                continue
            item_id, dialogue = f"line-{n}", None
            try:
                obj = load_json(raw, f"{path}:{n}")
                if not isinstance(obj, dict):
                    raise InputLineError(f"expected a JSON object, got {type(obj).__name__}")
                if "id" in obj:
                    if not isinstance(obj["id"], (str, int)) or isinstance(obj["id"], bool):
                        raise InputLineError(f"'id' must be text or an integer, not {type(obj['id']).__name__}")
                    item_id = str(obj["id"])
                dialogue = obj.get("turns", obj.get("dialogue"))
                if dialogue is None:
                    raise InputLineError("needs 'turns' or 'dialogue'")
            except JSONLimitError as exc:
                dialogue = InputLineError(str(exc).removeprefix(f"{path}:{n}: "))
            except InputLineError as exc:
                dialogue = exc
            if item_id in first_line:
                repeated.append(f"{item_id!r} (lines {first_line[item_id]} and {n})")
            first_line.setdefault(item_id, n)
            items.append((item_id, dialogue, n))
    if repeated:
        more = f" and {len(repeated) - 3} more" if len(repeated) > 3 else ""
        raise BatchError(f"{path}: ids must be unique (a line without 'id' is line-N); repeated: "
                         f"{', '.join(repeated[:3])}{more}. Nothing was answered")
    return items


def _is_batch_record(rec: dict) -> bool:
    return "response" in rec or "error" in rec


def check_batch_paths(input_path: Path, output_path: Path) -> None:
    """Refuse an output that is the input, or a folder; before anything is read or written."""
    if output_path.exists() and (output_path.resolve() == input_path.resolve()
                                 or os.path.samefile(output_path, input_path)):
        raise BatchError(f"--output {output_path} is the input file; choose another file for the replies")
    if output_path.is_dir():
        raise BatchError(f"--output {output_path} is a folder; give a file name")


def respond_batch(
    program: dspy.Module,
    input_path: str | os.PathLike,
    output_path: str | os.PathLike,
    *,
    threads: int = 1,
    lm: dspy.LM | None = None,
) -> BatchReport:
    """Answer every dialogue of a JSONL file; resumable, per-line failures kept.

    The output only ever gains knowledge: answered ids are kept, failed ids
    are asked again (past DSPy's cache), damaged lines of an earlier output are
    skipped with a warning, and the final rewrite replaces the file atomically.
    """
    from contextlib import nullcontext

    from trace_dspy.core.jsonl import ForeignFileError
    from trace_dspy.core.safety import redact
    from trace_dspy.lm.specs import fresh_calls, use_lm

    input_path, output_path = Path(input_path), Path(output_path)
    check_batch_paths(input_path, output_path)
    items = read_batch_input(input_path)
    try:
        previous = read_records(output_path, accept=_is_batch_record, what="respond output")
    except ForeignFileError as exc:
        raise BatchError(str(exc)) from None
    todo = [it for it in items if "response" not in previous.get(it[0], {})]
    retry = {it[0] for it in todo if it[0] in previous}
    failed = 0

    def answer(item: tuple[str, Any, int]) -> dict:
        item_id, dialogue, line = item
        if isinstance(dialogue, Exception):
            return {"id": item_id, "line": line, "error": f"{input_path}:{line}: {dialogue}"}
        try:
            with (fresh_calls() if item_id in retry else nullcontext()), use_lm(lm):
                pred = program(dialogue=dialogue)
        except DialogueError as exc:
            return {"id": item_id, "line": line, "error": f"{input_path}:{line}: {exc}"}
        except Exception as exc:  # one bad line must not stop the batch
            return {"id": item_id, "line": line, "error": redact(f"{type(exc).__name__}: {exc}")}
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
            pool = ThreadPoolExecutor(max_workers=threads)
            try:
                for rec in pool.map(with_dspy_context(answer), todo):
                    write(rec)
            finally:
                # On Ctrl-C, drop the queued lines instead of waiting for them.
                pool.shutdown(wait=False, cancel_futures=True)

    # Rewrite once, in input order, one record per id (atomic replace).
    atomic_write_lines(output_path, (previous[item_id] for item_id, _, _ in items))
    total_failed = sum("error" in previous[i] for i, _, _ in items)
    return BatchReport(total=len(items), answered=len(todo) - failed, skipped=len(items) - len(todo),
                       failed=total_failed)
