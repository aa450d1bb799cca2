"""Versioned artifacts: gap-free versions under concurrent writers, no version from a failed write, an exact
round trip, clear errors for tampered files, and never a pickle."""

from __future__ import annotations

import json
import multiprocessing
import warnings

import dspy
import pytest
from conftest import compile_reply, ring_trainset

import trace_dspy
from trace_dspy import ProgramConfig, TraceProgram
from trace_dspy.store.artifacts import ArtifactError, save_artifact, versions
from trace_dspy.testing.fakes import fake_lm


def _save(root, name="a", program=None):
    return save_artifact(program or TraceProgram(), {"config": {"program": ProgramConfig().to_dict()}},
                         name=name, root=root)


def _save_many(root, count):
    for _ in range(count):
        _save(root)


def test_versions_are_gap_free_and_concurrent_writers_never_collide(tmp_path):
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_save_many, args=(tmp_path, 5)) for _ in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert all(p.exitcode == 0 for p in procs)
    assert versions("a", tmp_path) == list(range(1, 16))
    numbers = sorted(json.loads((tmp_path / f"a/v{v:04d}/manifest.json").read_text())["version"] for v in range(1, 16))
    assert numbers == list(range(1, 16))
    assert not list((tmp_path / "a").glob(".tmp-*"))


def test_a_failed_or_killed_write_leaves_no_version(tmp_path):
    with pytest.raises(FileNotFoundError):
        save_artifact(TraceProgram(), {"config": {}}, name="a", root=tmp_path,
                      extra_files={"x.jsonl": tmp_path / "missing.jsonl"})
    assert versions("a", tmp_path) == [] and not list((tmp_path / "a").glob(".tmp-*"))
    # A writer killed with -9 leaves its private folder behind; it is never a version,
    # and the next save removes it.
    stale = tmp_path / "a" / ".tmp-999999999-dead"
    stale.mkdir()
    (stale / "program.json").write_text("{")
    assert versions("a", tmp_path) == []
    _save(tmp_path)
    assert versions("a", tmp_path) == [1] and not stale.exists()


def test_round_trip_gives_exactly_the_compiled_outputs(tmp_path):
    lm, _ = fake_lm(compile_reply)
    with dspy.context(lm=lm):
        compiled = dspy.BootstrapFewShot(metric=lambda e, p, trace=None: True, max_bootstrapped_demos=2,
                                         max_labeled_demos=1).compile(TraceProgram(), trainset=ring_trainset())
        compiled.generate_response.signature = compiled.generate_response.signature.with_instructions("Be kind.")
    folder = save_artifact(compiled, {"config": {"program": ProgramConfig().to_dict(), "lm": {}}}, root=tmp_path)
    loaded = trace_dspy.load(str(folder), attach_lms=False)
    probe_lm, probe = fake_lm(compile_reply)
    outputs = []
    for program in (compiled, loaded):
        probe.calls.clear()
        with dspy.context(lm=probe_lm):
            outputs.append(program(dialogue="My ring slipped into the sea.").toDict())
        outputs.append([(c.instructions, c.inputs) for c in probe.calls])
    assert outputs[0] == outputs[2] and outputs[1] == outputs[3]  # same outputs, same prompts
    assert loaded.generate_response.signature.instructions == "Be kind."


@pytest.mark.parametrize(("damage", "message"), [
    (lambda f: (f / "program.json").write_text('{"recognize_emotion": '), "damaged or truncated"),
    (lambda f: (f / "manifest.json").write_text("{"), "damaged or truncated"),
    (lambda f: (f / "manifest.json").unlink(), "manifest.json is missing"),
    (lambda f: _edit(f, "manifest.json", schema_version=99), "schema version 99"),
    (lambda f: _edit(f, "manifest.json", drop="predictors"), "missing predictors"),
    (lambda f: _rename_predictor(f), "do not match"),
])
def test_tampered_artifacts_give_clear_errors(tmp_path, damage, message):
    folder = _save(tmp_path)
    damage(folder)
    with pytest.raises(ArtifactError, match=message):
        trace_dspy.load(str(folder))


def _edit(folder, name, drop=None, **changes):
    data = json.loads((folder / name).read_text())
    data.update(changes)
    if drop:
        data.pop(drop)
    (folder / name).write_text(json.dumps(data))


def _rename_predictor(folder):
    data = json.loads((folder / "program.json").read_text())
    data["respond"] = data.pop("generate_response")
    (folder / "program.json").write_text(json.dumps(data))


def test_dspy_version_drift_warns(tmp_path):
    folder = _save(tmp_path)
    _edit(folder, "manifest.json", packages={"dspy": "0.0.1"})
    with pytest.warns(UserWarning, match="compiled with dspy 0.0.1"):
        trace_dspy.load(str(folder))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        trace_dspy.load(str(_save(tmp_path)))  # same version: no warning


def test_loading_never_unpickles(tmp_path):
    folder = _save(tmp_path)
    (folder / "program.pkl").write_bytes(b"\x80\x04not a real pickle")
    assert trace_dspy.load(str(folder / "program.json"))  # the pickle is never touched
