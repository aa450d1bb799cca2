"""Retrieved exemplars for the planner and the writer (TRACE's retrieval step).

A BM25 index (the ``bm25s`` package: sparse-matrix BM25, no model, offline,
deterministic) over the training pool. A query is the dialogue; results are
filtered to the predicted emotion's Ekman group, with an unfiltered search as
the fallback when the group has too few matches. The conversation being
answered is never returned: pool items that share its first speaker turn
(EmpatheticDialogues' conversation key) are masked out.

BM25 rather than embeddings: it needs no optional extra, indexes the whole
pool in well under a second, and retrieves by the concrete words (pets,
exams, weddings) that make an exemplar useful to a small model.

The index is built once and saved as JSON plus bm25s's numpy arrays (never a
pickle): next to a compiled artifact, or in a cache folder keyed by the data
fingerprint.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from trace_dspy.core import env
from trace_dspy.core.config import ConfigError, RetrievalConfig
from trace_dspy.core.dialogue import SPEAKER, exemplar_reply, format_exemplar, parse_dialogue
from trace_dspy.core.labels import EMOTION_TO_GROUP

__all__ = ["ConfigError", "ExemplarIndex", "RetrievalConfig"]  # RetrievalConfig lives in core.config

INDEX_VERSION = 1


@functools.cache
def _bm25s():
    """The bm25s module, its logger set to WARNING once (0.3.16 sets it to DEBUG on import, and a CLI that
    configures logging would print "Building index from IDs objects" on every index build). Cached: queries
    call this too, and each setLevel clears the logging module's level cache for every logger."""
    import logging

    import bm25s

    logging.getLogger("bm25s").setLevel(logging.WARNING)
    return bm25s


def conversation_key(dialogue: str) -> str:
    """The first speaker turn, normalised: samples of one conversation share it."""
    turns = parse_dialogue(dialogue)
    first = next((t.text for t in turns if t.role == SPEAKER), turns[0].text)
    return hashlib.sha1(" ".join(first.lower().split()).encode()).hexdigest()[:16]


def _tokenize(texts: Sequence[str]):
    bm25s = _bm25s()

    return bm25s.tokenize(list(texts), stopwords="en", show_progress=False)


# Text fields every saved index item must have.
_ITEM_TEXT = ("dialogue", "response", "emotion", "key", "text")


# Bounds on a saved index's files: far above an index of the whole EmpatheticDialogues pool (a few MB).
MAX_ITEMS_BYTES = 512 * 1024 * 1024
MAX_PARAMS_BYTES = 64 * 1024
MAX_VOCAB_BYTES = 64 * 1024 * 1024
MAX_ARRAY_BYTES = 512 * 1024 * 1024
BM25_ARRAYS = ("data", "indices", "indptr")
# The settings bm25s saves in params.index.json and what each may be; methods that need a further
# non-occurrence array (bm25l, bm25+) are not used here.
_BM25_PARAMS = {"k1": "number", "b": "number", "delta": "number", "method": ("lucene", "robertson", "atire"),
                "idf_method": ("lucene", "robertson", "atire", None), "dtype": ("float32", "float64"),
                "int_dtype": ("int32", "int64"), "backend": ("numpy", "auto"), "csc_backend": ("numpy", "auto"),
                "auto_compile": (True, False), "num_docs": "count", "version": "text"}


def _read_json(path: Path, max_bytes: int, root: Path) -> Any:
    """A JSON file of an index, checked for kind and size before it is read; errors name the file."""
    from trace_dspy.core.files import FileCheckError, read_bytes
    from trace_dspy.core.safety import JSONLimitError, load_json

    try:
        return load_json(read_bytes(path, max_bytes=max_bytes, root=root), str(path), max_bytes=max_bytes)
    except (FileCheckError, JSONLimitError) as exc:
        raise ConfigError(str(exc)) from None


def _damaged(folder: Path, name: str, reason: str) -> ConfigError:
    return ConfigError(f"{folder / name}: retrieval index is damaged: {reason}")


