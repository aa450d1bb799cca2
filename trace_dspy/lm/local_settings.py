"""The embedded engine's settings: the ``[lm.local]`` table, its check, and the model string of a local LM.

A local model string is ``local`` (the shipped SmolLM2), ``local:/path/to/model.gguf``, and either of them
with a LoRA adapter: ``local::lora=/path/to/adapter.gguf`` or ``local:/path/to/model.gguf::lora=/path/to/
adapter.gguf``. The adapter form is what a fine-tune returns (``trace_dspy.lm.finetune.provider``); the same
adapter can be named in a config with ``[lm.local] adapter = "/path/to/adapter.gguf"`` instead.
"""

from __future__ import annotations

import math
from typing import Any

from trace_dspy.core.config import ConfigError
from trace_dspy.lm.threads import POLICIES

# The embedded engine's settings ([lm.local]): (types, lowest, highest) for numbers, (types,) otherwise.
LOCAL_SETTINGS: dict[str, tuple] = {
    "n_ctx": (int, 16, 131_072), "n_threads": ((int, type(None)), 1, 256), "seed": (int, 0, 2**32 - 1),
    "max_states": (int, 0, 1024), "default_max_tokens": (int, 1, 131_072), "sample_min_p": ((int, float), 0.0, 0.99),
    "constrained": (bool,), "prefix_cache": (bool,), "fast_greedy": (bool,), "loop_guard": (bool,),
    "jump_forward": (bool,), "state_files": (bool,), "flash_attn": (bool,), "quote_fields": (dict,), "text_limits": (dict,),
    "thread_policy": (str,), "adapter": ((str, type(None)),)}
LORA_MARK = "::lora="
MAX_PATH_CHARS = 4096


def is_number(value: Any, types: Any = (int, float)) -> bool:
    """A finite number of ``types``; never a bool."""
    return isinstance(value, types) and not isinstance(value, bool) and (
        not isinstance(value, float) or math.isfinite(value))


def _check_text_setting(key: str, value: Any) -> None:
    if key == "thread_policy":
        if value not in POLICIES:
            raise ConfigError(f"local.thread_policy: expected one of {', '.join(POLICIES)}, found {value!r:.40}")
        return
    if key == "adapter":
        if value is not None and (not isinstance(value, str) or not value.strip() or len(value) > MAX_PATH_CHARS
                                  or "\0" in value):
            raise ConfigError(f"local.adapter: expected the path of a LoRA adapter file (.gguf), found {value!r:.40}")
        return
    inner = str if key == "quote_fields" else int
    ok = isinstance(value, dict) and len(value) <= 64 and all(
        isinstance(k, str) and len(k) <= 128 and (isinstance(v, str) and len(v) <= 128 if inner is str
                                                  else is_number(v, int) and 1 <= v <= 131_072)
        for k, v in value.items())
    if not ok:
        what = "input field names" if inner is str else "character limits from 1 to 131072"
        raise ConfigError(f"local.{key}: expected a table of output field names to {what}")


def check_local(local: Any) -> None:
    """Refuse an ``[lm.local]`` table with unknown keys or values of the wrong type or out of bounds."""
    if not isinstance(local, dict):
        raise ConfigError(f"local: expected a table of engine settings, found {type(local).__name__}")
    unknown = sorted(set(local) - set(LOCAL_SETTINGS))
    if unknown:
        raise ConfigError(f"local: unknown key(s) {', '.join(map(repr, unknown))[:200]}; the embedded engine "
                          f"takes {', '.join(LOCAL_SETTINGS)}")
    for key, value in local.items():
        types, *bounds = LOCAL_SETTINGS[key]
        if bounds:
            if value is None and type(None) in (types if isinstance(types, tuple) else (types,)):
                continue
            low, high = bounds
            if not is_number(value, types) or not low <= value <= high:
                kind = "an integer" if types in (int, (int, type(None))) else "a number"
                raise ConfigError(f"local.{key}: expected {kind} from {low:g} to {high:g}, found {value!r:.40}")
        elif types is bool:
            if not isinstance(value, bool):
                raise ConfigError(f"local.{key}: expected true or false, found {value!r:.40}")
        else:
            _check_text_setting(key, value)


def is_local_model(model: Any) -> bool:
    """Whether a model string names the embedded engine (``local``, ``local:...``)."""
    return isinstance(model, str) and (model == "local" or model.startswith("local:"))


def parse_local_model(model: str) -> tuple[str | None, str | None]:
    """(the base model's path or None for the shipped one, the LoRA adapter's path or None) of a local model
    string; see the module docstring for its forms."""
    if not is_local_model(model):
        raise ConfigError(f"not an embedded-model string (local or local:PATH): {model!r:.80}")
    head, mark, adapter = model.partition(LORA_MARK)
    if mark and not adapter.strip():
        raise ConfigError(f"lm model {model!r:.80}: '{LORA_MARK}' must be followed by the adapter's path")
    base = head.split(":", 1)[1] if ":" in head else None
    if base is not None and not base.strip():
        raise ConfigError(f"lm model {model!r:.80}: expected local, local:PATH or either with {LORA_MARK}ADAPTER")
    return base, (adapter if mark else None)


def local_model_string(base: str | None, adapter: str | None = None) -> str:
    """The model string for a base model path (None: the shipped one) and an optional LoRA adapter path."""
    head = "local" if base is None else f"local:{base}"
    return head if adapter is None else f"{head}{LORA_MARK}{adapter}"
