"""The latency bench: what a person waits for on the embedded model, start-up included.

Every measured command runs in a process of its own, timed from spawn to exit:

- ``cold``: ``python -m trace_dspy.respond MESSAGE`` for ``repeats`` different messages, each with a new,
  empty DSPy cache folder (``DSPY_CACHEDIR``). With ``cold_cache`` each also gets a new, empty
  ``$TRACE_DSPY_CACHE`` (a first run ever); otherwise the user's cache folder is used. Each run's wall
  seconds, their median, and what the cache folder held before the run.
- ``anchor``: the same everyday dialogues answered by ``respond --input FILE --output OUT`` in one process,
  and by the raw embedded model in one process, load included (llama-cpp-python's
  ``create_chat_completion`` in the model's own chat format, 64 tokens, greedy, the engine's default thread
  count). Both walls, their ratio, and both sides' replies.
- ``contention``: ``respond MESSAGE`` on a quiet machine, then with K CPU-bound processes running
  (``python -c "while True: pass"``, started before the command and killed after it), in ``repeats``
  rounds; each condition's median and its ratio to the quiet one.

The load average is recorded before every run. A bench on a machine whose 1-minute load average is above
``max_load`` refuses to start (:class:`BusyMachine`) unless ``force``. A run that fails, or that passes
``timeout`` (its whole process group is killed), is recorded with its phase and the tail of its stderr, and
the bench goes on. ``on_update`` gets the result after every run, so that a bench that stops early keeps
what it measured.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from trace_dspy.bench.processes import (
    Finished,
    Runner,
    competing,
    load_average,
    run_process,
)
from trace_dspy.core import env as env_vars
from trace_dspy.core.console import say
from trace_dspy.core.files import MiB, TextLines, read_text
from trace_dspy.core.safety import MAX_LINE_BYTES
from trace_dspy.core.tables import markdown_table

PHASES = ("cold", "anchor", "contention")
DSPY_CACHE_VAR = "DSPY_CACHEDIR"  # where DSPy keeps its answer cache on disk
EVERYDAY = Path(__file__).resolve().parents[2] / "docs" / "bench" / "everyday" / "messages.jsonl"
ANCHOR_DIALOGUES = 8
# The messages file and the batch's output it reads back: a few dialogues; far larger is a wrong file.
MAX_MESSAGES_BYTES = 64 * MiB
RAW_MAX_TOKENS = 64
RAW_N_CTX = 4096  # the engine's default context size
STDERR_TAIL = 2000  # characters of a failed run's stderr that the record keeps
OUTPUT_KEPT = 2000  # characters of a run's stdout that the record keeps
HOG_CODE = "while True: pass"
CONTENTION_MESSAGE = "I failed my driving test again."
COLD_MESSAGES = (
    "My sister forgot my birthday this year.",
    "I finally fixed the old bike my dad gave me.",
    "Our flight got cancelled and we are stuck at the airport.",
    "My neighbour's dog barked all night and I could not sleep.",
    "I passed my probation period at work today.",
    "Someone scratched my car in the parking lot.",
    "My daughter took her first steps this morning.",
    "I have to give a speech at my friend's wedding on Saturday.",
    "The landlord is raising our rent again.",
    "I found a letter my grandfather wrote me years ago.",
)

# The raw side of the anchor: argv is model path, threads, context size, max tokens, a JSON file of chats.
# The model loads as the engine loads it, without llama.cpp's extra weight buffer types (see
# trace_dspy.lm.model_files.plain_weight_buffers); nothing of trace_dspy is imported, so DSPy's import
# time is not counted on this side.
RAW_SCRIPT = """\
import json, sys
import llama_cpp
path, threads, n_ctx, max_tokens, chats = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
defaults = llama_cpp.llama_cpp.llama_model_default_params
def plain_buffers():
    params = defaults()
    params.use_extra_bufts = False
    return params