def _check_bm25(folder: Path, root: Path, n_items: int) -> None:
    """Check a saved bm25s index against ``n_items`` documents before bm25s reads it.

    The scores are a CSC matrix (documents by vocabulary): ``indptr`` has one entry per vocabulary id
    plus one, non-decreasing from 0 to the number of scores; ``indices`` are document numbers below
    ``num_docs``; ``data`` are finite scores.
    """
    _check_bm25_params(folder, root, n_items)
    vocab_path = folder / "vocab.index.json"
    vocab = _read_json(vocab_path, MAX_VOCAB_BYTES, root)
    if not isinstance(vocab, dict) or not all(isinstance(v, int) and not isinstance(v, bool)
                                              for v in vocab.values()):
        raise _damaged(folder, vocab_path.name, "expected an object of token ids")
    data, indices, indptr = _read_bm25_arrays(folder, root)
    _check_bm25_scores(folder, data, indices, indptr, n_items)
    # One column per token; bm25s may add the empty token "" after the last column, with no scores.
    columns = len(indptr) - 1
    if len(vocab) - columns not in (0, int("" in vocab)):
        raise ConfigError(f"{folder / 'indptr.csc.index.npy'}: retrieval index is damaged: {len(indptr)} entries "
                          f"for the {len(vocab)} tokens of {vocab_path} (expected {len(vocab) + 1 - int('' in vocab)})")
    if indptr[0] != 0 or indptr[-1] != len(data) or (np.diff(indptr) < 0).any():
        raise _damaged(folder, "indptr.csc.index.npy", f"expected offsets rising from 0 to {len(data)}")
    ids = np.fromiter(vocab.values(), dtype=np.int64, count=len(vocab))
    if len(ids) and (ids.min() < 0 or ids.max() >= len(vocab) or len(np.unique(ids)) != len(ids)
                     or len(vocab) > columns and vocab[""] != columns):
        raise _damaged(folder, vocab_path.name, f"token ids must be distinct and from 0 to {len(vocab) - 1}")


def _check_bm25_params(folder: Path, root: Path, n_items: int) -> None:
    """``params.index.json``: only the settings bm25s writes, each of its type, and ``num_docs`` = ``n_items``."""
    params_path = folder / "params.index.json"
    params = _read_json(params_path, MAX_PARAMS_BYTES, root)
    if not isinstance(params, dict):
        raise _damaged(folder, params_path.name, f"expected a JSON object, found {type(params).__name__}")
    for key, value in params.items():
        allowed = _BM25_PARAMS.get(key)
        ok = (allowed == "number" and isinstance(value, (int, float)) and not isinstance(value, bool)
              and math.isfinite(value) and 0 <= value <= 100
              or allowed == "count" and isinstance(value, int) and not isinstance(value, bool)
              or allowed == "text" and isinstance(value, str) and len(value) <= 64
              or isinstance(allowed, tuple) and any(value is a or type(value) is type(a) and value == a
                                                    for a in allowed))
        if not ok:
            raise _damaged(folder, params_path.name, f"{key}: {value!r:.80} is not a setting this index may have"
                           if allowed else f"unknown setting {key!r}")
    if params.get("num_docs") != n_items:
        raise _damaged(folder, params_path.name, f"num_docs: the index holds {params.get('num_docs')!r} documents "
                                                 f"but items.json has {n_items}")


def _read_bm25_arrays(folder: Path, root: Path) -> tuple[np.ndarray, ...]:
    """(data, indices, indptr): each a bounded, numeric, one-dimensional array."""
    from trace_dspy.core.files import FileCheckError, read_npy

    arrays = []
    for name in BM25_ARRAYS:
        path = folder / f"{name}.csc.index.npy"
        try:
            array = read_npy(path, max_bytes=MAX_ARRAY_BYTES, root=root)
        except FileCheckError as exc:
            raise ConfigError(f"{exc.path}: retrieval index is damaged: {exc.reason}") from None
        if array.ndim != 1:
            raise _damaged(folder, path.name, f"expected one dimension, found shape {array.shape}")
        arrays.append(array)
    return tuple(arrays)


