"""Fitted parts: built into a program, saved with an artifact, loaded back, described; a new kind is one class."""

from __future__ import annotations

import json
from pathlib import Path
from typing import ClassVar

import pytest

import trace_dspy
import trace_dspy.program.parts as parts_module
from trace_dspy import ProgramConfig, TraceProgram
from trace_dspy.core.config import RetrievalConfig
from trace_dspy.data.retrieval import ExemplarIndex
from trace_dspy.data.sources import load_splits, resolve_source
from trace_dspy.program.emotion_prior import shipped_prior
from trace_dspy.program.parts import FittedPart, FittedParts, PartError
from trace_dspy.store.artifacts import read_artifact, write_artifact
from trace_dspy.store.errors import ArtifactError
from trace_dspy.store.inspection import open_artifact, summary
from trace_dspy.store.manifest import Manifest

CONFIG = ProgramConfig(prior_k=3)
OPENERS = {"negative": {"ER": ["That sounds so hard."]}}


@pytest.fixture(scope="module")
def index():
    return ExemplarIndex.build(load_splits(resolve_source(None, announce_seed=False)).train[:12], RetrievalConfig())


def full_parts(index) -> FittedParts:
    return FittedParts({"retrieval": index, "emotion_prior": shipped_prior(), "reply_openers": OPENERS,
                        "reply_plans": ["EX+EX"]},
                       {"emotion_prior": {"file": "emotion_prior.npz", "source": "shipped"},
                        "reply_plans": {"plans": ["EX+EX"], "items": 4, "baseline": 0.5, "score": 0.6}})


def test_a_program_is_built_with_its_parts(index):
    parts = full_parts(index)
    program = TraceProgram(CONFIG, parts=parts)
    assert program.parts is parts and program.retriever is index and program.reply_plans == (("EX", "EX"),)
    assert "emotion_candidates" in program.recognize_emotion.signature.input_fields
    bare = TraceProgram(CONFIG)
    assert bare.reply_plans == () and bare.reply_openers is None and bare.retriever is None
    assert "emotion_candidates" not in bare.recognize_emotion.signature.input_fields  # no prior, no field
    # a copy shares the (immutable) parts; with_parts changes the copy only
    other = program.with_parts(reply_plans=["ER+IP"])
    assert other.parts["retrieval"] is index and other.reply_plans == (("ER", "IP"),)
    assert program.reply_plans == (("EX", "EX"),)
    with pytest.raises(ValueError, match="unknown fitted part"):
        FittedParts({"mood": 1})
    with pytest.raises(ValueError):
        FittedParts({"reply_plans": ["XX+EX"]})


def test_parts_save_load_and_describe_through_an_artifact(index, tmp_path):
    program = TraceProgram(CONFIG, parts=full_parts(index))
    folder, manifest = write_artifact(program, Manifest(name="t", config={"program": CONFIG.to_dict()}),
                                      name="t", root=tmp_path, parts=program.parts)
    raw = json.loads((folder / "manifest.json").read_text())
    # each part is a top-level table of the manifest, as older readers expect, and its files are in the folder
    assert raw["retrieval"]["index"] == index.fingerprint and raw["retrieval"]["pool_items"] == 12
    assert raw["reply_openers"] == {"openers": None} and raw["reply_plans"]["plans"] == ["EX+EX"]
    assert (folder / "emotion_prior.npz").is_file() and (folder / "index/items.json").is_file()
    stored = read_artifact(folder)
    assert stored.manifest == manifest
    assert stored.parts["retrieval"].fingerprint == index.fingerprint
    assert stored.parts["emotion_prior"].labels == shipped_prior().labels
    assert stored.parts["reply_plans"] == (("EX", "EX"),)
    lines = summary(open_artifact(str(folder)))["parts"]
    assert list(lines) == [p.label for p in parts_module.PARTS]
    assert lines["plans"].startswith("the LM's plan + EX+EX") and "12 training items" in lines["exemplars"]
    # a damaged part is an ArtifactError naming the file and field
    raw["reply_plans"]["plans"] = ["EX+XX"]
    (folder / "manifest.json").write_text(json.dumps(raw))
    with pytest.raises(ArtifactError) as err:
        read_artifact(folder)
    assert err.value.field == "reply_plans.plans"
    (folder / "emotion_prior.npz").unlink()
    with pytest.raises(ArtifactError, match="emotion prior"):
        read_artifact(folder)


class Mood(FittedPart):
    """A made-up part kept in the manifest: the tone a compile chose."""

    name, label = "mood", "mood"
    empty: ClassVar = "neutral"

    @classmethod
    def check(cls, value):
        if value not in (None, "neutral", "warm"):
            raise ValueError(f"mood {value!r}")
        return value or "neutral"

    @classmethod
    def record(cls, value, fit, config):
        return {"mood": value}

    @classmethod
    def load(cls, folder: Path, record, config):
        try:
            return cls.check(record.get("mood"))
        except ValueError as exc:
            raise PartError(folder / "manifest.json", "mood.mood", str(exc)) from None

    @classmethod
    def describe(cls, record, program):
        return record.get("mood") or "neutral (not fitted)"


def test_a_new_kind_of_part_is_one_class_and_one_registration(monkeypatch, tmp_path):
    monkeypatch.setattr(parts_module, "PARTS", (*parts_module.PARTS, Mood))  # the registration
    config = ProgramConfig(prior_k=0, retrieval={"enabled": False})
    program = TraceProgram(config, parts=FittedParts({"mood": "warm"}))
    folder, _ = write_artifact(program, {"config": {"program": config.to_dict()}}, name="t", root=tmp_path,
                               parts=program.parts)
    assert json.loads((folder / "manifest.json").read_text())["mood"] == {"mood": "warm"}
    assert read_artifact(folder).manifest.part("mood") == {"mood": "warm"}
    assert trace_dspy.load(str(folder), attach_lms=False).parts["mood"] == "warm"
    assert summary(open_artifact(str(folder)))["parts"]["mood"] == "warm"
