"""Retrieved exemplars: never the query's own conversation, group filter with fallback, wiring."""

from __future__ import annotations

import dspy
import pytest

from trace_dspy import ProgramConfig, TraceProgram
from trace_dspy.core.config import ConfigError
from trace_dspy.data.retrieval import (
    ExemplarIndex,
    RetrievalConfig,
    cached_index,
    conversation_key,
)
from trace_dspy.testing.fakes import fake_lm


def ex(i, first, emotion, later=None, reply="reply"):
    dialogue = f"Speaker: {first}" + (f"\nListener: ok\nSpeaker: {later}" if later else "")
    return dspy.Example(dialogue=dialogue, emotion=emotion, response=f"{reply} {i}", sample_id=f"s{i}").with_inputs(
        "dialogue")


POOL = [
    ex(0, "my dog ran away at the park", "sad"),
    ex(1, "my dog ran away at the park", "sad", later="we searched all night"),  # same conversation as 0
    ex(2, "my cat ran away from the park", "lonely"),
    ex(3, "my dog won a ribbon at the park show", "proud"),
    ex(4, "a storm flooded the park near my house", "afraid"),
]


def test_the_query_conversation_is_never_returned():
    index = ExemplarIndex.build(POOL, RetrievalConfig())
    query = POOL[1].dialogue
    hits = index.search(query, emotion="sad", k=3)
    assert hits and all(h["key"] != conversation_key(query) for h in hits)
    assert {h["id"] for h in hits}.isdisjoint({"s0", "s1"})


def test_group_filter_then_unfiltered_fallback():
    index = ExemplarIndex.build(POOL, RetrievalConfig())
    query = "Speaker: my dog ran away at the park"
    # sadness group: only s2 (lonely) is left after excluding the query's conversation.
    assert [h["id"] for h in index.search(query, emotion="sad", k=1)] == ["s2"]
    two = [h["id"] for h in index.search(query, emotion="sad", k=2)]
    assert two[0] == "s2" and two[1] in {"s3", "s4"}  # the fallback fills the rest
    unfiltered = index.search(query, emotion="sad", k=2, filter_by_group=False)
    assert len(unfiltered) == 2 and all(h["id"] not in {"s0", "s1"} for h in unfiltered)


def test_index_saves_and_loads_without_pickle(tmp_path, monkeypatch):
    index = ExemplarIndex.build(POOL, RetrievalConfig())
    index.save(tmp_path / "idx")
    assert not list((tmp_path / "idx").rglob("*.pkl"))
    loaded = ExemplarIndex.load(tmp_path / "idx")
    assert loaded.fingerprint == index.fingerprint
    assert loaded.search(POOL[2].dialogue, emotion="lonely", k=2) == index.search(POOL[2].dialogue, emotion="lonely", k=2)
    (tmp_path / "idx/items.json").write_text("{")
    with pytest.raises(ConfigError, match="missing or damaged"):
        ExemplarIndex.load(tmp_path / "idx")
    # The cache builds once per fingerprint, then reloads.
    monkeypatch.setenv("TRACE_DSPY_CACHE", str(tmp_path / "cache"))
    first = cached_index(POOL, RetrievalConfig(), "fp")
    assert len(list((tmp_path / "cache/index").iterdir())) == 1
    assert cached_index(POOL, RetrievalConfig(), "fp").fingerprint == first.fingerprint


def test_program_retrieves_after_the_emotion_and_feeds_planner_and_writer():
    lm, engine = fake_lm(emotion="lonely")
    program = TraceProgram(ProgramConfig(retrieval={"k": 1}), retriever=ExemplarIndex.build(POOL, RetrievalConfig()))
    with dspy.context(lm=lm):
        pred = program(dialogue="Speaker: my dog ran away at the park")
    assert len(pred.exemplars) == 1 and "reply 2" in pred.exemplars[0]  # s2, same group as 'lonely'
    plan, write = engine.calls[2], engine.calls[3]
    assert "reply 2" in plan.inputs["exemplars"] and "reply 2" in write.inputs["exemplars"]
    assert "exemplars" not in engine.calls[0].inputs
    # Explicit exemplars win; retrieval switched off in config means none.
    with dspy.context(lm=lm):
        assert program(dialogue="Speaker: hi there", exemplars=["given"]).exemplars == ["given"]
        off = TraceProgram(ProgramConfig(retrieval={"enabled": False}), retriever=program.retriever)
        assert off(dialogue="Speaker: my dog ran away at the park").exemplars == []


def test_retrieval_config_validation():
    with pytest.raises(ConfigError):
        RetrievalConfig(k=0)
    with pytest.raises(ConfigError, match="unknown keys"):
        ProgramConfig(retrieval={"top_k": 2})
    assert ProgramConfig.from_dict(ProgramConfig(retrieval={"k": 3}).to_dict()).retrieval.k == 3
