"""A dialogue given as a list names the turn that is wrong, counting turns from 1 as a person reads them."""

from __future__ import annotations

import json

import pytest
from conftest import FAST_CONFIG, echo_reply, offline_workdir

from trace_dspy.core.dialogue import DialogueError, parse_dialogue
from trace_dspy.testing.fakes import fake_lm


@pytest.mark.parametrize(("turns", "named"), [
    (["hi there", None, "ok"], "turn 2: expected a string like the other turns, got null"),
    (["hi there", "ok", None], "turn 3: expected a string like the other turns, got null"),
    ([None, "hi there"], "turn 1: expected a string like the other turns, got null"),
    (["hi there", 7, "ok"], "turn 2: expected a string like the other turns, got 7"),
    (["hi there", {"role": "listener", "text": "hm"}, "ok"], "turn 2: expected a string like the other turns"),
])
def test_the_odd_turn_in_a_list_of_strings_is_the_one_named(turns, named):
    with pytest.raises(DialogueError) as caught:
        parse_dialogue(turns)
    assert str(caught.value).startswith(named)


def test_a_list_of_mappings_still_names_its_bad_turn():
    with pytest.raises(DialogueError, match=r"^turn 2: expected a string or a mapping"):
        parse_dialogue([{"role": "speaker", "text": "hi"}, None])


def test_a_null_turn_in_a_batch_line_names_turn_2(tmp_path, monkeypatch, capsys):
    from trace_dspy.cli.respond import main

    lm, _ = fake_lm(echo_reply)
    offline_workdir(tmp_path, monkeypatch, lm)
    (tmp_path / "fast.toml").write_text(FAST_CONFIG)
    (tmp_path / "in.jsonl").write_text(json.dumps({"id": "a", "turns": ["hi there", None, "ok"]}) + "\n")
    code = main(["--program", "default", "--config", "fast.toml", "--input", "in.jsonl", "--output", "out.jsonl"])
    assert code == 1  # the one dialogue failed
    row = json.loads((tmp_path / "out.jsonl").read_text().splitlines()[0])
    assert row["id"] == "a" and row["error"].startswith("in.jsonl:1: turn 2: "), row