llama_cpp.llama_cpp.llama_model_default_params = plain_buffers
llm = llama_cpp.Llama(model_path=path, n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads, seed=0,
                      verbose=False)
llama_cpp.llama_cpp.llama_model_default_params = defaults
with open(chats, encoding="utf-8") as fh:
    conversations = json.load(fh)
replies = []
for messages in conversations:
    out = llm.create_chat_completion(messages=messages, max_tokens=max_tokens, temperature=0)
    replies.append(out["choices"][0]["message"]["content"])
llm.close()
print(json.dumps(replies))
"""


class BusyMachine(RuntimeError):
    """The machine is busier than the bench allows: every number would carry the other work."""


@dataclass
class LatencyOptions:
    """What the latency bench runs; ``program``, ``config`` and ``data`` are passed to ``respond``."""

    phases: Sequence[str] = PHASES
    repeats: int = 3  # cold: different messages; contention: rounds
    competing: Sequence[int] = (1, 3)  # CPU-bound processes beside each contended run
    messages: Path | None = None  # the anchor's JSONL of {"turns": [...]}; None: the everyday messages
    message: str = CONTENTION_MESSAGE  # the contention phase's message
    cold_cache: bool = False  # cold runs with a new, empty $TRACE_DSPY_CACHE too
    program: str | None = None
    config: str | None = None
    data: str | None = None
    timeout: float = 300.0  # seconds one run may take before its process group is killed
    max_load: float = 0.5
    force: bool = False
    settle: float = 0.5  # seconds the competing processes spin before the measured command starts

    def check(self) -> None:
        unknown = [p for p in self.phases if p not in PHASES]
        if unknown or not self.phases:
            raise ValueError(f"unknown or no phases {unknown}; choose from {','.join(PHASES)}")
        if self.repeats < 1 or not self.timeout > 0 or self.max_load < 0 or self.settle < 0:
            raise ValueError("--repeats must be at least 1, --timeout above 0 and --max-load at least 0")
        if any(k < 1 for k in self.competing):
            raise ValueError("--competing takes process counts of at least 1")

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        return {k: (str(v) if isinstance(v, Path) else list(v) if isinstance(v, tuple) else v)
                for k, v in data.items()}


def cache_state(folder: Path) -> dict[str, Any]:
    """What a cache folder holds: its path, whether it is empty, and its files by sub-folder."""
    kinds: dict[str, int] = {}
    if folder.is_dir():
        for path in folder.rglob("*"):
            if path.is_file():
                parts = path.relative_to(folder).parts
                kind = parts[0] if len(parts) > 1 else "."
                kinds[kind] = kinds.get(kind, 0) + 1
    files = sum(kinds.values())
    return {"dir": str(folder), "empty": files == 0, "files": files, "kinds": kinds}


def read_dialogues(path: Path, count: int = ANCHOR_DIALOGUES) -> list[list[str]]:
    """The first ``count`` dialogues of a JSONL file whose lines hold ``{"turns": [...]}``; the file is read
    through :class:`~trace_dspy.core.files.TextLines` (a regular file, bounded; a problem is a ValueError)."""
    dialogues: list[list[str]] = []
    with TextLines(path, max_bytes=MAX_MESSAGES_BYTES, max_line_bytes=MAX_LINE_BYTES) as lines:
        for number, line in lines:
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{number}: not JSON ({exc.msg})") from None
            turns = row.get("turns") if isinstance(row, dict) else None
            if not (isinstance(turns, list) and turns and all(isinstance(t, str) and t.strip() for t in turns)):
                raise ValueError(f'{path}:{number}: expected {{"turns": ["..."]}} with at least one turn')
            dialogues.append(turns)
            if len(dialogues) == count:
                break
    if not dialogues:
        raise ValueError(f"{path}: no dialogues")
    return dialogues


def chat_messages(turns: Sequence[str]) -> list[dict[str, str]]:
    """A dialogue in a chat model's roles: the last turn (the speaker's) is the user's; turns alternate."""
    last = len(turns) - 1
    return [{"role": "user" if (last - i) % 2 == 0 else "assistant", "content": t} for i, t in enumerate(turns)]


