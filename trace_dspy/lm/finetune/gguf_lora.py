"""LoRA adapters in llama.cpp's GGUF format: written from trained weights, read back and checked.

The file llama.cpp 0.3.36 loads with ``Llama(lora_path=...)`` (``llama_adapter_lora_init``) has:

- the header ``general.type = "adapter"``, ``general.architecture`` = the base model's (``llama`` for SmolLM2),
  ``adapter.type = "lora"`` and ``adapter.lora.alpha`` (float32);
- for each adapted weight, two tensors named after the base model's tensor: ``blk.<i>.attn_q.weight.lora_a``
  and ``...lora_b``. In numpy order ``lora_a`` is (rank, in) and ``lora_b`` is (out, rank), as peft keeps
  them; llama.cpp adds ``scale * B (A x)`` with ``scale = alpha / rank`` (peft's scaling).

The base GGUF stores the query and key projections with their rows reordered for llama.cpp's rotary embedding
(transformers undoes that when it loads the GGUF), so the output rows of ``lora_b`` for ``attn_q`` and
``attn_k`` are reordered the same way here. Everything else is written as trained.

The reader refuses, with an :class:`AdapterFileError` naming the file, anything llama.cpp would refuse or
misread: not a GGUF file, a truncated one, the wrong header, an unpaired or misnamed tensor, and (against a
base model) a tensor the base lacks or whose shape differs.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trace_dspy.core.files import FileCheckError, check_file, hash_file
from trace_dspy.lm.model_files import LocalModelError

# Larger than any adapter of a model this project runs; a bigger file is not one of ours.
MAX_ADAPTER_BYTES = 4 * 1024 ** 3
MAX_MODEL_BYTES = 64 * 1024 ** 3
# transformers' Llama module names (below model.layers.<i>.) -> llama.cpp's tensor names (below blk.<i>.).
HF_TO_LLAMA = {
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
_MODULE = re.compile(r"(?:.*\.)?layers\.(\d+)\.(.+)")
_TENSOR = re.compile(r"blk\.\d+\.[a-z_]+\.weight\.lora_[ab]")


class AdapterFileError(LocalModelError):
    """A LoRA adapter file that cannot be used; the message is ``<path>: <reason>``."""

    def __init__(self, path: str | os.PathLike, reason: str):
        self.path, self.reason = str(path), reason
        super().__init__(f"{path}: {reason}")


@dataclass(frozen=True)
class AdapterInfo:
    """What a LoRA adapter file holds: its base architecture, alpha, rank and each adapted tensor's shapes
    (``lora_a`` and ``lora_b`` in numpy order: (rank, in) and (out, rank))."""

    path: str
    arch: str
    alpha: float
    rank: int
    tensors: dict[str, tuple[tuple[int, ...], tuple[int, ...]]]


def llama_tensor_name(module: str) -> str:
    """llama.cpp's tensor for a transformers Llama module: ``model.layers.3.self_attn.q_proj`` ->
    ``blk.3.attn_q.weight``."""
    found = _MODULE.fullmatch(module)
    if found is None or found.group(2) not in HF_TO_LLAMA:
        raise ValueError(f"no llama.cpp tensor for the module {module!r}; LoRA can target "
                         f"{', '.join(m.split('.')[-1] for m in HF_TO_LLAMA)}")
    return f"blk.{found.group(1)}.{HF_TO_LLAMA[found.group(2)]}.weight"


def rope_rows(weights: Any, n_head: int) -> Any:
    """``weights`` (out rows first) with its rows in llama.cpp's order for a rotary projection of ``n_head``
    heads: within each head, the two halves of the head's rows are interleaved."""
    rows = weights.shape[0]
    if rows % (2 * n_head):
        raise ValueError(f"{rows} rows do not split into {n_head} heads of two halves")
    return (weights.reshape(n_head, 2, rows // n_head // 2, *weights.shape[1:])
            .swapaxes(1, 2).reshape(weights.shape))


def _layout(module: str, a: Any, b: Any, n_head: int, n_kv_head: int) -> tuple[str, Any, Any]:
    """(llama.cpp's tensor name, lora_a, lora_b in llama.cpp's row order) of one module's pair."""
    name = llama_tensor_name(module)
    if a.ndim != 2 or b.ndim != 2 or a.shape[0] != b.shape[1]:
        raise ValueError(f"{module}: lora_A {tuple(a.shape)} and lora_B {tuple(b.shape)} do not make a pair")
    if ".attn_q." in name:
        b = rope_rows(b, n_head)
    elif ".attn_k." in name:
        b = rope_rows(b, n_kv_head)
    return name, a, b


def write_lora_gguf(path: str | os.PathLike, weights: dict[str, tuple[Any, Any]], *, alpha: float, n_head: int,
                    n_kv_head: int, arch: str = "llama", float16: bool = False) -> Path:
    """Write ``weights`` (transformers module name -> (lora_A (rank, in), lora_B (out, rank)) arrays) as a
    llama.cpp LoRA adapter; the file appears whole or not at all. ``float16`` halves its size."""
    import gguf
    import numpy as np

    if not weights:
        raise ValueError("no LoRA weights to write")
    if not alpha > 0:
        raise ValueError(f"alpha must be positive, got {alpha}")
    path = Path(path)
    dtype = np.float16 if float16 else np.float32
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    writer = gguf.GGUFWriter(str(tmp), arch=arch)  # file-audit: writes a new private temporary file, renamed
    try:
        writer.add_type(gguf.GGUFType.ADAPTER)
        writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
        writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, float(alpha))
        for module in sorted(weights, key=_module_order):
            a, b = (np.asarray(w, dtype=np.float32) for w in weights[module])
            name, a, b = _layout(module, a, b, n_head, n_kv_head)
            writer.add_tensor(f"{name}.lora_a", np.ascontiguousarray(a, dtype=dtype))
            writer.add_tensor(f"{name}.lora_b", np.ascontiguousarray(b, dtype=dtype))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        os.replace(tmp, path)
    except BaseException:
        writer.close()
        tmp.unlink(missing_ok=True)
        raise
    return path


