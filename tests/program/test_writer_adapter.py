"""The fine-tuned writer's adapter as a fitted part: saved with the artifact and checked when loaded (a damaged
file is refused by name), described by inspect, and run by the reply stage alone, on the embedded model with
the adapter on top, under the compact writer only. No model runs: the base is a GGUF file holding only the
tensors an adapter names, and the adapted LM's calls go to a fake."""

from __future__ import annotations

import hashlib
import json

import dspy
import pytest

gguf = pytest.importorskip("gguf", reason="the LoRA GGUF writer needs gguf (the 'finetune' extra)")
pytest.importorskip("llama_cpp", reason="the embedded engine needs the 'local' extra")

import numpy as np  # noqa: E402
from conftest import fake_every_lm  # noqa: E402

import trace_dspy.lm.finetune.adapted as adapted_module  # noqa: E402
from trace_dspy import ProgramConfig, TraceProgram  # noqa: E402
from trace_dspy.lm.finetune.adapted import adapted_lm  # noqa: E402
from trace_dspy.lm.finetune.gguf_lora import AdapterFileError, write_lora_gguf  # noqa: E402
from trace_dspy.lm.specs import LMSpec, build_lm  # noqa: E402
from trace_dspy.program.adapter_part import FILE_NAME  # noqa: E402
from trace_dspy.program.parts import FittedParts  # noqa: E402
from trace_dspy.store.artifacts import read_artifact, write_artifact  # noqa: E402
from trace_dspy.store.errors import ArtifactError  # noqa: E402
from trace_dspy.store.inspection import open_artifact, summary  # noqa: E402
from trace_dspy.store.manifest import Manifest  # noqa: E402
from trace_dspy.testing.fakes import fake_lm  # noqa: E402

TUNED = dict(writer="compact", reply_format="briefed", reply_exemplars=False, prior_k=0, best_of=1,
             retrieval={"enabled": False})
FIT = {"base_model": "base.gguf", "mix": "human", "examples": {"human": 4}, "lora": {"rank": 2}, "steps": 2,
       "final_loss": 1.25}
Q, K = "model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.k_proj"


