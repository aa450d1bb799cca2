"""Answer a JSONL file of dialogues: validated input rows, resumable output that only gains rows, threads."""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dspy

from trace_dspy.core.console import progress, with_dspy_context
from trace_dspy.core.dialogue import DialogueError
from trace_dspy.core.jsonl import AppendWriter

log = logging.getLogger(__name__)

STAGE_FIELDS = (
    "writer", "emotion_candidates", "emotion_path", "emotion", "emotion_group", "trigger_spans", "cause_summary", "cause_category",
    "plan_path", "strategy", "secondary_strategy",
)


def stage_outputs(pred: dspy.Prediction) -> dict[str, Any]:
    """Every stage output of a prediction except the reply, in pipeline order."""
    data = pred.toDict()
    keys = [k for k in data if k not in ("dialogue", "exemplars", "response")]
    order = {k: i for i, k in enumerate(STAGE_FIELDS)}
    return {k: data[k] for k in sorted(keys, key=lambda k: order.get(k, len(order)))}


def stage_text(key: str, value) -> str:
    """A stage output as one line of text: a list joined by " | ", each reply plan with its reply's reward."""
    if key == "reply_plans" and isinstance(value, list):
        return " | ".join(f"{t.get('plan')} {t.get('reward')}" if isinstance(t, dict) else str(t) for t in value)
    if isinstance(value, list):
        return " | ".join(map(str, value)) if value else "-"
    return str(value)


def format_stages(pred: dspy.Prediction) -> str:
    lines = [f"{key:<28} {stage_text(key, value)}" for key, value in stage_outputs(pred).items()]
    lines.append(f"{'response':<28} {pred.response}")
    return "\n".join(lines)


@dataclass
class BatchReport:
    total: int
    answered: int  # in this run
    skipped: int  # already answered by an earlier run
    failed: int
    moved_aside: int = 0  # earlier rows moved to <output>.stale.jsonl by this run

    @property
    def ok(self) -> bool:
        return self.failed == 0


class InputLineError(ValueError):
    pass


class BatchError(ValueError):
    """The batch cannot start (its input or output is unusable); nothing was asked or changed."""


# Bounds on a batch input: the whole file, and a line (one past load_json's limit is that line's error; one past
# this bound stops the batch before any model call).
MAX_INPUT_BYTES = 1024 * 1024 * 1024
MAX_INPUT_LINE_BYTES = 64 * 1024 * 1024


def read_batch_input(path: Path) -> list[tuple[str, Any, int]]:
    """(id, dialogue or an InputLineError, line number) for every non-blank line.

    Ids must be unique, whether given or generated (``line-N``): a repeated id
    would let one answer overwrite another on resume, so it is refused
    (``BatchError``) before any model call. So is a file that is not a regular file
    (a FIFO, a device), or one past ``MAX_INPUT_BYTES`` or with a line past
    ``MAX_INPUT_LINE_BYTES`` (:class:`~trace_dspy.core.files.TextLines`).
    """
    from trace_dspy.core.files import FileCheckError, TextLines
    from trace_dspy.core.safety import JSONLimitError, load_json

    def numbered():
        try:
            with TextLines(path, max_bytes=MAX_INPUT_BYTES, max_line_bytes=MAX_INPUT_LINE_BYTES) as lines:
                yield from lines.raw()  # undecoded: load_json makes bad bytes that line's error
        except FileCheckError as exc:
            raise BatchError(f"{exc}. Nothing was answered") from None

    items: list[tuple[str, Any, int]] = []
    first_line: dict[str, int] = {}
    repeated: list[str] = []
    for n, raw in numbered():
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