def _module_order(module: str) -> tuple[int, str]:
    found = _MODULE.fullmatch(module)
    return (int(found.group(1)), found.group(2)) if found else (-1, module)


def adapter_digest(path: str | os.PathLike) -> str:
    """The SHA-256 of an adapter file's bytes (hex); a missing or unreadable file is an AdapterFileError."""
    digest = hashlib.sha256()
    try:
        hash_file(digest, path, max_bytes=MAX_ADAPTER_BYTES)
    except FileCheckError as exc:
        raise AdapterFileError(path, "LoRA adapter file not found" if exc.missing else exc.reason) from None
    return digest.hexdigest()


def require_file(path: str | os.PathLike, max_bytes: int, what: str) -> None:
    """Refuse anything but a regular file of at most ``max_bytes`` (a FIFO, a device, a folder)."""
    try:
        check_file(path, max_bytes=max_bytes)
    except FileCheckError as exc:
        raise AdapterFileError(path, f"{what} not found" if exc.missing else exc.reason) from None


def _open_gguf(path: str | os.PathLike, max_bytes: int, what: str) -> Any:
    """``gguf.GGUFReader`` on a checked regular file; a damaged file is an AdapterFileError naming it."""
    import gguf

    require_file(path, max_bytes, what)
    try:
        return gguf.GGUFReader(str(path))  # file-audit: checked regular file above, read through a memory map
    except (ValueError, IndexError, KeyError, TypeError, OverflowError, OSError, EOFError) as exc:
        raise AdapterFileError(path, f"not a readable GGUF file, truncated or damaged ({exc})") from None


def _field(reader: Any, key: str) -> Any:
    field = reader.fields.get(key)
    if field is None:
        return None
    try:
        return field.contents()
    except (ValueError, IndexError, TypeError, UnicodeDecodeError):
        return None


def _header(reader: Any, path: str | os.PathLike) -> tuple[str, float]:
    """(architecture, alpha) of an adapter's header, every key llama.cpp checks checked."""
    kind, adapter_type = _field(reader, "general.type"), _field(reader, "adapter.type")
    if kind != "adapter":
        raise AdapterFileError(path, f"not a LoRA adapter: general.type is {kind!r:.40}, expected 'adapter'")
    if adapter_type != "lora":
        raise AdapterFileError(path, f"not a LoRA adapter: adapter.type is {adapter_type!r:.40}, expected 'lora'")
    arch, alpha = _field(reader, "general.architecture"), _field(reader, "adapter.lora.alpha")
    if not isinstance(arch, str) or not arch:
        raise AdapterFileError(path, "the header names no general.architecture")
    if not isinstance(alpha, float) or not alpha > 0 or alpha != alpha:
        raise AdapterFileError(path, f"adapter.lora.alpha must be a positive number, found {alpha!r:.40}")
    return arch, alpha


