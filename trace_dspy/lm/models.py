"""Loaded llama.cpp models, shared by every engine of the process, and their saved context states.

Models are shared by (path, context size, threads); one lock per model serialises calls. Each model keeps a
small table of saved context states (a stage's fixed prompt prefix), restored before that stage's next call.
"""

from __future__ import annotations

import atexit
import ctypes
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trace_dspy.lm.model_files import (
    LocalModelError,
    import_llama,
    plain_weight_buffers,
)


@dataclass
class LoadedModel:
    llama: Any
    lock: threading.Lock
    states: OrderedDict  # hash of prefix tokens -> (buffer, size, token ids)
    formatter: Any = None  # renders a whole chat prompt, ending with the assistant cue
    prefix_formatter: Any = None  # renders the fixed part, without the cue
    threads: int | None = None  # the thread count its context runs with now (None: as loaded)
    files: Any = None  # its saved system-message states on disk (trace_dspy.lm.state_files), made on first use


_MODELS: dict[tuple, LoadedModel] = {}
_MODELS_LOCK = threading.Lock()


def load_model(path: str, n_ctx: int, n_threads: int, seed: int, flash_attn: bool = False,
               adapter: str | None = None) -> LoadedModel:
    """The process's model for these settings, loaded on first use; ``adapter``: a LoRA adapter GGUF applied
    on top (checked against the model first, see ``trace_dspy.lm.finetune.gguf_lora``)."""
    key = (path, n_ctx, n_threads, bool(flash_attn), adapter)
    with _MODELS_LOCK:
        loaded = _MODELS.get(key)
        if loaded is None:
            llama_cpp = import_llama()
            if not Path(path).is_file():
                raise LocalModelError(f"model file not found: {path}")
            if adapter is not None:
                from trace_dspy.lm.finetune.gguf_lora import check_adapter_for_model

                check_adapter_for_model(adapter, path)
            with plain_weight_buffers(llama_cpp):
                # flash_attn: see LlamaEngine (its KV layout differs, so it is part of the key).
                llama = _open_llama(llama_cpp, path, adapter, n_ctx=n_ctx, n_threads=n_threads,
                                    n_threads_batch=n_threads, seed=seed, flash_attn=bool(flash_attn), verbose=False)
            loaded = _MODELS[key] = LoadedModel(llama, threading.Lock(), OrderedDict(), *chat_formatters(llama))
            if len(_MODELS) == 1:
                atexit.register(_close_models)
        return loaded


def _open_llama(llama_cpp, path: str, adapter: str | None, **kwargs) -> Any:
    """``llama_cpp.Llama`` for ``path`` (with the LoRA ``adapter``); an adapter llama.cpp refuses is an error
    that names the file."""
    if adapter is None:
        return llama_cpp.Llama(model_path=path, **kwargs)
    try:
        return llama_cpp.Llama(model_path=path, lora_path=adapter, **kwargs)
    except (RuntimeError, ValueError) as exc:
        from trace_dspy.lm.finetune.gguf_lora import AdapterFileError

        raise AdapterFileError(adapter, f"llama.cpp cannot apply it to {Path(path).name} ({exc})") from None


def _close_models() -> None:
    """Free models before interpreter teardown (llama-cpp-python's own finalizer
    fails noisily once module globals are gone)."""
    for loaded in _MODELS.values():
        try:
            loaded.llama.close()
        except Exception:
            pass
    _MODELS.clear()


def chat_formatters(llama) -> tuple[Any, Any]:
    """Chat-template renderers for a whole prompt and for its fixed prefix."""
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    template = llama.metadata.get("tokenizer.chat_template")
    if not template:
        raise LocalModelError("the model file has no chat template (tokenizer.chat_template)")

    def token_text(idx: int) -> str:
        return llama._model.token_get_text(idx) if idx != -1 else ""

    eos, bos = token_text(llama.token_eos()), token_text(llama.token_bos())
    return (Jinja2ChatFormatter(template, eos, bos, add_generation_prompt=True),
            Jinja2ChatFormatter(template, eos, bos, add_generation_prompt=False))


def set_threads(model: LoadedModel, threads: int) -> None:
    """Run the model's next calls on ``threads`` threads (prompt reading and generation alike)."""
    if model.threads != threads:
        import_llama().llama_set_n_threads(model.llama._ctx.ctx, threads, threads)
        model.threads = threads


def loaded_model_count() -> int:
    """How many llama.cpp models this process holds (for tests and benchmarks)."""
    return len(_MODELS)


def save_context(llama) -> tuple:
    llama_cpp = import_llama()
    ctx = llama._ctx.ctx
    size = llama_cpp.llama_state_get_size(ctx)
    buf = (ctypes.c_uint8 * size)()
    written = llama_cpp.llama_state_get_data(ctx, buf, size)
    return buf, written, llama.input_ids[: llama.n_tokens].copy()


def restore_context(llama, saved: tuple) -> None:
    llama_cpp = import_llama()
    buf, written, ids = saved
    llama_cpp.llama_state_set_data(llama._ctx.ctx, buf, written)
    llama.input_ids[: len(ids)] = ids
    llama.n_tokens = len(ids)