# Every row of a respond output carries this field (the row format's version), so that the file is never
# mistaken for anyone else's and no file of anyone else's is mistaken for it.
OUTPUT_MARK = "trace_dspy_output"
# sha256 of the canonical dialogue text (the UTF-8 of the row's ``dialogue`` field): what the row answers.
DIALOGUE_HASH = "dialogue_sha256"
# The fields of the rows earlier versions wrote, without the mark or the hash.
_LEGACY_FIELDS = frozenset({"id", "line", "dialogue", "response", "stages", "error"})
# Why a row was moved to the side file (a field of the moved row).
MOVED = "moved_aside"


def dialogue_sha256(canonical: str) -> str:
    """The hash a row stores for its dialogue: sha256 of the canonical dialogue text, as UTF-8."""
    return hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()


def _is_batch_record(rec: dict) -> bool:
    """A row this command wrote: one that carries the mark, or one of exactly the shape earlier versions
    wrote (``id``, an integer ``line``, and ``response`` with ``stages`` or else ``error``; nothing else)."""
    if "id" not in rec:
        return False
    if OUTPUT_MARK in rec:
        return rec[OUTPUT_MARK] == 1 and ("response" in rec) != ("error" in rec)
    line = rec.get("line")
    if not set(rec) <= _LEGACY_FIELDS or not isinstance(line, int) or isinstance(line, bool):
        return False
    return ("response" in rec and "stages" in rec) != ("error" in rec)


def _stored_hash(rec: dict) -> str | None:
    """What an earlier row answered: its hash, or for a row of an earlier version, the hash of the
    dialogue it stored (None when it stored none: such a row is never reused)."""
    if OUTPUT_MARK in rec:
        value = rec.get(DIALOGUE_HASH)
        return value if isinstance(value, str) else None
    dialogue = rec.get("dialogue")
    return dialogue_sha256(dialogue) if isinstance(dialogue, str) else None


def aside_path(output_path: Path) -> Path:
    """Where rows of an earlier run that the rewrite would drop are moved: ``<output>.stale.jsonl``."""
    return output_path.with_name(output_path.name + ".stale.jsonl")


def check_batch_paths(input_path: Path, output_path: Path) -> None:
    """Refuse an output that is the input, or a folder, and a side file (:func:`aside_path`) that rows
    moved aside could not safely be added to; before anything is read or written."""
    if output_path.exists() and (output_path.resolve() == input_path.resolve()
                                 or os.path.samefile(output_path, input_path)):
        raise BatchError(f"--output {output_path} is the input file; choose another file for the replies")
    if output_path.is_dir():
        raise BatchError(f"--output {output_path} is a folder; give a file name")
    side = aside_path(output_path)
    problem = _aside_problem(side, input_path, output_path)
    if problem:
        raise BatchError(f"{side} (where rows of earlier runs that the input no longer asks for are kept) is "
                         f"{problem}; it was left as it is. Move it away or choose another --output")


def _aside_problem(side: Path, input_path: Path, output_path: Path) -> str | None:
    """Why rows cannot be moved to ``side``: a link (its target's rows would be copied, or the moved rows
    land in the output and vanish at its rewrite), not a regular file, or the input or output itself."""
    if side.is_symlink():
        return f"a symbolic link (to {os.path.realpath(side)})"
    if not side.exists():
        return None
    if not side.is_file():
        return "not a regular file"
    for name, other in (("input", input_path), ("output", output_path)):
        if other.exists() and os.path.samefile(side, other):
            return f"the {name} file itself (a hard link)"
    return None


def check_output_free(output_path: Path) -> None:
    """Refuse at once (``BatchError``) an output that another run is writing, before a model is loaded;
    the run itself holds the output's lock from its first reading to its last write (``run_resumable``)."""
    from trace_dspy.core.locks import OutputLockError, output_lock

    try:
        with output_lock(output_path):
            pass
    except OutputLockError as exc:
        raise BatchError(str(exc)) from None


class OutputWriteError(OSError):
    """A row could not be written (disk full, no permission); every row written before it is kept."""

    def __init__(self, path: Path, exc: OSError, kept: str):
        reason = os.strerror(exc.errno) if exc.errno else str(exc)
        super().__init__(exc.errno, f"could not write {path}: {reason}; {kept}")
        self.path = path

    def __str__(self) -> str:
        return self.strerror


