"""LoRA adapters in llama.cpp's GGUF format: what the writer puts in the file (read back with gguf's own reader),
the row order of the rotary projections, and damaged files refused with their name, also on the way into the
engine."""

from __future__ import annotations

import numpy as np
import pytest

gguf = pytest.importorskip("gguf", reason="the LoRA GGUF writer needs gguf (the 'finetune' extra)")

from trace_dspy.lm.finetune.gguf_lora import (  # noqa: E402
    AdapterFileError,
    check_adapter_for_model,
    llama_tensor_name,
    read_lora_gguf,
    rope_rows,
    write_lora_gguf,
)

HIDDEN, HEADS, KV_HEADS, RANK = 32, 4, 2, 4
OUT = {"self_attn.q_proj": HIDDEN, "self_attn.k_proj": 16, "self_attn.v_proj": 16, "self_attn.o_proj": HIDDEN,
       "mlp.down_proj": HIDDEN}
INTO = {"mlp.down_proj": 64}


def adapter_weights(seed: int = 0) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return {f"model.layers.{i}.{m}": (rng.normal(size=(RANK, INTO.get(m, HIDDEN))).astype(np.float32),
                                      rng.normal(size=(out, RANK)).astype(np.float32))
            for i in range(2) for m, out in OUT.items()}