def _check_bm25_scores(folder: Path, data: np.ndarray, indices: np.ndarray, indptr: np.ndarray,
                       n_items: int) -> None:
    """Finite scores, integer offsets, and a document number below ``n_items`` for each score."""
    if data.dtype.kind != "f" or not np.isfinite(data).all():
        raise _damaged(folder, "data.csc.index.npy", f"expected finite scores, found {data.dtype} values"
                       + (" that are NaN or infinite" if data.dtype.kind == "f" else ""))
    for name, array in (("indices", indices), ("indptr", indptr)):
        if array.dtype.kind not in "iu":
            raise _damaged(folder, f"{name}.csc.index.npy", f"expected integers, found {array.dtype}")
    if len(indices) != len(data):
        raise _damaged(folder, "indices.csc.index.npy", f"{len(indices)} document numbers for {len(data)} scores")
    if len(indices) and (indices.min() < 0 or indices.max() >= n_items):
        raise _damaged(folder, "indices.csc.index.npy", f"document numbers must be from 0 to {n_items - 1}, found "
                                                        f"{int(indices.min())} to {int(indices.max())}")


class ExemplarIndex:
    """BM25 over pool items, with group filtering and same-conversation exclusion."""

    def __init__(self, items: list[dict[str, Any]], retriever, fingerprint: str):
        self.items = items
        self.retriever = retriever
        self.fingerprint = fingerprint
        self._groups = np.array([EMOTION_TO_GROUP.get(i["emotion"], "") for i in items])
        self._keys = np.array([i["key"] for i in items])
        self._lock = threading.Lock()

    # -- building, saving, loading ---------------------------------------------

    @classmethod
    def build(cls, examples: Sequence[Any], config: RetrievalConfig) -> ExemplarIndex:
        bm25s = _bm25s()

        items = []
        for ex in examples:
            text = ex.get("situation") if config.text == "situation" and ex.get("situation") else ex.dialogue
            items.append({"id": ex.get("sample_id"), "dialogue": ex.dialogue, "response": ex.response,
                          "emotion": ex.emotion, "key": conversation_key(ex.dialogue), "text": text})
        if not items:
            raise ConfigError("cannot build a retrieval index from an empty pool")
        retriever = bm25s.BM25()
        retriever.index(_tokenize([i["text"] for i in items]), show_progress=False)
        digest = hashlib.sha256(json.dumps([[i["id"], i["text"], i["response"]] for i in items]).encode())
        return cls(items, retriever, "bm25:" + digest.hexdigest()[:16])

    def save(self, folder: str | os.PathLike) -> Path:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        self.retriever.save(str(folder / "bm25"), show_progress=False)
        with open(folder / "items.json", "w", encoding="utf-8") as fh:  # file-audit: writes a new index
            json.dump({"version": INDEX_VERSION, "fingerprint": self.fingerprint, "items": self.items}, fh)
        return folder

    @classmethod
    def load(cls, folder: str | os.PathLike, *, root: str | os.PathLike | None = None) -> ExemplarIndex:
        """Load a saved index, checking every file; damage is a ``ConfigError`` naming the file.

        Each file must be a regular file inside ``root`` (default: the index folder; an artifact passes its
        own folder) and within its size limit before it is read, and the BM25 arrays must fit together
        and with ``items.json``: damage is found here, not inside a later search.
        """
        folder = Path(folder)
        root = folder if root is None else Path(root)
        items_path = folder / "items.json"
        try:
            data = _read_json(items_path, MAX_ITEMS_BYTES, root)
        except ConfigError as exc:
            raise ConfigError(f"{items_path}: retrieval index is missing or damaged "
                              f"({str(exc).removeprefix(f'{items_path}: ')})") from None
        if not isinstance(data, dict) or data.get("version") != INDEX_VERSION:
            got = data.get("version") if isinstance(data, dict) else type(data).__name__
            raise ConfigError(f"{items_path}: version: expected index version {INDEX_VERSION}, found {got!r}")
        items = data.get("items")
        if not isinstance(items, list) or not items:
            raise ConfigError(f"{items_path}: items: expected a non-empty list")
        for n, item in enumerate(items):
            if not isinstance(item, dict):
                raise ConfigError(f"{items_path}: items[{n}]: expected an object")
            bad = [k for k in _ITEM_TEXT if not isinstance(item.get(k), str)]
            if bad:
                raise ConfigError(f"{items_path}: items[{n}]: {', '.join(bad)} must be text")
        if not isinstance(data.get("fingerprint"), str):
            raise ConfigError(f"{items_path}: fingerprint: expected text")
        _check_bm25(folder / "bm25", root, len(items))
        bm25s = _bm25s()
        try:
            # file-audit: bm25s reads its own files; _check_bm25 just read and checked each through core.files
            retriever = bm25s.BM25.load(str(folder / "bm25"), show_progress=False, allow_pickle=False)
            num_docs = int(retriever.scores["num_docs"])
        except Exception as exc:  # bm25s raises whatever numpy, json or the OS raise on a damaged file
            raise ConfigError(f"{folder / 'bm25'}: retrieval index is missing or damaged "
                              f"({type(exc).__name__}: {exc})") from None
        if num_docs != len(items):  # the files changed between the check and the load
            raise ConfigError(f"{folder / 'bm25'}: num_docs: the index holds {num_docs} documents but "
                              f"items.json has {len(items)}")
        return cls(items, retriever, data["fingerprint"])

    # -- search -------------------------------------------------------------------

    def search(self, dialogue: str, *, emotion: str | None, k: int, filter_by_group: bool = True) -> list[dict]:
        """Top-k pool items for a dialogue, never from its own conversation."""
        query = _tokenize([dialogue])
        not_same = (self._keys != conversation_key(dialogue)).astype(np.float32)
        group = EMOTION_TO_GROUP.get(emotion or "")
        results: list[dict] = []
        masks = []
        if filter_by_group and group:
            masks.append(not_same * (self._groups == group).astype(np.float32))
        masks.append(not_same)
        for mask in masks:
            for idx in self._top(query, mask, k):
                item = self.items[idx]
                if item not in results:
                    results.append(item)
            if len(results) >= k:
                break
        return results[:k]

    def _top(self, query, mask: np.ndarray, k: int) -> list[int]:
        n = min(len(self.items), max(k, 1))
        with self._lock:  # bm25s keeps per-call state
            # n_threads=0 scores in this thread; 1 would start a thread pool on every search.
            docs, scores = self.retriever.retrieve(query, k=n, weight_mask=mask, show_progress=False, n_threads=0)
        return [int(d) for d, s in zip(docs[0], scores[0]) if s > 0 and mask[int(d)] > 0]


def index_cache_dir() -> Path:
    return env.cache_dir("index")


def cached_index(examples: Sequence[Any], config: RetrievalConfig, data_fingerprint: str) -> ExemplarIndex:
    """Build the index for a pool once per data fingerprint and config; reuse it after."""
    key = hashlib.sha256(json.dumps([data_fingerprint, config.to_dict(), [e.get("sample_id") for e in examples]])
                         .encode()).hexdigest()[:20]
    folder = index_cache_dir() / key
    if (folder / "items.json").is_file():
        try:
            return ExemplarIndex.load(folder)
        except ConfigError:
            pass  # damaged cache entry: rebuild it
    from trace_dspy.core.console import heartbeat

    with heartbeat("retrieval index") as phase:
        phase.note(f"indexing {len(examples)} exemplars")
        index = ExemplarIndex.build(examples, config)
    tmp = folder.with_name(folder.name + f".tmp{os.getpid()}")
    index.save(tmp)
    try:
        os.replace(tmp, folder)
    except OSError:  # another process won the race; its copy is as good
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return index


__all__ = ["ExemplarIndex", "RetrievalConfig", "cached_index", "conversation_key", "exemplar_reply", "format_exemplar"]
