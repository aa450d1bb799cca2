"""The embedded LM with a fine-tuned writer's LoRA adapter on top, built once per (base LM, adapter).

A compiled program whose writer was fine-tuned (its ``writer_adapter`` part, ``trace_dspy.program.parts``)
runs its reply stage on the stage's own embedded LM with the adapter applied by llama.cpp. That LM is a copy
of the stage's (``TraceLM.copy`` with ``local[:BASE]::lora=ADAPTER``: the same settings, a name that carries
the adapter's digest, so no cached reply of the base model is served for it), built the first time it is
asked for and kept: every later reply of the process runs on the same LM, and the same loaded model.

An adapter that does not fit the base model (another architecture, a tensor the model lacks, a shape that
differs) is refused here, before any call, with an ``AdapterFileError`` naming the file. On any other LM (a
remote one, or a fake) an adapter cannot be applied: :func:`note_unused` says so once per process, and the
stage keeps its LM.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from trace_dspy.core.console import say

# (id of the base LM, adapter path) -> (the base LM, kept so that its id is not reused; the adapted LM).
_ADAPTED: dict[tuple[int, str], tuple[Any, Any]] = {}
_LOCK = threading.Lock()
_NOTED: set[tuple[str, str]] = set()


def adapted_lm(lm: Any, adapter: str | os.PathLike) -> Any | None:
    """``lm`` (an embedded LM) with the LoRA ``adapter`` on top, built on first use and then reused; None,
    with a note said once, when ``lm`` is not the embedded model (the adapter cannot be applied to it)."""
    from trace_dspy.lm.kinds import is_embedded

    if not is_embedded(lm):
        what = f"it runs on {getattr(lm, 'model', None) or 'no LM'}, not the embedded model"
        note_unused(adapter, what)
        return None
    key = (id(lm), os.fspath(adapter))
    with _LOCK:
        held = _ADAPTED.get(key)
        if held is None:
            held = _ADAPTED[key] = (lm, _adapt(lm, os.fspath(adapter)))
    return held[1]


def _adapt(lm: Any, adapter: str) -> Any:
    """A copy of the embedded ``lm`` that runs its base model with ``adapter``, checked against that model."""
    from trace_dspy.lm.finetune.gguf_lora import check_adapter_for_model
    from trace_dspy.lm.local_settings import local_model_string

    check_adapter_for_model(adapter, lm.engine.resolved_path())
    return lm.copy(model=local_model_string(lm.engine.model_path, adapter))


def note_unused(adapter: str | os.PathLike, why: str) -> None:
    """One line on stderr, once per process for this adapter and reason: the fine-tuned writer's adapter is
    not used, and why (the reply stage runs the base model's prompts as they are)."""
    key = (os.fspath(adapter), why)
    with _LOCK:
        if key in _NOTED:
            return
        _NOTED.add(key)
    say(f"note: the program's fine-tuned writer ({os.path.basename(key[0])}) is not used: {why}; "
        "its LoRA adapter applies only to the embedded model's reply stage under the compact writer")


__all__ = ["adapted_lm", "note_unused"]
