"""A blind reading of two programs' replies to the same messages: prepare it, then unblind and tally it.

``prepare`` pairs the rows of two ``respond --input ... --output`` files (A and B) by id, shuffles the
items and, for each item, which program's reply is shown first (a seeded RNG, balanced: half the items show
A first), and writes to one folder:

- ``reading.md``: each message with its two replies labelled "1" and "2", nothing that tells which program
  wrote which (no file names, no ids, items in the shuffled order);
- ``verdicts.jsonl``: one line per item for the reader to fill in: ``prefer`` ("1", "2" or "tie"),
  ``sendable_1`` and ``sendable_2`` (true or false: would a friend send this reply as it is), ``note``;
- ``key.json``: which program is "1" on each item, the two files' sha256, and the replies (so that the
  score needs neither file again).

A verdicts file that holds any filled verdict is never overwritten: a reading is not lost to a second
``prepare``. ``score`` refuses verdicts that are missing or invalid (naming the items), unblinds them and
counts: which program was preferred, how many of each one's replies are sendable, and two template checks
per program (replies that ask "How are you feeling about", and the most replies that share one word
3-gram). Every mistake a user can make is a :class:`BlindError`, one line.
"""

from __future__ import annotations

import hashlib
import random
import re
import secrets
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

READING, VERDICTS, KEY = "reading.md", "verdicts.jsonl", "key.json"
KEY_KIND = "trace-dspy blind reading key"
PROGRAMS = ("A", "B")
PREFER = ("1", "2", "tie")
TEMPLATE_PHRASE = "how are you feeling about"
# Bounds on the files read: a respond output (a few KB a row), the verdicts and the key.
MAX_REPLIES_BYTES = 256 * 1024 * 1024
MAX_VERDICTS_BYTES = 64 * 1024 * 1024
MAX_KEY_BYTES = 512 * 1024 * 1024
# Items named in one error line at most.
NAMED = 10
_WORD = re.compile(r"\w+(?:['\u2019]\w+)*")


class BlindError(ValueError):
    """A reading that cannot be prepared or scored as asked; the message is one line, and nothing was changed."""


def _named(things: list[str]) -> str:
    """The first ``NAMED`` of ``things``, comma-separated, and how many more there are."""
    more = f" and {len(things) - NAMED} more" if len(things) > NAMED else ""
    return ", ".join(things[:NAMED]) + more


def _read(path: Path, max_bytes: int) -> bytes:
    from trace_dspy.core.files import FileCheckError, read_bytes

    try:
        return read_bytes(path, max_bytes=max_bytes)
    except FileCheckError as exc:
        raise BlindError(str(exc)) from None


def _json_lines(path: Path, data: bytes) -> list[tuple[int, Any]]:
    """(line number, decoded JSON) of each non-blank line of ``data``; a line that is not JSON is an error."""
    from trace_dspy.core.safety import JSONLimitError, load_json

    rows = []
    for number, raw in enumerate(data.splitlines(), 1):
        if raw.strip():
            try:
                rows.append((number, load_json(raw, f"{path}:{number}")))
            except JSONLimitError as exc:
                raise BlindError(str(exc)) from None
    return rows


# ---------------------------------------------------------------- the two programs' replies

def _text(value: str) -> str:
    """``value`` as text that can be written as UTF-8 (a lone surrogate, which JSON allows, becomes "?")."""
    return value.encode("utf-8", "replace").decode("utf-8")


@dataclass(frozen=True)
class Replies:
    """One program's replies: its file, the file's sha256, and ``rows`` (id -> (dialogue, response))."""

    path: Path
    sha256: str
    rows: dict[str, tuple[str, str]]


def read_replies(path: Path) -> Replies:
    """The replies of a ``respond`` output, by id; a row without a reply (an error row, no response, no
    dialogue) or a repeated id is refused, naming the ids."""
    data = _read(path, MAX_REPLIES_BYTES)
    rows: dict[str, tuple[str, str]] = {}
    unanswered, repeated = [], []
    for number, row in _json_lines(path, data):
        if not isinstance(row, dict) or not isinstance(row.get("id"), (str, int)) or isinstance(row["id"], bool):
            raise BlindError(f"{path}:{number}: not a respond output row (a JSON object with an 'id')")
        item_id, dialogue, response = str(row["id"]), row.get("dialogue"), row.get("response")
        if item_id in rows or item_id in unanswered:
            repeated.append(item_id)
        elif "error" in row or not (isinstance(response, str) and response.strip()) or not isinstance(dialogue, str):
            unanswered.append(item_id)
        else:
            rows[item_id] = (_text(dialogue), _text(response))
    if repeated:
        raise BlindError(f"{path}: ids must be unique; repeated: {_named(repeated)}")
    if unanswered:
        raise BlindError(f"{path}: no reply for {_named(unanswered)} (an error row, or no response or dialogue); "
                         "answer them again with respond, or leave them out of both files")
    if not rows:
        raise BlindError(f"{path}: no replies")
    return Replies(path, hashlib.sha256(data).hexdigest(), rows)