def cold_messages(count: int) -> list[str]:
    """``count`` different messages; past the built-in ten, they are told again a week later."""
    n = len(COLD_MESSAGES)
    return [COLD_MESSAGES[i] if i < n else f"{COLD_MESSAGES[i % n]} That was {i // n} weeks ago."
            for i in range(count)]


class Commands:
    """The command lines the bench runs (tests swap in tiny scripts)."""

    def __init__(self, options: LatencyOptions, python: str | None = None):
        self.python = python or sys.executable
        self.passed = [part for flag, value in (("--program", options.program), ("--config", options.config),
                                                ("--data", options.data)) if value for part in (flag, str(value))]

    def respond(self, message: str) -> list[str]:
        words = ["--", message] if message.startswith("-") else [message]
        return [self.python, "-m", "trace_dspy.respond", *self.passed, *words]

    def respond_batch(self, input_path: Path, output_path: Path) -> list[str]:
        return [self.python, "-m", "trace_dspy.respond", *self.passed, "--input", str(input_path),
                "--output", str(output_path)]

    def raw_settings(self) -> dict[str, Any]:
        """The raw model's file and settings: the engine's defaults."""
        from trace_dspy.lm.model_files import default_model_path
        from trace_dspy.lm.threads import default_thread_count

        return {"model_path": str(default_model_path()), "n_threads": default_thread_count(), "n_ctx": RAW_N_CTX,
                "max_tokens": RAW_MAX_TOKENS, "temperature": 0}

    def raw(self, chats_path: Path, settings: dict[str, Any]) -> list[str]:
        return [self.python, "-c", RAW_SCRIPT, settings["model_path"], str(settings["n_threads"]),
                str(settings["n_ctx"]), str(settings["max_tokens"]), str(chats_path)]

    def hog(self) -> list[str]:
        return [self.python, "-c", HOG_CODE]


def default_commands(options: LatencyOptions) -> Commands:
    return Commands(options)


def shell_line(argv: Sequence[str], extra_env: dict[str, str]) -> str:
    """The command as a shell would run it: the variables it sets, then its words."""
    return " ".join([*(f"{k}={shlex.quote(v)}" for k, v in extra_env.items()), shlex.join(argv)])


def median_seconds(runs: Sequence[dict[str, Any]]) -> float | None:
    """The median wall seconds of the runs that succeeded; None when none did."""
    values = [r["seconds"] for r in runs if r.get("ok")]
    return statistics.median(values) if values else None


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def contention_conditions(runs: Sequence[dict[str, Any]], counts: Sequence[int]) -> list[dict[str, Any]]:
    """Each condition's runs, median seconds and its ratio to the quiet condition (0 competing)."""
    quiet = median_seconds([r for r in runs if r["competing"] == 0])
    rows = []
    for k in counts:
        mine = [r for r in runs if r["competing"] == k]
        median = median_seconds(mine)
        rows.append({"competing": k, "runs": len(mine), "ok_runs": sum(bool(r["ok"]) for r in mine),
                     "median_s": median, "ratio_to_quiet": ratio(median, quiet)})
    return rows


def batch_replies(output: Path, count: int) -> list[Any] | None:
    """The replies ``respond --input`` wrote, in input order (an ``{"error": ...}`` for a failed line)."""
    if not output.is_file():
        return None
    rows = {}
    for line in read_text(output, max_bytes=MAX_MESSAGES_BYTES).splitlines():
        with contextlib.suppress(json.JSONDecodeError):
            row = json.loads(line)
            if isinstance(row, dict):
                rows[str(row.get("id"))] = row
    return [rows[str(i)].get("response", {"error": rows[str(i)].get("error")}) if str(i) in rows else None
            for i in range(1, count + 1)]


