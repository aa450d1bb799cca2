"""The data loader: counts from the data README, leak-free splits, clear errors."""

from __future__ import annotations

import json
import logging

import pytest

from trace_dspy.core.labels import EMOTIONS
from trace_dspy.data.sources import (
    SEED_BANNER,
    DataError,
    conversations,
    load_splits,
    load_test,
    read_ed_csv,
    read_jsonl,
    resolve_source,
    select_view,
)

HEADER = ",dialogue_id,turns,text,emotion,dialogue_emotion\n"


@pytest.fixture(scope="module")
def ed(ed_dir):
    return resolve_source(ed_dir)


def test_counts_match_the_data_readme(ed):
    assert len(ed.pool) == 5734 and len(ed.test) == 5255
    assert len(conversations(ed.test)) == 2542
    assert len(select_view(ed.test, "trace")) == 2465
    assert len(select_view(ed.test, "cem")) == 5255
    assert {s.emotion for s in select_view(ed.test, "trace")} == set(EMOTIONS) - {"prepared"}
    # Per-length sample counts from the README table.
    lengths = [len(s.turns) + 1 for s in ed.test]
    assert [lengths.count(n) for n in (2, 4, 6, 8)] == [2542, 2533, 137, 43]


def test_trace_view_takes_the_longest_sample_per_conversation(ed):
    view = select_view(ed.test, "trace")
    longest = {cid: max(len(s.turns) for s in group) for cid, group in conversations(ed.test).items()}
    assert all(len(s.turns) == longest[s.conversation_id] for s in view)
    assert len({s.conversation_id for s in view}) == len(view)


def test_pool_split_never_leaks_a_conversation(ed):
    splits = load_splits(ed, seed=7)
    train_ids = {e.conversation_id for e in splits.train}
    dev_ids = {e.conversation_id for e in splits.dev}
    assert train_ids and dev_ids and not train_ids & dev_ids
    # Near-duplicates share a first turn: those must not straddle either.
    first = lambda e: e.dialogue.split("\n")[0]  # noqa: E731
    assert not {first(e) for e in splits.train} & {first(e) for e in splits.dev}
    # Seeded: the same seed gives the same split, another seed a different one.
    again = load_splits(ed, seed=7)
    assert [e.sample_id for e in again.dev] == [e.sample_id for e in splits.dev]
    assert {e.sample_id for e in load_splits(ed, seed=8).dev} != {e.sample_id for e in splits.dev}


def test_examples_have_dialogue_as_the_only_input(ed):
    ex = load_test(ed, view="trace", limit=5, seed=1)
    assert len(ex) == 5
    for e in ex:
        assert set(e.inputs().keys()) == {"dialogue"}
        assert e.emotion in EMOTIONS and e.response
        assert e.dialogue.splitlines()[-1].startswith("Speaker: ")
    assert [e.sample_id for e in ex] == [e.sample_id for e in load_test(ed, view="trace", limit=5, seed=1)]


def test_sizes_are_applied(ed):
    splits = load_splits(ed, seed=0, train_size=10, dev_size=4)
    assert (len(splits.train), len(splits.dev)) == (10, 4)


def test_env_var_is_used_when_no_flag(ed_dir, monkeypatch):
    monkeypatch.setenv("TRACE_DSPY_DATA", str(ed_dir))
    assert resolve_source().kind == "ed-csv"


def test_seed_set_is_used_loudly_when_nothing_is_configured(monkeypatch, caplog):
    monkeypatch.delenv("TRACE_DSPY_DATA", raising=False)
    with caplog.at_level(logging.WARNING):
        source = resolve_source()
    assert source.is_seed and SEED_BANNER in caplog.text
    samples = source.pool + source.test
    assert len(samples) >= 64 and {s.emotion for s in samples} == set(EMOTIONS)
    assert all(s.response and s.turns for s in samples)
    splits = load_splits(source, seed=0)
    assert splits.train and splits.dev and not (
        {e.conversation_id for e in splits.train} & {e.conversation_id for e in splits.dev})
    assert not {s.conversation_id for s in source.pool} & {s.conversation_id for s in source.test}


def _csv(tmp_path, body, name="valid.csv"):
    path = tmp_path / name
    path.write_text(HEADER + body)
    return path