def pair(a: Replies, b: Replies) -> list[str]:
    """The ids both files answer, in A's order; refused unless both answer the same ids with the same
    dialogues (then they are replies to the same messages)."""
    only_a = [i for i in a.rows if i not in b.rows]
    only_b = [i for i in b.rows if i not in a.rows]
    if only_a or only_b:
        said = "; ".join(f"only in {p.path}: {_named(ids)}" for p, ids in ((a, only_a), (b, only_b)) if ids)
        raise BlindError(f"the two files answer different ids ({said}); give both programs the same input")
    differ = [i for i in a.rows if a.rows[i][0] != b.rows[i][0]]
    if differ:
        raise BlindError(f"the two files answer different messages under the same ids: {_named(differ)}; "
                         "give both programs the same input")
    return list(a.rows)


# ---------------------------------------------------------------- prepare

def _shuffled(ids: list[str], seed: int) -> list[tuple[str, str]]:
    """(id, the program shown as "1") in the reading's order: the items shuffled, and half of them (the odd
    one by a coin) showing A first, in a shuffled pattern; the same seed gives the same reading."""
    rng = random.Random(seed)
    order = list(ids)
    rng.shuffle(order)
    firsts = list(PROGRAMS) * (len(order) // 2) + ([rng.choice(PROGRAMS)] if len(order) % 2 else [])
    rng.shuffle(firsts)
    return list(zip(order, firsts))


def _quoted(text: str) -> str:
    from trace_dspy.core.safety import terminal_safe

    return "\n".join("> " + line if line.strip() else ">" for line in terminal_safe(text).splitlines() or [""])


def reading_markdown(items: list[dict]) -> str:
    """The reading: each item's message and its replies "1" and "2", nothing about which program is which."""
    parts = [
        "# Blind reading\n",
        f"{len(items)} messages, each with two replies labelled 1 and 2. For each item, fill in its line of "
        f"{VERDICTS}: `prefer` is \"1\", \"2\" or \"tie\"; `sendable_1` and `sendable_2` are true or false "
        "(would a friend send this reply as it is); `note` is anything you want to say.\n",
    ]
    for item in items:
        one, two = item["one"], "B" if item["one"] == "A" else "A"
        parts.append(f"## Item {item['item']}\n\n**Message**\n\n{_quoted(item['message'])}\n\n"
                     f"**Reply 1**\n\n{_quoted(item[one])}\n\n**Reply 2**\n\n{_quoted(item[two])}\n")
    return "\n".join(parts)


def _filled(row: dict) -> bool:
    return (any(row.get(k) is not None for k in ("prefer", "sendable_1", "sendable_2"))
            or row.get("note") not in (None, ""))


def check_no_reading(folder: Path) -> None:
    """Refuse a folder whose verdicts file holds a filled verdict, or one that cannot be read (it may)."""
    path = folder / VERDICTS
    if not path.exists() and not path.is_symlink():
        return
    try:
        rows = _json_lines(path, _read(path, MAX_VERDICTS_BYTES))
    except BlindError as exc:
        raise BlindError(f"{exc}; {path} may hold a reading, so it was left as it is: move it away or choose "
                         "another --out") from None
    filled = [str(row.get("item", f"line {n}")) if isinstance(row, dict) else f"line {n}"
              for n, row in rows if not isinstance(row, dict) or _filled(row)]
    if filled:
        raise BlindError(f"{path} holds verdicts (items {_named(filled)}); it was left as it is: score it, or "
                         "move it away or choose another --out for a new reading")


@dataclass(frozen=True)
class Prepared:
    folder: Path
    items: int
    seed: int


def prepare(a_path: Path, b_path: Path, folder: Path, seed: int | None = None) -> Prepared:
    """Write the reading, the empty verdicts and the key for A's and B's replies to ``folder`` (see the
    module's docstring); ``seed`` None: a random one, kept in the key."""
    from trace_dspy.core.jsonl import atomic_write_json, atomic_write_lines, atomic_write_text

    a, b = read_replies(Path(a_path)), read_replies(Path(b_path))
    ids = pair(a, b)
    folder = Path(folder)
    check_no_reading(folder)
    seed = secrets.randbelow(2**32) if seed is None else seed
    items = [{"item": k, "id": item_id, "one": one, "message": a.rows[item_id][0],
              "A": a.rows[item_id][1], "B": b.rows[item_id][1]}
             for k, (item_id, one) in enumerate(_shuffled(ids, seed), 1)]
    key = {"kind": KEY_KIND, "seed": seed,
           "files": {name: {"path": str(r.path), "sha256": r.sha256} for name, r in zip(PROGRAMS, (a, b))},
           "items": items}
    folder.mkdir(parents=True, exist_ok=True)
    # The key first: should the process stop between the writes, no verdicts exist without their key.
    atomic_write_json(folder / KEY, key)
    atomic_write_text(folder / READING, reading_markdown(items))
    atomic_write_lines(folder / VERDICTS, ({"item": it["item"], "prefer": None, "sendable_1": None,
                                            "sendable_2": None, "note": ""} for it in items))
    return Prepared(folder, len(items), seed)


# ---------------------------------------------------------------- score

def read_key(folder: Path) -> dict:
    """The key ``prepare`` wrote to ``folder``, its shape checked."""
    from trace_dspy.core.safety import JSONLimitError, load_json

    path = Path(folder) / KEY
    try:
        key = load_json(_read(path, MAX_KEY_BYTES), str(path), max_bytes=MAX_KEY_BYTES)
    except JSONLimitError as exc:
        raise BlindError(str(exc)) from None
    item_fields = {"item": int, "id": str, "one": str, "message": str, "A": str, "B": str}
    ok = (isinstance(key, dict) and key.get("kind") == KEY_KIND and isinstance(key.get("items"), list)
          and key["items"] and isinstance(key.get("files"), dict)
          and all(isinstance(key["files"].get(p), dict) for p in PROGRAMS)
          and all(isinstance(it, dict) and all(isinstance(it.get(f), t) for f, t in item_fields.items())
                  and it["one"] in PROGRAMS for it in key["items"])
          and len({it["item"] for it in key["items"]}) == len(key["items"]))
    if not ok:
        raise BlindError(f"{path} is not a key written by `bench blind prepare`")
    return key


def preference(value: Any) -> str | None:
    """A verdict's ``prefer`` as "1", "2" or "tie" (the numbers 1 and 2, any case and spaces are taken), or
    None when it is none of them."""
    if type(value) is int and value in (1, 2):
        return str(value)
    text = value.strip().lower() if isinstance(value, str) else None
    return text if text in PREFER else None


def _verdict_problem(row: dict) -> str | None:
    """What is missing or invalid in one item's verdict, or None."""
    missing = [f for f in ("prefer", "sendable_1", "sendable_2") if row.get(f) is None]
    if missing:
        return f"{' and '.join(missing)} not filled in"
    if preference(row["prefer"]) is None:
        return f'prefer must be "1", "2" or "tie", not {_shown(row["prefer"])}'
    for field in ("sendable_1", "sendable_2"):
        if not isinstance(row[field], bool):
            return f"{field} must be true or false, not {_shown(row[field])}"
    if not isinstance(row.get("note", ""), (str, type(None))):
        return "note must be text"
    return None


def _shown(value: Any) -> str:
    import json

    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 20 else text[:17] + "..."


def read_verdicts(folder: Path, items: list[int]) -> dict[int, dict]:
    """The reader's verdict on each of ``items`` (the key's), by item; refused, naming the items, when any is
    missing, invalid, repeated or not one of the key's."""
    path = Path(folder) / VERDICTS
    verdicts: dict[int, dict] = {}
    problems: list[str] = []
    known = set(items)
    for number, row in _json_lines(path, _read(path, MAX_VERDICTS_BYTES)):
        item = row.get("item") if isinstance(row, dict) else None
        if not isinstance(item, int) or isinstance(item, bool) or item not in known:
            problems.append(f"line {number} (not an item of the key)")
        elif item in verdicts:
            problems.append(f"item {item} (given twice)")
        else:
            verdicts[item] = row
    unfilled = {item for item in items if item not in verdicts or not _filled(verdicts[item])}
    empty = [str(item) for item in items if item in unfilled]
    for item in items:
        problem = None if item in unfilled else _verdict_problem(verdicts[item])
        if problem:
            problems.append(f"item {item} ({problem})")
    if empty or problems:
        said = ([f"{len(empty)} of {len(items)} items have no verdict yet: {_named(empty)}"] if empty else []) + (
            [f"{len(problems)} missing or invalid: {_named(problems)}"] if problems else [])
        raise BlindError(f"{path}: {'; '.join(said)}; fill them in (prefer \"1\", \"2\" or \"tie\"; sendable_1 "
                         "and sendable_2 true or false) and score again")
    return verdicts


def words(text: str) -> list[str]:
    """The lower-cased word tokens of ``text`` (an apostrophe inside a word keeps it one word: "i'm")."""
    return _WORD.findall(text.lower())


def template_checks(replies: list[str]) -> dict[str, Any]:
    """How many replies ask "How are you feeling about" (any case), and the most replies that share one word
    3-gram (each 3-gram counted once per reply), with that 3-gram (the first in alphabetical order on a tie)."""
    shared: Counter[str] = Counter()
    for reply in replies:
        tokens = words(reply)
        shared.update({" ".join(tokens[i:i + 3]) for i in range(len(tokens) - 2)})
    top = min(shared.items(), key=lambda kv: (-kv[1], kv[0])) if shared else (None, 0)
    return {"feeling_about": sum(TEMPLATE_PHRASE in reply.lower() for reply in replies),
            "top_3gram": top[0], "top_3gram_replies": top[1]}


def unblind(item: dict, verdict: dict) -> dict:
    """One item's verdict in the programs' names: preferred "A", "B" or "tie", and each one's sendable."""
    one, two = item["one"], "B" if item["one"] == "A" else "A"
    prefer = preference(verdict["prefer"])
    sendable = {one: verdict["sendable_1"], two: verdict["sendable_2"]}
    return {"item": item["item"], "id": item["id"], "one": one, "prefer": {"1": one, "2": two}.get(prefer, "tie"),
            "sendable_A": sendable["A"], "sendable_B": sendable["B"], "note": verdict.get("note") or ""}


def score(folder: Path) -> dict[str, Any]:
    """The unblinded tally of the reading in ``folder``: preferences, sendable replies and template checks per
    program, the files' digests and every item's verdict (see the module's docstring)."""
    key = read_key(Path(folder))
    items = key["items"]
    verdicts = read_verdicts(Path(folder), [it["item"] for it in items])
    rows = [unblind(it, verdicts[it["item"]]) for it in items]
    preferred = Counter(row["prefer"] for row in rows)
    return {
        "items": len(rows),
        "files": {p: key["files"][p] for p in PROGRAMS},
        "seed": key.get("seed"),
        "preferred": {"A": preferred["A"], "B": preferred["B"], "tie": preferred["tie"],
                      "B_or_tie": preferred["B"] + preferred["tie"]},
        "sendable": {p: sum(row[f"sendable_{p}"] for row in rows) for p in PROGRAMS},
        "templates": {p: template_checks([it[p] for it in items]) for p in PROGRAMS},
        "verdicts": sorted(rows, key=lambda row: row["item"]),
    }


def score_text(result: dict[str, Any]) -> str:
    """The tally as a few lines and a markdown table."""
    n, pref, files = result["items"], result["preferred"], result["files"]
    cells = {p: result["templates"][p] for p in PROGRAMS}

    def gram(p: str) -> str:
        t = cells[p]
        return f'{t["top_3gram_replies"]} ("{t["top_3gram"]}")' if t["top_3gram"] else "0"

    lines = [
        f"{n} items read blind; A = {files['A']['path']} (sha256 {files['A']['sha256'][:12]}), "
        f"B = {files['B']['path']} (sha256 {files['B']['sha256'][:12]})",
        f"preferred: A {pref['A']}, B {pref['B']}, tie {pref['tie']} (B preferred or tied: {pref['B_or_tie']} of {n})",
        "",
        "| of the replies | A | B |",
        "|---|---:|---:|",
        f"| preferred | {pref['A']} | {pref['B']} |",
        f"| sendable | {result['sendable']['A']} of {n} | {result['sendable']['B']} of {n} |",
        f'| ask "How are you feeling about" | {cells["A"]["feeling_about"]} | {cells["B"]["feeling_about"]} |',
        f"| most that share one 3-gram | {gram('A')} | {gram('B')} |",
    ]
    return "\n".join(lines)