def raw_replies(stdout: str) -> list[str] | None:
    """The raw script's replies: the JSON list on its last line of output."""
    lines = [line for line in stdout.splitlines() if line.strip()]
    try:
        replies = json.loads(lines[-1]) if lines else None
    except json.JSONDecodeError:
        return None
    return replies if isinstance(replies, list) else None


class LatencyBench:
    """One latency bench: runs the phases that ``options`` names and builds the record as it goes."""

    def __init__(self, options: LatencyOptions, commands: Commands, *, runner: Runner = run_process,
                 on_update: Callable[[dict[str, Any]], None] | None = None,
                 log: Callable[[str], None] | None = None):
        self.options, self.commands, self.runner = options, commands, runner
        self.on_update = on_update or (lambda result: None)
        self.log = log or say
        self.hogs: list[subprocess.Popen] = []  # every competing process started
        self.result: dict[str, Any] = {}
        self.workdir = Path(tempfile.gettempdir())
        self._made = 0
        self._warmed = False

    def run(self) -> dict[str, Any]:
        """Refuse a busy machine, then run the phases in order; the record's result."""
        options = self.options
        options.check()
        load = load_average()
        busy = load is not None and load[0] > options.max_load
        if busy and not options.force:
            raise BusyMachine(
                f"the 1-minute load average is {load[0]:.2f}, above --max-load {options.max_load:g}: other work "
                "would be in every number. Wait until the machine is quiet, or pass --force to measure anyway "
                "(the record says so)")
        dialogues = read_dialogues(options.messages or EVERYDAY) if "anchor" in options.phases else None
        self.result = {"phases": [p for p in PHASES if p in options.phases], "options": options.to_dict(),
                       "python": self.commands.python, "cwd": os.getcwd(), "load_at_start": load,
                       "busy_at_start": busy, "forced": busy and options.force,
                       "user_trace_cache": str(env_vars.cache_root()), "failures": []}
        self.on_update(self.result)
        with tempfile.TemporaryDirectory(prefix="trace-latency-") as tmp:
            self.workdir = Path(tmp)
            for phase in self.result["phases"]:
                if phase == "cold":
                    self.cold()
                elif phase == "anchor":
                    self.anchor(dialogues)
                else:
                    self.contention()
                self.on_update(self.result)
        return self.result

    def fresh_dir(self, kind: str) -> str:
        """A new, empty folder in the bench's temporary folder."""
        self._made += 1
        path = self.workdir / f"{kind}-{self._made}"
        path.mkdir()
        return str(path)

    def fail(self, phase: str, label: str, reason: str, stderr_tail: str = "", command: str = "") -> None:
        self.result["failures"].append({"phase": phase, "label": label, "reason": reason,
                                        "stderr_tail": stderr_tail, "command": command})
        last = stderr_tail.strip().splitlines()[-3:]
        self.log(f"latency: {phase}, {label}: FAILED, {reason}" + "".join(f"\n    {line}" for line in last))

    def measure(self, phase: str, label: str, argv: Sequence[str], extra_env: dict[str, str],
                store: Callable[[dict[str, Any]], None], **fields) -> tuple[dict[str, Any], Finished]:
        """Run one command; its entry (also given to ``store``, then the record to ``on_update``)."""
        entry: dict[str, Any] = {"label": label, **fields, "command": shell_line(argv, extra_env),
                                 "env": dict(extra_env), "load_before": load_average()}
        self.log(f"latency: {phase}, {label}: running")
        finished = self.runner(list(argv), env={**os.environ, **extra_env}, timeout=self.options.timeout)
        entry.update(seconds=finished.seconds, ok=finished.ok, returncode=finished.returncode,
                     timed_out=finished.timed_out, stdout=finished.stdout.strip()[-OUTPUT_KEPT:])
        if finished.ok:
            self.log(f"latency: {phase}, {label}: {finished.seconds:.2f} s")
        else:
            reason = (f"timed out after {self.options.timeout:g} s; its processes were killed"
                      if finished.timed_out else f"exit code {finished.returncode}")
            entry.update(reason=reason, stderr_tail=finished.stderr[-STDERR_TAIL:])
            self.fail(phase, label, reason, entry["stderr_tail"], entry["command"])
        store(entry)
        self.on_update(self.result)
        return entry, finished

    def warm_user_cache(self) -> None:
        """One unmeasured ``respond`` when the user's cache folder is empty, so that building its indexes (a
        first use's cost) is not inside the first measured run."""
        root = env_vars.cache_root()
        if self._warmed or not cache_state(root)["empty"]:
            return
        self._warmed = True
        self.measure("warmup", "respond to fill an empty cache folder", self.commands.respond(CONTENTION_MESSAGE),
                     {DSPY_CACHE_VAR: self.fresh_dir("dspy-cache")}, store=lambda e: self.result.update(warmup=e),
                     trace_cache=cache_state(root))

    def cold(self) -> None:
        fresh = self.options.cold_cache
        phase = self.result["cold"] = {"trace_cache": "fresh" if fresh else "user", "runs": [], "median_s": None}
        for i, message in enumerate(cold_messages(self.options.repeats), 1):
            extra = {DSPY_CACHE_VAR: self.fresh_dir("dspy-cache")}
            if fresh:
                extra[env_vars.CACHE] = self.fresh_dir("trace-cache")
            folder = Path(extra[env_vars.CACHE]) if fresh else env_vars.cache_root()
            self.measure("cold", f"message {i}", self.commands.respond(message), extra, phase["runs"].append,
                         message=message, trace_cache=cache_state(folder))
            phase["median_s"] = median_seconds(phase["runs"])

    def anchor(self, dialogues: list[list[str]]) -> None:
        phase = self.result["anchor"] = {"messages_file": str(self.options.messages or EVERYDAY),
                                         "dialogues": dialogues, "program": None, "raw": None, "ratio": None}
        self.warm_user_cache()
        phase["trace_cache"] = cache_state(env_vars.cache_root())
        given = self.workdir / "anchor-input.jsonl"
        # file-audit: writes the bench's own input file in its work folder
        given.write_text("".join(json.dumps({"id": str(i), "turns": turns}, ensure_ascii=False) + "\n"
                                 for i, turns in enumerate(dialogues, 1)), encoding="utf-8")
        answers = self.workdir / "anchor-output.jsonl"
        entry, _ = self.measure("anchor", "program", self.commands.respond_batch(given, answers),
                                {DSPY_CACHE_VAR: self.fresh_dir("dspy-cache")},
                                lambda e: phase.update(program=e), dialogues=len(dialogues))
        entry["replies"] = batch_replies(answers, len(dialogues))
        self.raw(phase, dialogues)
        program, raw = phase["program"], phase["raw"]
        if program["ok"] and raw and raw["ok"]:
            phase["ratio"] = ratio(program["seconds"], raw["seconds"])

    def raw(self, phase: dict[str, Any], dialogues: list[list[str]]) -> None:
        """The anchor's raw side: the embedded model alone, each dialogue once, in one process."""
        chats = [chat_messages(turns) for turns in dialogues]
        path = self.workdir / "anchor-chats.json"
        # file-audit: writes the chats file the raw-model script reads, in the bench's own work folder
        path.write_text(json.dumps(chats, ensure_ascii=False), encoding="utf-8")
        try:
            settings = self.commands.raw_settings()
        except (RuntimeError, ImportError, OSError) as exc:  # the model file or llama-cpp-python is missing
            reason = f"{type(exc).__name__}: {exc}"
            phase["raw"] = {"label": "raw model", "ok": False, "reason": reason}
            self.fail("anchor", "raw model", reason)
            return
        entry, finished = self.measure("anchor", "raw model", self.commands.raw(path, settings), {},
                                       lambda e: phase.update(raw=e), settings=settings, chats=chats)
        entry["replies"] = raw_replies(finished.stdout) if finished.ok else None
        entry.pop("stdout")
        if finished.ok and entry["replies"] is None:
            entry.update(ok=False, reason="its output is not the JSON list of replies")
            self.fail("anchor", "raw model", entry["reason"], finished.stderr[-STDERR_TAIL:], entry["command"])

    def contention(self) -> None:
        options = self.options
        counts = [0, *options.competing]
        phase = self.result["contention"] = {"message": options.message, "competing": list(options.competing),
                                             "competing_command": shlex.join(self.commands.hog()),
                                             "settle_s": options.settle, "runs": [], "conditions": []}
        self.warm_user_cache()
        phase["trace_cache"] = cache_state(env_vars.cache_root())
        for round_ in range(1, options.repeats + 1):
            for k in counts:  # rounds interleave the conditions, so that a drift in the machine hits them alike
                with competing(k, self.commands.hog(), settle=options.settle, started=self.hogs) as procs:
                    entry, _ = self.measure("contention", f"{k} competing, round {round_}",
                                            self.commands.respond(options.message),
                                            {DSPY_CACHE_VAR: self.fresh_dir("dspy-cache")}, phase["runs"].append,
                                            competing=k)
                    entry["competing_alive_after"] = sum(p.poll() is None for p in procs)
                phase["conditions"] = contention_conditions(phase["runs"], counts)