def _pairs(reader: Any, path: str | os.PathLike) -> dict[str, tuple[tuple[int, ...], tuple[int, ...]]]:
    """Each adapted tensor's (lora_a, lora_b) shapes in numpy order, every tensor's data inside the file."""
    size = os.path.getsize(path)
    halves: dict[str, dict[str, tuple[int, ...]]] = {}
    for tensor in reader.tensors:
        if not _TENSOR.fullmatch(tensor.name):
            raise AdapterFileError(path, f"unexpected tensor {tensor.name!r:.80}: expected blk.<i>.<weight>.lora_a "
                                         "or .lora_b")
        if tensor.data_offset + int(tensor.n_bytes) > size or tensor.data.nbytes != int(tensor.n_bytes):
            raise AdapterFileError(path, f"tensor {tensor.name} runs past the end of the file (truncated)")
        shape = tuple(int(n) for n in reversed(tensor.shape.tolist()))
        halves.setdefault(tensor.name[: -len(".lora_a")], {})[tensor.name[-1]] = shape
    pairs = {}
    for name, half in sorted(halves.items()):
        if set(half) != {"a", "b"}:
            raise AdapterFileError(path, f"{name} has lora_{'a' if 'b' in half else 'b'} missing")
        (rank_a, _), (_, rank_b) = half["a"], half["b"]
        if len(half["a"]) != 2 or len(half["b"]) != 2 or rank_a != rank_b:
            raise AdapterFileError(path, f"{name}: lora_a {half['a']} and lora_b {half['b']} do not make a pair")
        pairs[name] = (half["a"], half["b"])
    if not pairs:
        raise AdapterFileError(path, "the adapter holds no tensors")
    return pairs


def read_lora_gguf(path: str | os.PathLike) -> AdapterInfo:
    """What a LoRA adapter file holds, refused with an AdapterFileError naming it if it is damaged."""
    reader = _open_gguf(path, MAX_ADAPTER_BYTES, "LoRA adapter file")
    arch, alpha = _header(reader, path)
    pairs = _pairs(reader, path)
    ranks = {a[0] for a, _ in pairs.values()}
    return AdapterInfo(str(path), arch, alpha, max(ranks), pairs)


def model_tensor_shapes(model_path: str | os.PathLike) -> tuple[str, dict[str, tuple[int, ...]]]:
    """(architecture, tensor name -> shape in numpy order) of a base model GGUF file."""
    reader = _open_gguf(model_path, MAX_MODEL_BYTES, "model file")
    arch = _field(reader, "general.architecture")
    return str(arch), {t.name: tuple(int(n) for n in reversed(t.shape.tolist())) for t in reader.tensors}


def check_adapter_for_model(adapter: str | os.PathLike, model_path: str | os.PathLike) -> AdapterInfo | None:
    """Refuse an adapter that does not fit the base model (other architecture, a tensor the model lacks, a
    shape that differs). Without the ``gguf`` package (the ``finetune`` extra) only llama.cpp's own checks run:
    None is returned."""
    try:
        import gguf  # noqa: F401
    except ImportError:
        require_file(adapter, MAX_ADAPTER_BYTES, "LoRA adapter file")
        return None
    info = read_lora_gguf(adapter)
    arch, shapes = model_tensor_shapes(model_path)
    if info.arch != arch:
        raise AdapterFileError(adapter, f"made for a {info.arch} model; {Path(model_path).name} is {arch}")
    for name, (a, b) in info.tensors.items():
        base = shapes.get(name)
        if base is None:
            raise AdapterFileError(adapter, f"{name} is not a tensor of {Path(model_path).name} (another base model?)")
        if len(base) != 2 or (b[0], a[1]) != base:
            raise AdapterFileError(adapter, f"{name}: the adapter is for a {b[0]}x{a[1]} weight; "
                                            f"{Path(model_path).name} has {'x'.join(map(str, base))}")
    return info