@pytest.mark.parametrize(("body", "where", "what"), [
    ("0,1,1,hello,sad,sad\n1,1,2,hi,sad,sad\n2,2,x,oops,sad,sad\n", ":4:", "integer"),
    ("0,1,1,hello,sad,sad\n1,1,2,hi,sad\n", ":3:", "expected 6 fields"),
    ("0,1,1,hello,sad,sad\n1,1,2,hi,sad,sad\n2,2,1,hey,x,sadd\n3,2,2,ho,x,sadd\n", ":4:", "unknown dialogue_emotion"),
    ("0,1,1,hello,sad,sad\n1,1,2,hi,sad,sad\n2,1,3,again,sad,sad\n", ":4:", "ends on a speaker turn"),
    ("0,1,1,hello,sad,sad\n1,1,3,hi,sad,sad\n", ":2:", "expected 1..2"),
    ("0,1,1,,sad,sad\n", ":2:", "empty text"),
])
def test_malformed_csv_names_file_and_line(tmp_path, body, where, what):
    path = _csv(tmp_path, body)
    with pytest.raises(DataError) as info:
        read_ed_csv(path)
    assert str(path) + where in str(info.value) and what in str(info.value)


def test_rows_whose_label_disagrees_are_reported_once_per_file_with_a_count(tmp_path, caplog):
    body = ("0,1,1,hello,sad,sad\n1,1,2,hi,sad,sadacknowledging\n"
            "2,2,1,hey,sad,sad\n3,2,2,ho,sad,sadquestioning\n")
    path = _csv(tmp_path, body)
    with caplog.at_level("WARNING", logger="trace_dspy.data.sources"):
        first = read_ed_csv(path)
        again = read_ed_csv(path)  # read again (another split): no second warning
    warned = [r.getMessage() for r in caplog.records if "differs from the sample's first row" in r.getMessage()]
    assert len(warned) == 1 and f"{path}:3:" in warned[0] and "2 rows" in warned[0], warned
    assert [s.emotion for s in first] == [s.emotion for s in again] == ["sad", "sad"]


def test_csv_header_and_quoted_newlines(tmp_path):
    path = tmp_path / "valid.csv"
    path.write_text("a,b\n1,2\n")
    with pytest.raises(DataError, match=r"valid.csv:1: header lacks"):
        read_ed_csv(path)
    # A quoted field spanning lines: later line numbers still point at the right line.
    path = _csv(tmp_path, '0,1,1,"two\nlines",sad,sad\n1,1,2,ok,sad,sad\n2,2,1,x,sad,sad\n3,2,z,y,sad,sad\n')
    with pytest.raises(DataError, match=r"valid.csv:6: turns must be an integer"):
        read_ed_csv(path)


def _jsonl(tmp_path, records):
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in records) + "\n")
    return path


GOOD = {"turns": ["I got the job!"], "emotion": "joyful", "reply": "Congratulations!"}


@pytest.mark.parametrize(("bad", "what"), [
    ("{not json", "invalid JSON"),
    ({"turns": ["x"], "emotion": "joyful"}, "missing key 'reply'"),
    ({**GOOD, "turns": ["a", "b"]}, "must end on the speaker"),
    ({**GOOD, "turns": []}, "non-empty list"),
    ({**GOOD, "emotion": "happy"}, "unknown emotion"),
    ({**GOOD, "reply": "  "}, "'reply'"),
    ([1, 2], "expected a JSON object"),
])
def test_malformed_jsonl_names_file_and_line(tmp_path, bad, what):
    path = _jsonl(tmp_path, [GOOD, {**GOOD, "id": "b"}, bad])
    with pytest.raises(DataError) as info:
        read_jsonl(path)
    assert f"{path}:3:" in str(info.value) and what in str(info.value)


def test_jsonl_invalid_utf8_and_duplicates(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_bytes(json.dumps(GOOD).encode() + b"\n\xff\xfe\n")
    with pytest.raises(DataError, match=r"d.jsonl:2: not valid UTF-8"):
        read_jsonl(path)
    path = _jsonl(tmp_path, [{**GOOD, "id": "a"}, {**GOOD, "id": "a"}])
    with pytest.raises(DataError, match=r"d.jsonl:2: duplicate id"):
        read_jsonl(path)


def test_single_jsonl_file_is_partitioned(tmp_path):
    records = [{**GOOD, "id": f"s{i}", "emotion": EMOTIONS[i % 32]} for i in range(40)]
    source = resolve_source(_jsonl(tmp_path, records))
    assert source.kind == "jsonl-file" and len(source.test) == 10 and len(source.pool) == 30
    assert not {s.sample_id for s in source.pool} & {s.sample_id for s in source.test}


def test_missing_path_and_incomplete_directory(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        resolve_source(tmp_path / "nope")
    _csv(tmp_path, "0,1,1,a,sad,sad\n1,1,2,b,sad,sad\n")
    with pytest.raises(DataError, match="test.csv is missing"):
        resolve_source(tmp_path)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DataError, match="no valid.csv"):
        resolve_source(empty)


def test_hub_offline_error_says_how_to_use_local_files(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(DataError) as info:
        resolve_source("hf:someone/empathetic_dialogues")
    message = str(info.value)
    assert "someone/empathetic_dialogues" in message and "TRACE_DSPY_DATA" in message and "valid.csv" in message