def measure_latency(options: LatencyOptions, *, commands: Commands | None = None, runner: Runner = run_process,
                    on_update: Callable[[dict[str, Any]], None] | None = None,
                    log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run the latency bench (see the module's docstring); the record's result."""
    bench = LatencyBench(options, commands or default_commands(options), runner=runner, on_update=on_update,
                         log=log)
    return bench.run()


def _seconds(entry: dict[str, Any] | None) -> str:
    if not entry:
        return "-"
    return f"{entry['seconds']:.2f}" if entry.get("ok") else f"failed: {entry.get('reason', '?')}"


def _number(value: float | None, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def latency_markdown(result: dict[str, Any]) -> str:
    """The record as a table (phase, what ran, wall seconds, ratio), then its failures."""
    rows: list[list[str]] = []
    cold = result.get("cold")
    if cold:
        rows += [["cold", f"respond, {r['label']} (trace cache {'empty' if r['trace_cache']['empty'] else 'filled'})",
                  _seconds(r), ""] for r in cold["runs"]]
        rows.append(["cold", f"median ({cold['trace_cache']} trace cache folder)", _number(cold["median_s"]), ""])
    anchor = result.get("anchor")
    if anchor:
        n = len(anchor["dialogues"])
        rows.append(["anchor", f"respond --input, {n} dialogues, one process", _seconds(anchor["program"]),
                     _number(anchor["ratio"])])
        rows.append(["anchor", f"raw model, the same {n}, one process", _seconds(anchor["raw"]), "1.00"])
    contention = result.get("contention")
    if contention:
        rows += [["contention", f"{c['competing']} competing, median of {c['ok_runs']} of {c['runs']}",
                  _number(c["median_s"]), _number(c["ratio_to_quiet"])] for c in contention["conditions"]]
    table = markdown_table(["phase", "what ran", "wall seconds", "ratio"], rows, align="llrr")
    load = result.get("load_at_start")
    notes = [f"load average at start: {', '.join(f'{x:.2f}' for x in load) if load else 'unknown'}"
             + (" (above --max-load; measured with --force)" if result.get("forced") else "")]
    notes += [f"FAILED {f['phase']}, {f['label']}: {f['reason']}" for f in result.get("failures", [])]
    return table + "\n\n" + "\n".join(f"- {line}" for line in notes)