@dataclass
class ResumePlan:
    """What a batch run does, given its input and the output of earlier runs.

    An earlier row is reused only for the dialogue it answered: when both its
    id and its dialogue hash match the input line, or, for a line without an
    id (whose ``line-N`` id moves when lines are inserted), when any earlier
    answer has the line's dialogue hash. Every other line is asked. Earlier
    rows the final rewrite would leave out (their id is no longer in the
    input, or their answer is for a dialogue the line no longer holds) are
    ``aside``: moved to ``aside_path(output)`` before anything is asked.
    Failed rows of lines still in the input are asked again and replaced.
    """

    items: list[tuple[str, Any, int]]
    canonical: dict[str, str | None]  # id -> canonical dialogue text, None when the line holds no usable dialogue
    rows: dict[str, dict]  # id -> the row the final file holds: reused answers first, new rows as they come
    todo: list[tuple[str, Any, int]]
    retry: set[str]  # ids of todo that an earlier row had: asked past DSPy's cache
    aside: list[dict]
    aside_path: Path
    output_path: Path
    written: int = 0  # rows appended by this run
    failed_now: int = 0  # of which errors

    def row(self, item_id: str, line: int, **fields: Any) -> dict:
        """An output row: id, line, the dialogue's hash (null for a line without a usable dialogue), the
        fields, and the mark."""
        text = self.canonical.get(item_id)
        return {"id": item_id, "line": line, DIALOGUE_HASH: dialogue_sha256(text) if text is not None else None,
                **fields, OUTPUT_MARK: 1}

    def move_aside(self) -> int:
        """Add the ``aside`` rows to the side file (atomically, none twice); return how many were added."""
        from trace_dspy.core.jsonl import ForeignFileError, atomic_add_records

        if not self.aside:
            return 0
        try:
            added = atomic_add_records(self.aside_path, self.aside, ignore=(MOVED,))
        except ForeignFileError as exc:  # made a link after the check: left as it is
            raise BatchError(f"{exc}; nothing was asked and {self.output_path} is as it was") from None
        except OSError as exc:
            raise OutputWriteError(self.aside_path, exc, f"nothing was asked and {self.output_path} is as it "
                                   "was") from exc
        if added:
            log.warning("moved %d earlier row(s) that the input no longer asks for to %s (field '%s' says why)",
                        added, self.aside_path, MOVED)
        return added

    def append(self, out: AppendWriter, rec: dict) -> None:
        """Append a row of this run to the output (durably) and keep it for the final rewrite; a write
        error is an ``OutputWriteError`` that says how many rows were kept."""
        try:
            out.write(rec)
        except OSError as exc:
            raise OutputWriteError(self.output_path, exc, f"the {self.written} row(s) written in this run and "
                                   "every earlier one are kept; a rerun answers the rest") from exc
        self.written += 1
        self.failed_now += "error" in rec
        self.rows[rec["id"]] = rec

    def finish(self) -> BatchReport:
        """Rewrite the output once, in input order, one row per input line (atomic replace)."""
        from trace_dspy.core.jsonl import atomic_write_lines

        try:
            atomic_write_lines(self.output_path,
                               (self.rows[item_id] for item_id, _, _ in self.items if item_id in self.rows))
        except OSError as exc:
            raise OutputWriteError(self.output_path, exc, "its rows are as they were before the final "
                                   "rewrite, and a rerun completes it") from exc
        failed = sum("error" in self.rows.get(i, {"error": 1}) for i, _, _ in self.items)
        return BatchReport(total=len(self.items), answered=self.written - self.failed_now, skipped=len(self.items) - len(self.todo),
                           failed=failed, moved_aside=len(self.aside))


