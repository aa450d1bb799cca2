"""``bench blind``: a blind reading of two programs' replies, prepared, filled in by a reader who sees only the
reading, then unblinded and tallied; the refusals that keep a reading honest and never lose one."""

from __future__ import annotations

import json
import re
from pathlib import Path

from trace_dspy.bench.blind import template_checks
from trace_dspy.cli.bench import main

THINGS = ["my keys", "the bus", "my exam", "the party", "my sister", "the garden", "my bike", "the concert",
          "my job", "the weather"]
# Program A answers every message with one template; B says something of its own.
A_REPLY = "I'm sorry. How are you feeling about {}?"
B_REPLY = "That must have been quite something, {} of all things."
TIES = {"m0", "m1"}  # messages the reader finds no better reply to: their text says "(even)"
BAD_B = {"m2", "m3"}  # B's replies the reader would not send: they say "NOPE"


def _row(item_id: str, message: str, reply: str | None, line: int) -> dict:
    row = {"id": item_id, "line": line, "dialogue_sha256": "0" * 64, "trace_dspy_output": 1}
    if reply is None:
        return {**row, "error": "RuntimeError: the LM failed"}
    return {**row, "dialogue": f"Speaker: {message}", "response": reply, "stages": {}}


def _message(i: int) -> str:
    return f"Today was about {THINGS[i]}{' (even)' if f'm{i}' in TIES else ''}."


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _programs(tmp_path: Path, *, a_name: str = "compiled-A.jsonl", b_name: str = "baseline-B.jsonl"):
    a_rows, b_rows = [], []
    for i, thing in enumerate(THINGS):
        b_reply = B_REPLY.format(thing) + (" NOPE" if f"m{i}" in BAD_B else "")
        a_rows.append(_row(f"m{i}", _message(i), A_REPLY.format(thing), i + 1))
        b_rows.append(_row(f"m{i}", _message(i), b_reply, i + 1))
    return _write(tmp_path / a_name, a_rows), _write(tmp_path / b_name, b_rows)


def _prepare(a: Path, b: Path, out: Path, seed: int = 5) -> int:
    return main(["blind", "prepare", "--a", str(a), "--b", str(b), "--out", str(out), "--seed", str(seed)])


def _items(reading: str) -> list[tuple[int, str, str, str]]:
    """(item, message, reply 1, reply 2) as a reader sees them in reading.md."""
    found = re.findall(r"## Item (\d+)\n\n\*\*Message\*\*\n\n> (.*?)\n\n\*\*Reply 1\*\*\n\n> (.*?)\n\n"
                       r"\*\*Reply 2\*\*\n\n> (.*?)\n", reading)
    return [(int(k), m, r1, r2) for k, m, r1, r2 in found]


def _read_and_judge(folder: Path, skip: frozenset[int] = frozenset()) -> None:
    """A reader who sees only reading.md fills verdicts.jsonl: a tie for "(even)", else the reply without
    NOPE, else the one that is not the template; a reply with NOPE is not sendable."""
    verdicts = []
    for item, message, one, two in _items((folder / "reading.md").read_text(encoding="utf-8")):
        if item in skip:
            prefer = None
        elif "(even)" in message:
            prefer = "tie"
        elif "NOPE" in one or "NOPE" in two:
            prefer = "2" if "NOPE" in one else "1"
        else:
            prefer = "2" if "feeling about" in one else "1"
        verdicts.append({"item": item, "prefer": prefer, "sendable_1": None if item in skip else "NOPE" not in one,
                         "sendable_2": None if item in skip else "NOPE" not in two, "note": ""})
    _write(folder / "verdicts.jsonl", verdicts)


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


def test_prepare_then_a_blind_reading_then_score_gives_the_unblinded_tally(tmp_path, capsys):
    a, b = _programs(tmp_path)
    assert _prepare(a, b, tmp_path / "reading") == 0
    _read_and_judge(tmp_path / "reading")
    capsys.readouterr()
    assert main(["blind", "score", "--dir", str(tmp_path / "reading"), "--json", str(tmp_path / "tally.json")]) == 0
    printed = capsys.readouterr().out
    assert "preferred: A 2, B 6, tie 2 (B preferred or tied: 8 of 10)" in printed
    assert "| sendable | 10 of 10 | 8 of 10 |" in printed
    assert '| ask "How are you feeling about" | 10 | 0 |' in printed
    tally = json.loads((tmp_path / "tally.json").read_text(encoding="utf-8"))
    assert tally["preferred"] == {"A": 2, "B": 6, "tie": 2, "B_or_tie": 8}
    assert tally["sendable"] == {"A": 10, "B": 8}
    assert tally["templates"]["A"] == {"feeling_about": 10, "top_3gram": "are you feeling", "top_3gram_replies": 10}
    assert tally["files"]["A"]["path"] == str(a) and len(tally["files"]["B"]["sha256"]) == 64
    by_id = {v["id"]: v for v in tally["verdicts"]}
    assert {i for i, v in by_id.items() if v["prefer"] == "tie"} == TIES
    assert {i for i, v in by_id.items() if v["prefer"] == "A"} == BAD_B
    assert {i for i, v in by_id.items() if not v["sendable_B"]} == BAD_B
    assert all(v["sendable_A"] for v in by_id.values())