def _base_gguf(path, q_rows: int = 32):
    """A llama GGUF file with the two weights the adapters below adapt (their shapes only)."""
    writer = gguf.GGUFWriter(str(path), arch="llama")
    writer.add_tensor("blk.0.attn_q.weight", np.zeros((q_rows, 32), dtype=np.float32))
    writer.add_tensor("blk.0.attn_k.weight", np.zeros((16, 32), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _adapter(path, q_rows: int = 32):
    rng = np.random.default_rng(0)
    weights = {Q: (rng.normal(size=(2, 32)), rng.normal(size=(q_rows, 2))),
               K: (rng.normal(size=(2, 32)), rng.normal(size=(16, 2)))}
    return write_lora_gguf(path, weights, alpha=4.0, n_head=4, n_kv_head=2)


@pytest.fixture
def files(tmp_path):
    return _base_gguf(tmp_path / "base.gguf"), _adapter(tmp_path / "lora.gguf")


def _saved(tmp_path, adapter, lm: dict | None = None):
    config = ProgramConfig(**TUNED)
    program = TraceProgram(config, parts=FittedParts({"writer_adapter": adapter}, {"writer_adapter": FIT}))
    manifest = Manifest(name="t", config={"program": config.to_dict(), **({"lm": lm} if lm else {})})
    return write_artifact(program, manifest, name="t", root=tmp_path / "arts", parts=program.parts)


def test_the_adapter_is_saved_checked_loaded_and_described_with_the_artifact(files, tmp_path):
    _, adapter = files
    folder, _ = _saved(tmp_path, adapter)
    raw = json.loads((folder / "manifest.json").read_text())
    assert (folder / FILE_NAME).read_bytes() == adapter.read_bytes()
    record = raw["writer_adapter"]
    assert record["sha256"] == hashlib.sha256(adapter.read_bytes()).hexdigest()
    assert (record["file"], record["bytes"], record["examples"], record["steps"]) == (
        FILE_NAME, adapter.stat().st_size, {"human": 4}, 2)
    loaded = read_artifact(folder).parts["writer_adapter"]
    assert loaded.path == folder / FILE_NAME and loaded.sha256 == record["sha256"]
    line = summary(open_artifact(str(folder)))["parts"]["writer adapter"]
    assert line.startswith("LoRA rank 2 on base.gguf, trained on 4 human examples, 2 steps, final loss 1.250")
    # a program without one writes no table (an older trace-dspy has nothing to warn of), loads none, says so
    bare, _ = write_artifact(TraceProgram(ProgramConfig(**TUNED)), Manifest(name="u", config={"program": TUNED}),
                             name="u", root=tmp_path / "arts", parts=FittedParts())
    assert "writer_adapter" not in json.loads((bare / "manifest.json").read_text())
    assert not (bare / FILE_NAME).exists() and read_artifact(bare).parts["writer_adapter"] is None
    assert summary(open_artifact(str(bare)))["parts"]["writer adapter"].startswith("none")


@pytest.mark.parametrize("damage, expected", [
    ("flip", r"writer_adapter\.gguf: the fine-tuned writer's adapter is not the file the manifest records .* "
             r"damaged or replaced"),
    ("truncate", r"writer_adapter\.gguf: .*damaged or replaced"),
    ("delete", r"writer_adapter\.gguf: the fine-tuned writer's adapter is missing"),
    ("outside", r"writer_adapter\.gguf: the fine-tuned writer's adapter leads to .*outside"),
    ("not-gguf", r"writer_adapter\.gguf: not a readable GGUF file"),
    ("record-sha", r"writer_adapter\.sha256: expected 64 hex digits"),
    ("record-file", r"writer_adapter\.file: expected 'writer_adapter\.gguf', found '\.\./lora\.gguf'"),
])
def test_a_damaged_adapter_is_refused_naming_the_file(files, tmp_path, damage, expected):
    _, adapter = files
    folder, _ = _saved(tmp_path, adapter)
    path, manifest = folder / FILE_NAME, folder / "manifest.json"
    raw = json.loads(manifest.read_text())
    data = path.read_bytes()
    if damage == "flip":
        path.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    elif damage == "truncate":
        path.write_bytes(data[: len(data) // 2])
    elif damage == "delete":
        path.unlink()
    elif damage == "outside":
        path.unlink()
        path.symlink_to(adapter)  # the same bytes, outside the folder
    elif damage == "not-gguf":  # the record agrees with the file, which is no adapter
        path.write_bytes(b"not a gguf file at all")
        raw["writer_adapter"].update(bytes=path.stat().st_size, sha256=hashlib.sha256(path.read_bytes()).hexdigest())
    else:
        changes = {"record-sha": {"sha256": "beef"}, "record-file": {"file": "../lora.gguf"}}
        raw["writer_adapter"].update(changes[damage])
    manifest.write_text(json.dumps(raw))
    with pytest.raises(ArtifactError, match=expected):
        read_artifact(folder)


def test_respond_refuses_a_damaged_adapter_in_one_line_exit_2(files, tmp_path, monkeypatch, capsys):
    from trace_dspy.cli.respond import main

    _, adapter = files
    folder, _ = _saved(tmp_path, adapter)
    (folder / FILE_NAME).write_bytes(b"\0" * adapter.stat().st_size)
    fake_every_lm(monkeypatch)
    assert main(["--program", str(folder), "I lost my keys."]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and f"{folder / FILE_NAME}:" in err[0]


def test_the_adapted_lm_is_the_base_with_the_adapter_built_once_and_checked(files, tmp_path):
    base_path, adapter = files
    base = build_lm(LMSpec(model=f"local:{base_path}", temperature=0.3))
    adapted = adapted_lm(base, adapter)
    assert adapted.engine.adapter == str(adapter) and adapted.engine.model_path == str(base_path)
    assert adapted.model.startswith(base.model + "+lora-") and adapted.kwargs["temperature"] == 0.3
    assert base.engine.adapter is None and adapted_lm(base, adapter) is adapted  # built once
    # an adapter made for another base model is refused by name before any call
    other = build_lm(LMSpec(model=f"local:{_base_gguf(tmp_path / 'other.gguf', q_rows=64)}"))
    with pytest.raises(AdapterFileError, match=r"lora\.gguf: blk\.0\.attn_q\.weight: the adapter is for a 32x32 "
                                               r"weight; other\.gguf has 64x32"):
        adapted_lm(other, adapter)


def test_only_the_compact_writers_reply_stage_runs_on_the_adapted_lm(files, monkeypatch, capsys):
    base_path, adapter = files
    base = build_lm(LMSpec(model=f"local:{base_path}"))  # never called: the earlier stages run on `early`
    early, early_engine = fake_lm()
    tuned, tuned_engine = fake_lm()
    built, real_adapt = [], adapted_module._adapt

    def adapt(lm, path):  # the real adapted LM is built and checked; its calls go to a fake
        built.append(real_adapt(lm, path))
        return tuned

    monkeypatch.setattr(adapted_module, "_adapt", adapt)
    monkeypatch.setattr(adapted_module, "_ADAPTED", {})
    monkeypatch.setattr(adapted_module, "_NOTED", set())
    stages = {s: early for s in ("recognize_emotion", "analyze_cause", "plan_strategy")}
    parts = FittedParts({"writer_adapter": adapter})
    program = TraceProgram(ProgramConfig(**TUNED), stage_lms={**stages, "generate_response": base}, parts=parts)
    for _ in range(2):
        assert program(dialogue="I lost my keys at the beach.").response
    assert set(tuned_engine.stage_order()) == {"generate_response"} and len(tuned_engine.calls) == 2
    assert "generate_response" not in early_engine.stage_order() and len(built) == 1
    assert built[0].engine.adapter == str(adapter)
    # the standard writer keeps the reply stage on its LM, and says once that the adapter is not used
    standard = TraceProgram(ProgramConfig(**{**TUNED, "writer": "standard", "reply_format": "fields"}),
                            stage_lms={**stages, "generate_response": base}, parts=parts)
    for _ in range(2):
        with standard._stage_context("generate_response"):
            assert dspy.settings.lm is base
    # the compact writer on another LM than the embedded model keeps it too, and says so once
    remote, remote_engine = fake_lm()
    elsewhere = TraceProgram(ProgramConfig(**TUNED), stage_lms={**stages, "generate_response": remote}, parts=parts)
    for _ in range(2):
        elsewhere(dialogue="I lost my keys at the beach.")
    assert set(remote_engine.stage_order()) == {"generate_response"} and len(built) == 1
    notes = [line for line in capsys.readouterr().err.splitlines() if "fine-tuned writer" in line]
    assert len(notes) == 2 and "the standard writer writes the reply" in notes[0]
    assert "not the embedded model" in notes[1]