def _canonical(dialogue: Any) -> str | None:
    from trace_dspy.core.dialogue import normalize_dialogue

    if isinstance(dialogue, Exception):
        return None
    try:
        return normalize_dialogue(dialogue)
    except (DialogueError, TypeError, ValueError):
        return None


def plan_batch(input_path: Path, output_path: Path) -> ResumePlan:
    """Read the input and the earlier output; decide what is reused, asked and moved aside (see
    ``ResumePlan``). Raises ``BatchError`` (nothing read or changed) for an unusable input or an output
    that is not this command's. Runs inside :func:`~trace_dspy.core.locks.output_lock` of the output, so
    that no other run changes the output between this reading and the final rewrite."""
    from trace_dspy.core.jsonl import ForeignFileError, read_records
    from trace_dspy.core.locks import holds_lock

    if not holds_lock(output_path):
        raise RuntimeError(f"plan_batch runs inside output_lock({str(output_path)!r}); see run_resumable")
    check_batch_paths(input_path, output_path)
    items = read_batch_input(input_path)
    try:
        previous = read_records(output_path, accept=_is_batch_record, what="respond output", strict=True)
    except ForeignFileError as exc:
        raise BatchError(str(exc)) from None
    canonical = {item_id: _canonical(dialogue) for item_id, dialogue, _ in items}
    answers: dict[str, dict] = {}  # hash -> an earlier answer, for lines without an id
    for rec in previous.values():
        digest = _stored_hash(rec)
        if "response" in rec and digest is not None:
            answers.setdefault(digest, rec)
    plan = ResumePlan(items=items, canonical=canonical, rows={}, todo=[], retry=set(), aside=[],
                      aside_path=aside_path(output_path), output_path=output_path)
    used: set[str] = set()  # ids of earlier rows whose answer the output keeps
    for item in items:
        item_id, _, line = item
        text = canonical[item_id]
        digest = dialogue_sha256(text) if text is not None else None
        earlier = previous.get(item_id)
        match = None
        if digest is not None:
            if earlier is not None and "response" in earlier and _stored_hash(earlier) == digest:
                match = earlier
            elif item_id == f"line-{line}":
                match = answers.get(digest)
        if match is None:
            plan.todo.append(item)
            if earlier is not None:
                plan.retry.add(item_id)
            continue
        used.add(str(match["id"]))
        kept = {k: v for k, v in match.items() if k not in ("id", "line", DIALOGUE_HASH, OUTPUT_MARK)}
        kept["dialogue"] = text
        plan.rows[item_id] = plan.row(item_id, line, **kept)
    asked = {item_id for item_id, _, _ in items}
    for key, rec in previous.items():
        if key in used:
            continue
        if key not in asked:
            plan.aside.append({**rec, MOVED: "its id is no longer in the input"})
        elif "response" in rec:
            why = ("the input line with this id holds another dialogue now" if _stored_hash(rec) is not None
                   else "it does not say which dialogue it answered (an earlier version wrote it)")
            plan.aside.append({**rec, MOVED: why})
    return plan