def test_the_reading_never_says_which_program_wrote_which_reply(tmp_path):
    a, b = _programs(tmp_path, a_name="trace-compiled.jsonl", b_name="single-cot.jsonl")
    assert _prepare(a, b, tmp_path / "reading") == 0
    shown = (tmp_path / "reading" / "reading.md").read_text(encoding="utf-8")
    shown += (tmp_path / "reading" / "verdicts.jsonl").read_text(encoding="utf-8")
    for leak in ("trace-compiled", "single-cot", str(tmp_path), "compiled", "cot"):
        assert leak not in shown
    assert not re.search(r"\b[AB]\b", shown)  # no "reply A", "program B"
    assert not re.search(r"\bm\d\b", shown)  # nor the ids, which follow the input's order
    assert len(_items(shown)) == 10


def test_the_order_is_shuffled_and_the_seed_repeats_it(tmp_path):
    a, b = _programs(tmp_path)
    for name, seed in (("one", 5), ("again", 5), ("other", 6)):
        assert _prepare(a, b, tmp_path / name, seed) == 0
    same = [(tmp_path / name / "reading.md").read_bytes() for name in ("one", "again")]
    assert same[0] == same[1]
    assert (tmp_path / "other" / "reading.md").read_bytes() != same[0]
    key = json.loads((tmp_path / "one" / "key.json").read_text(encoding="utf-8"))
    order = [it["id"] for it in key["items"]]
    assert sorted(order) == sorted(f"m{i}" for i in range(10)) and order != [f"m{i}" for i in range(10)]
    assert sum(it["one"] == "A" for it in key["items"]) == 5  # half the items show A's reply first
    # each item's reply 1 is the one the key says
    for (item, _, one, _), it in zip(_items(same[0].decode()), key["items"]):
        assert item == it["item"] and one == it[it["one"]]


def test_files_that_answer_other_ids_are_refused_naming_them(tmp_path, capsys):
    a, b = _programs(tmp_path)
    rows = [json.loads(line) for line in b.read_text(encoding="utf-8").splitlines()]
    rows[3]["id"] = "extra-1"
    _write(b, rows)
    assert _prepare(a, b, tmp_path / "reading") == 2
    line = _one_error_line(capsys)
    assert f"only in {a}: m3" in line and f"only in {b}: extra-1" in line
    assert not (tmp_path / "reading").exists()


def test_a_row_without_a_reply_is_refused_naming_it(tmp_path, capsys):
    a, b = _programs(tmp_path)
    rows = [json.loads(line) for line in b.read_text(encoding="utf-8").splitlines()]
    rows[4] = _row("m4", _message(4), None, 5)
    _write(b, rows)
    assert _prepare(a, b, tmp_path / "reading") == 2
    assert f"{b}: no reply for m4" in _one_error_line(capsys)


def test_a_filled_verdicts_file_is_never_overwritten(tmp_path, capsys):
    a, b = _programs(tmp_path)
    folder = tmp_path / "reading"
    assert _prepare(a, b, folder) == 0
    assert _prepare(a, b, folder, seed=9) == 0  # nothing read yet: a new reading may replace it
    _read_and_judge(folder, skip=frozenset(range(2, 11)))  # item 1 read, the rest not yet
    before = {name: (folder / name).read_bytes() for name in ("verdicts.jsonl", "key.json", "reading.md")}
    capsys.readouterr()
    assert _prepare(a, b, folder, seed=10) == 2
    assert "holds verdicts (items 1)" in _one_error_line(capsys)
    assert {name: (folder / name).read_bytes() for name in before} == before


def test_missing_or_invalid_verdicts_are_refused_naming_the_items(tmp_path, capsys):
    a, b = _programs(tmp_path)
    folder = tmp_path / "reading"
    assert _prepare(a, b, folder) == 0
    _read_and_judge(folder, skip=frozenset({3, 7}))
    rows = [json.loads(line) for line in (folder / "verdicts.jsonl").read_text(encoding="utf-8").splitlines()]
    rows[4]["prefer"] = "A"  # item 5: a program's name is not a verdict
    rows[5]["sendable_2"] = None  # item 6: half filled
    _write(folder / "verdicts.jsonl", rows)
    capsys.readouterr()
    assert main(["blind", "score", "--dir", str(folder), "--json", str(tmp_path / "tally.json")]) == 2
    line = _one_error_line(capsys)
    assert "2 of 10 items have no verdict yet: 3, 7" in line
    assert 'item 5 (prefer must be "1", "2" or "tie", not "A")' in line
    assert "item 6 (sendable_2 not filled in)" in line
    assert not (tmp_path / "tally.json").exists()


def test_template_checks_count_the_phrase_and_each_3gram_once_per_reply():
    replies = [
        "That sounds hard. That sounds hard. That sounds hard. That sounds hard.",
        "that SOUNDS hard, truly",
        "How are you feeling about it? How are you feeling about it?",
        "how are you FEELING ABOUT the move",
        "how are you, really",
        "Nothing to see here",
    ]
    # "that sounds hard" is said 5 times but in 2 replies; "how are you" in 3
    assert template_checks(replies) == {"feeling_about": 2, "top_3gram": "how are you", "top_3gram_replies": 3}
    assert template_checks(["Short one", ""]) == {"feeling_about": 0, "top_3gram": None, "top_3gram_replies": 0}