def base_gguf(path, *, hidden: int = HIDDEN, arch: str = "llama"):
    """A stand-in base model file: the tensors (and shapes) of a 2-layer Llama, without a vocabulary."""
    writer = gguf.GGUFWriter(str(path), arch=arch)
    writer.add_type("model")
    for i in range(2):
        for m, out in OUT.items():
            into = INTO.get(m, hidden)
            writer.add_tensor(llama_tensor_name(f"model.layers.{i}.{m}"), np.zeros((out, into), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_the_written_adapter_reads_back_with_llama_cpp_names_shapes_and_alpha(tmp_path):
    weights = adapter_weights()
    path = write_lora_gguf(tmp_path / "a.gguf", weights, alpha=16.0, n_head=HEADS, n_kv_head=KV_HEADS)
    reader = gguf.GGUFReader(str(path))
    fields = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    assert fields == {"general.architecture": "llama", "general.type": "adapter", "adapter.type": "lora",
                      "adapter.lora.alpha": 16.0}
    tensors = {t.name: t for t in reader.tensors}
    assert len(tensors) == 2 * len(weights)
    q_a = tensors["blk.1.attn_q.weight.lora_a"]
    # ggml order: lora_a is ne = [in, rank], lora_b ne = [rank, out] (what llama_adapter_lora_init checks)
    assert q_a.shape.tolist() == [HIDDEN, RANK] and q_a.tensor_type == gguf.GGMLQuantizationType.F32
    assert tensors["blk.0.attn_k.weight.lora_b"].shape.tolist() == [RANK, 16]
    assert tensors["blk.0.ffn_down.weight.lora_a"].shape.tolist() == [64, RANK]
    a, b = weights["model.layers.0.self_attn.v_proj"]
    np.testing.assert_array_equal(tensors["blk.0.attn_v.weight.lora_a"].data, a)
    np.testing.assert_array_equal(tensors["blk.0.attn_v.weight.lora_b"].data, b)  # not a rotary projection
    # the query and key projections' output rows are in llama.cpp's rotary order
    a, b = weights["model.layers.1.self_attn.k_proj"]
    np.testing.assert_array_equal(tensors["blk.1.attn_k.weight.lora_b"].data, rope_rows(b, KV_HEADS))
    info = read_lora_gguf(path)
    assert (info.arch, info.alpha, info.rank) == ("llama", 16.0, RANK)
    assert info.tensors["blk.0.attn_q.weight"] == ((RANK, HIDDEN), (HIDDEN, RANK))
    half = write_lora_gguf(tmp_path / "h.gguf", weights, alpha=16.0, n_head=HEADS, n_kv_head=KV_HEADS, float16=True)
    assert gguf.GGUFReader(str(half)).tensors[0].tensor_type == gguf.GGMLQuantizationType.F16
    assert half.stat().st_size < 0.6 * path.stat().st_size


def test_rotary_rows_are_the_inverse_of_what_transformers_undoes_when_it_loads_a_gguf():
    pytest.importorskip("transformers")
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

    undo = LlamaTensorProcessor(config={"num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS})
    rng = np.random.default_rng(1)
    for name, rows, heads in (("blk.0.attn_q.weight", HIDDEN, HEADS), ("blk.0.attn_k.weight", 16, KV_HEADS)):
        b = rng.normal(size=(rows, RANK)).astype(np.float32)
        back = undo.process(rope_rows(b, heads), name).weights
        np.testing.assert_array_equal(back, b)


def test_a_damaged_adapter_is_refused_with_its_name(tmp_path):
    good = write_lora_gguf(tmp_path / "good.gguf", adapter_weights(), alpha=8.0, n_head=HEADS, n_kv_head=KV_HEADS)
    data = good.read_bytes()
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(data[: len(data) - 100])
    with pytest.raises(AdapterFileError, match=r"^.*truncated\.gguf: .*trunc"):
        read_lora_gguf(truncated)
    text = tmp_path / "notes.gguf"
    text.write_text("not a model\n")
    with pytest.raises(AdapterFileError, match=r"notes\.gguf: not a readable GGUF file"):
        read_lora_gguf(text)
    with pytest.raises(AdapterFileError, match=r"missing\.gguf: LoRA adapter file not found"):
        read_lora_gguf(tmp_path / "missing.gguf")
    base = base_gguf(tmp_path / "base.gguf")
    with pytest.raises(AdapterFileError, match=r"base\.gguf: not a LoRA adapter: general\.type is 'model'"):
        read_lora_gguf(base)


def test_an_adapter_for_another_model_is_refused_with_its_name(tmp_path):
    adapter = write_lora_gguf(tmp_path / "a.gguf", adapter_weights(), alpha=8.0, n_head=HEADS, n_kv_head=KV_HEADS)
    assert check_adapter_for_model(adapter, base_gguf(tmp_path / "base.gguf")).rank == RANK
    wider = base_gguf(tmp_path / "wider.gguf", hidden=48)
    with pytest.raises(AdapterFileError, match=r"a\.gguf: blk\.0\.attn_k\.weight: the adapter is for a 16x32 "
                                               r"weight; wider\.gguf has 16x48"):
        check_adapter_for_model(adapter, wider)
    other = base_gguf(tmp_path / "other.gguf", arch="qwen2")
    with pytest.raises(AdapterFileError, match=r"a\.gguf: made for a llama model; other\.gguf is qwen2"):
        check_adapter_for_model(adapter, other)
    extra = write_lora_gguf(tmp_path / "extra.gguf", {**adapter_weights(), "model.layers.5.mlp.up_proj": (
        np.zeros((RANK, HIDDEN), np.float32), np.zeros((64, RANK), np.float32))}, alpha=8.0, n_head=HEADS,
        n_kv_head=KV_HEADS)
    with pytest.raises(AdapterFileError, match=r"extra\.gguf: blk\.5\.ffn_up\.weight is not a tensor of base\.gguf"):
        check_adapter_for_model(extra, tmp_path / "base.gguf")


def test_the_engine_refuses_a_damaged_adapter_before_llama_cpp_reads_it(tmp_path):
    """An adapter named in the model string is checked against the base when the model loads: one line that
    names the file, never llama.cpp's crash or its bare "Failed to initialize LoRA adapter"."""
    pytest.importorskip("llama_cpp", reason="the engine needs the 'local' extra")
    from trace_dspy.lm.specs import LMSpec, build_lm

    base = base_gguf(tmp_path / "base.gguf")
    good = write_lora_gguf(tmp_path / "a.gguf", adapter_weights(), alpha=8.0, n_head=HEADS, n_kv_head=KV_HEADS)
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(good.read_bytes()[:-64])
    lm = build_lm(LMSpec(model=f"local:{base}::lora={broken}", local={"state_files": False}))
    with pytest.raises(AdapterFileError, match=rf"^{broken}: .*trunc"):
        lm.engine.warm_up()
    with pytest.raises(AdapterFileError, match=rf"^{tmp_path / 'gone.gguf'}: LoRA adapter file not found"):
        build_lm(LMSpec(model=f"local:{base}", local={"adapter": str(tmp_path / "gone.gguf")}))