def respond_batch(
    program: dspy.Module,
    input_path: str | os.PathLike,
    output_path: str | os.PathLike,
    *,
    threads: int = 1,
    lm: dspy.LM | None = None,
) -> BatchReport:
    """Answer every dialogue of a JSONL file; resumable, per-line failures kept.

    Every row says which dialogue it answered (``dialogue_sha256``, the sha256
    of its canonical ``dialogue`` text) and carries ``trace_dspy_output: 1``.
    A rerun reuses an earlier answer only for the same dialogue: same id and
    same hash, or, for a line without an id, any earlier answer with its
    hash (``line-N`` ids move when lines are inserted). Changed dialogues
    and failed rows are asked again (past DSPy's cache). Nothing answered
    is dropped: earlier rows that the input no longer asks for (id removed,
    dialogue changed) are moved to ``<output>.stale.jsonl`` before anything
    is asked, with a ``moved_aside`` field saying why, and a warning line
    says how many. Damaged lines of an earlier output are skipped with a
    warning, and the final rewrite replaces the file atomically.

    The output must be this command's: a file holding any JSON line that is
    not one of its rows is refused (``BatchError``) and left unchanged.
    Rows of earlier versions (no mark) count as this command's when they
    have exactly the shape those versions wrote: ``id``, an integer
    ``line``, and ``dialogue``, ``response`` and ``stages``, or ``error``.
    Their answers are reused when their stored ``dialogue`` matches the
    input line, and asked again (the old row moved aside) when it does not
    or is missing. A row that cannot be written (disk full) stops the run
    with ``OutputWriteError``; every row written before it is kept.
    """
    input_path = Path(input_path)

    def answer_all(plan: ResumePlan, write) -> None:
        with progress(total=len(plan.todo), desc="respond", unit="dialogues") as bar:
            if threads <= 1:
                for item in plan.todo:
                    write(_answer(program, lm, plan, input_path, item))
                    bar.update(1)
                return
            pool = ThreadPoolExecutor(max_workers=threads)
            try:
                for rec in pool.map(with_dspy_context(lambda item: _answer(program, lm, plan, input_path, item)), plan.todo):
                    write(rec)  # from this thread only
                    bar.update(1)
            finally:
                # On Ctrl-C, drop the queued lines instead of waiting for them.
                pool.shutdown(wait=False, cancel_futures=True)

    return run_resumable(input_path, output_path, answer_all)


def _answer(program, lm, plan: ResumePlan, input_path: Path, item: tuple[str, Any, int]) -> dict:
    """One line's row: the program's answer, or the error that stopped it."""
    from contextlib import nullcontext

    from trace_dspy.core.safety import redact
    from trace_dspy.lm.specs import fresh_calls, use_lm

    item_id, dialogue, line = item
    if isinstance(dialogue, Exception):
        return plan.row(item_id, line, error=f"{input_path}:{line}: {dialogue}")
    try:
        with (fresh_calls() if item_id in plan.retry else nullcontext()), use_lm(lm):
            pred = program(dialogue=dialogue)
    except DialogueError as exc:
        return plan.row(item_id, line, error=f"{input_path}:{line}: {exc}")
    except Exception as exc:  # noqa: BLE001 - one bad line must not stop the batch
        return plan.row(item_id, line, error=redact(f"{type(exc).__name__}: {exc}"))
    return plan.row(item_id, line, dialogue=pred.dialogue, response=pred.response, stages=stage_outputs(pred))


def run_resumable(input_path: str | os.PathLike, output_path: str | os.PathLike,
                  answer_all: Callable[[ResumePlan, Callable[[dict], None]], None], *,
                  on_row: Callable[[dict], None] | None = None) -> BatchReport:
    """The resume bookkeeping of a batch, whatever answers it (threads here, Spark in workflows.spark).

    Plans the run against the earlier output (:func:`plan_batch`), moves stale rows aside, calls
    ``answer_all(plan, write)`` to answer ``plan.todo`` (``write`` appends one row, then calls
    ``on_row``), and rewrites the output in input order; returns the report. All of it runs under the
    output's lock (:func:`~trace_dspy.core.locks.output_lock`): a second run on the same output is
    refused (``BatchError``) before it reads or changes anything.
    """
    from contextlib import ExitStack

    from trace_dspy.core.locks import OutputLockError, output_lock

    with ExitStack() as held:
        try:
            held.enter_context(output_lock(output_path))
        except OutputLockError as exc:
            raise BatchError(str(exc)) from None
        plan = plan_batch(Path(input_path), Path(output_path))
        plan.move_aside()
        with AppendWriter(Path(output_path)) as out:
            def write(rec: dict) -> None:
                plan.append(out, rec)
                if on_row:
                    on_row(rec)

            answer_all(plan, write)
        return plan.finish()
