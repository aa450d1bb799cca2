"""A sentence-transformers BERT encoder (all-MiniLM-L6-v2) run in numpy.

sentence-transformers runs this model through torch and transformers, whose import alone costs seconds.
The forward pass is small enough to write out: token, position and token-type embeddings with a
LayerNorm, then ``num_hidden_layers`` blocks of multi-head self-attention and a GELU feed-forward layer,
each closed by a residual LayerNorm; then the mean of the token vectors over the attention mask, scaled to
unit length. That is exactly the pipeline the model folder's ``modules.json`` names (Transformer, mean
Pooling, Normalize), computed in float32 as torch computes it, so the vectors agree with
sentence-transformers' to float32 rounding (tests/optimize/test_bert_encoder.py compares them).

Every number comes from the folder: ``config.json`` (sizes, heads, layers, LayerNorm epsilon, activation),
``1_Pooling/config.json`` (the pooling mode), ``sentence_bert_config.json`` (the truncation length),
``tokenizer.json`` (the WordPiece tokenizer, run by the ``tokenizers`` package) and ``model.safetensors``
(read by ``safetensors.numpy``). A folder this code does not reproduce exactly is refused with
:class:`UnsupportedModel` rather than encoded approximately.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import numpy as np

from trace_dspy.core.files import FileCheckError, MiB, read_bytes, read_text

MODULE_TYPES = ("sentence_transformers.models.Transformer", "sentence_transformers.models.Pooling",
                "sentence_transformers.models.Normalize")
ACTIVATIONS = ("gelu",)  # the exact (erf) GELU
# Attention scores a batch may hold at once (rows x length x length, per head): long texts go in
# smaller batches, so memory stays in the tens of MB whatever the input.
SCORE_BUDGET = 1 << 19
MAX_BATCH = 64
# Bounds on the folder's files (all-MiniLM-L6-v2: configs of a few hundred bytes, a 0.7 MB tokenizer.json,
# a 91 MB model.safetensors); each is read only once checked to be a regular file within its bound.
MAX_CONFIG_BYTES = 1 * MiB
MAX_TOKENIZER_BYTES = 64 * MiB
MAX_WEIGHTS_BYTES = 2048 * MiB


class UnsupportedModel(ValueError):
    """A model folder whose architecture this encoder does not reproduce."""


@dataclass(frozen=True)
class BertConfig:
    vocab_size: int
    hidden_size: int
    num_heads: int
    num_layers: int
    intermediate_size: int
    layer_norm_eps: float
    hidden_act: str
    max_positions: int
    type_vocab_size: int
    pad_token_id: int
    max_seq_length: int
    do_lower_case: bool

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


def _read_json(path: Path, folder: Path) -> dict:
    from trace_dspy.core.safety import load_json

    try:
        return load_json(read_bytes(path, max_bytes=MAX_CONFIG_BYTES), str(path))
    except FileCheckError as e:
        if e.missing:
            raise UnsupportedModel(f"unsupported model folder {folder}: no {path.relative_to(folder)}") from None
        raise UnsupportedModel(f"unsupported model folder {folder}: cannot read {e}") from None
    except (OSError, ValueError) as e:
        raise UnsupportedModel(f"unsupported model folder {folder}: cannot read {path.relative_to(folder)}: {e}") \
            from None


def read_config(folder: str | Path) -> tuple[BertConfig, Path]:
    """The architecture numbers of a sentence-transformers BERT folder, and its Transformer module's folder.

    Raises :class:`UnsupportedModel` for anything but Transformer (BERT, absolute positions), mean pooling
    and an optional Normalize, in that order.
    """
    folder = Path(folder)

    def refuse(why: str) -> NoReturn:
        raise UnsupportedModel(f"unsupported model folder {folder}: {why}")

    modules = _read_json(folder / "modules.json", folder)
    types = [m.get("type", "") if isinstance(m, dict) else "" for m in modules] if isinstance(modules, list) else []
    if types not in (list(MODULE_TYPES[:2]), list(MODULE_TYPES)):
        refuse(f"modules {types or modules!r}; this encoder runs only Transformer, Pooling and optionally "
               "Normalize")
    transformer = folder / modules[0].get("path", "")
    pooling = folder / modules[1].get("path", "")

    config = _read_json(transformer / "config.json", folder)
    if config.get("model_type") != "bert":
        refuse(f"model_type {config.get('model_type')!r}; only BERT is supported")
    if config.get("position_embedding_type", "absolute") != "absolute":
        refuse(f"position_embedding_type {config['position_embedding_type']!r}; only absolute is supported")
    if config.get("is_decoder") or config.get("add_cross_attention"):
        refuse("a decoder; only a BERT encoder is supported")
    act = config.get("hidden_act")
    if act not in ACTIVATIONS:
        refuse(f"hidden_act {act!r}; only {', '.join(ACTIVATIONS)} is supported")
    try:
        vocab, hidden = int(config["vocab_size"]), int(config["hidden_size"])
        heads, layers = int(config["num_attention_heads"]), int(config["num_hidden_layers"])
        inter = int(config["intermediate_size"])
        eps, positions = float(config["layer_norm_eps"]), int(config["max_position_embeddings"])
        types_n = int(config.get("type_vocab_size", 2))
    except (KeyError, TypeError, ValueError) as e:
        refuse(f"config.json lacks a usable {e}")
    if heads <= 0 or hidden % heads:
        refuse(f"hidden_size {hidden} is not a multiple of num_attention_heads {heads}")

    pool = _read_json(pooling / "config.json", folder)
    modes = sorted(k for k, v in pool.items() if k.startswith("pooling_mode_") and v)
    if modes != ["pooling_mode_mean_tokens"]:
        refuse(f"pooling {modes or 'none'}; only pooling_mode_mean_tokens is supported")
    if pool.get("word_embedding_dimension", hidden) != hidden:
        refuse(f"pooling dimension {pool['word_embedding_dimension']} differs from hidden_size {hidden}")
    if pool.get("include_prompt", True) is not True:
        refuse("pooling without the prompt tokens is not supported")

    sbert = _read_json(transformer / "sentence_bert_config.json", folder)
    max_len = sbert.get("max_seq_length")
    if not isinstance(max_len, int) or not 2 <= max_len <= positions:
        refuse(f"max_seq_length {max_len!r} must be an integer in [2, max_position_embeddings={positions}]")
    return BertConfig(vocab, hidden, heads, layers, inter, eps, act, positions, types_n,
                      int(config.get("pad_token_id", 0)), max_len, bool(sbert.get("do_lower_case", False))), transformer


# Numerical Recipes' Chebyshev fit ``erfcc``: erfc(a) = t * exp(-a^2 + P(t)), t = 1 / (1 + a/2), for a >= 0,
# with relative error below 1.2e-7 everywhere: float32 accuracy without importing scipy.special for one
# function. P's coefficients, highest power first.
_ERFC_POLY = (0.17087277, -0.82215223, 1.48851587, -1.13520398, 0.27886807, -0.18628806, 0.09678418, 0.37409196,
              1.00002368, -1.26551223)


def gelu(x: np.ndarray) -> np.ndarray:
    """BERT's exact (erf) GELU, ``x * (1 + erf(x / sqrt 2)) / 2``, computed in float64, returned as float32."""
    z = x.astype(np.float64)
    a = np.abs(z)
    a *= 1.0 / math.sqrt(2.0)
    t = a * 0.5
    t += 1.0
    np.reciprocal(t, out=t)
    y = t * _ERFC_POLY[0]
    for c in _ERFC_POLY[1:-1]:
        y += c
        y *= t
    y += _ERFC_POLY[-1]
    a *= a
    y -= a
    np.exp(y, out=y)
    y *= t  # erfc(|x| / sqrt 2)
    np.subtract(2.0, y, out=y, where=z >= 0)  # 1 + erf(x / sqrt 2): 2 - erfc(|x|/sqrt 2) for x >= 0
    y *= z
    y *= 0.5
    return y.astype(np.float32)


def _layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float) -> np.ndarray:
    """LayerNorm over the last axis (biased variance, as torch), overwriting ``x``."""
    x -= x.mean(axis=-1, keepdims=True)
    var = np.mean(np.square(x), axis=-1, keepdims=True)
    var += np.float32(eps)
    x /= np.sqrt(var)
    x *= weight
    x += bias
    return x


# A call with at most this many tokens in all runs its matrix products on one BLAS thread: they are too small
# to gain from two, and on a busy machine a second BLAS thread that waits for a core costs far more (a short
# text took 500 ms on two threads against 14 ms on one while other processes held both cores).
SMALL_CALL_TOKENS = 2048
_CONTROLLER: list = []


def _one_blas_thread():
    """A context that limits BLAS to one thread (threadpoolctl); no limit where threadpoolctl is missing."""
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:
        return contextlib.nullcontext()
    if not _CONTROLLER:
        _CONTROLLER.append(ThreadpoolController())
    return _CONTROLLER[0].limit(limits=1, user_api="blas")


class BertSentenceEncoder:
    """Encodes texts into unit-length float32 vectors, as ``SentenceTransformer(folder).encode(texts,
    normalize_embeddings=True)`` does. Not thread-safe on its own; :class:`~trace_dspy.optimize.similarity.Embedder`
    serialises the calls."""

    def __init__(self, folder: str | Path):
        from safetensors.numpy import load
        from tokenizers import Tokenizer

        self.folder = Path(folder)
        self.config, transformer = read_config(self.folder)
        cfg = self.config
        for name in ("tokenizer.json", "model.safetensors"):
            if not (transformer / name).is_file():
                raise UnsupportedModel(f"unsupported model folder {self.folder}: no {name}")
        tokenizer = Tokenizer.from_str(self._read(transformer / "tokenizer.json", MAX_TOKENIZER_BYTES, text=True))
        # As sentence-transformers calls it: truncated to max_seq_length; padded here, per batch.
        tokenizer.enable_truncation(max_length=cfg.max_seq_length, strategy="longest_first")
        tokenizer.no_padding()
        self.tokenizer = tokenizer
        self._load_weights(load(self._read(transformer / "model.safetensors", MAX_WEIGHTS_BYTES)))

    def _read(self, path: Path, max_bytes: int, *, text: bool = False):
        """A file of the folder, checked and bounded (its bytes, or its UTF-8 text)."""
        try:
            return read_text(path, max_bytes=max_bytes) if text else read_bytes(path, max_bytes=max_bytes)
        except FileCheckError as e:
            raise UnsupportedModel(f"unsupported model folder {self.folder}: cannot read {e}") from None

    @property
    def dim(self) -> int:
        return self.config.hidden_size

    def _load_weights(self, raw: dict[str, np.ndarray]) -> None:
        cfg = self.config
        if raw and all(k.startswith("bert.") for k in raw):
            raw = {k[len("bert."):]: v for k, v in raw.items()}
        h, i = cfg.hidden_size, cfg.intermediate_size

        def get(name: str, shape: tuple[int, ...]) -> np.ndarray:
            if name not in raw:
                raise UnsupportedModel(f"unsupported model folder {self.folder}: model.safetensors lacks {name}")
            value = raw[name]
            if value.shape != shape or value.dtype.kind != "f":
                raise UnsupportedModel(f"unsupported model folder {self.folder}: {name} is {value.dtype}"
                                       f"{list(value.shape)}, expected float{list(shape)}")
            return np.ascontiguousarray(value, dtype=np.float32)

        self.word = get("embeddings.word_embeddings.weight", (cfg.vocab_size, h))
        self.position = get("embeddings.position_embeddings.weight", (cfg.max_positions, h))
        self.token_type = get("embeddings.token_type_embeddings.weight", (cfg.type_vocab_size, h))
        self.emb_norm = (get("embeddings.LayerNorm.weight", (h,)), get("embeddings.LayerNorm.bias", (h,)))
        self.layers = []
        for n in range(cfg.num_layers):
            p = f"encoder.layer.{n}."
            # Linear layers hold (out, in); stored transposed so that x @ w is torch's x @ w.T.
            qkv_w = np.concatenate([get(p + f"attention.self.{m}.weight", (h, h)) for m in ("query", "key", "value")])
            qkv_b = np.concatenate([get(p + f"attention.self.{m}.bias", (h,)) for m in ("query", "key", "value")])
            self.layers.append({
                "qkv_w": np.ascontiguousarray(qkv_w.T), "qkv_b": qkv_b,
                "out_w": np.ascontiguousarray(get(p + "attention.output.dense.weight", (h, h)).T),
                "out_b": get(p + "attention.output.dense.bias", (h,)),
                "norm1": (get(p + "attention.output.LayerNorm.weight", (h,)),
                          get(p + "attention.output.LayerNorm.bias", (h,))),
                "inter_w": np.ascontiguousarray(get(p + "intermediate.dense.weight", (i, h)).T),
                "inter_b": get(p + "intermediate.dense.bias", (i,)),
                "ffn_w": np.ascontiguousarray(get(p + "output.dense.weight", (h, i)).T),
                "ffn_b": get(p + "output.dense.bias", (h,)),
                "norm2": (get(p + "output.LayerNorm.weight", (h,)), get(p + "output.LayerNorm.bias", (h,))),
            })

    # -- encoding ---------------------------------------------------------------

    def tokenize(self, texts: Sequence[str]) -> list[tuple[list[int], list[int]]]:
        """Each text's (token ids, token type ids), with [CLS]/[SEP] and truncated to max_seq_length."""
        if self.config.do_lower_case:
            texts = [t.lower() for t in texts]
        return [(e.ids, e.type_ids) for e in self.tokenizer.encode_batch(list(texts))]

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """Unit-length float32 vectors ``(len(texts), dim)``; texts are batched by token length."""
        texts = [str(t) for t in texts]
        out = np.zeros((len(texts), self.dim), np.float32)
        if not texts:
            return out
        tokens = self.tokenize(texts)
        order = sorted(range(len(texts)), key=lambda k: -len(tokens[k][0]))
        small = sum(len(ids) for ids, _ in tokens) <= SMALL_CALL_TOKENS
        with _one_blas_thread() if small else contextlib.nullcontext():
            self._encode_sorted(tokens, order, out)
        return out

    def _encode_sorted(self, tokens: list, order: list[int], out: np.ndarray) -> None:
        start = 0
        while start < len(order):
            longest = len(tokens[order[start]][0])
            rows = max(1, min(MAX_BATCH, SCORE_BUDGET // (longest * longest)))
            chunk = order[start:start + rows]
            out[chunk] = self._forward([tokens[k] for k in chunk])
            start += rows

    def _forward(self, batch: list[tuple[list[int], list[int]]]) -> np.ndarray:
        cfg = self.config
        n, length = len(batch), max(len(ids) for ids, _ in batch)
        ids = np.full((n, length), cfg.pad_token_id, np.int64)
        types = np.zeros((n, length), np.int64)
        mask = np.zeros((n, length), bool)
        for row, (tok, typ) in enumerate(batch):
            ids[row, :len(tok)], types[row, :len(typ)], mask[row, :len(tok)] = tok, typ, True
        if ids.max() >= self.word.shape[0] or types.max() >= self.token_type.shape[0]:
            raise UnsupportedModel(f"unsupported model folder {self.folder}: the tokenizer's ids exceed the "
                                   "embedding tables")

        h, heads, d = cfg.hidden_size, cfg.num_heads, cfg.head_dim
        x = self.word[ids]
        x += self.position[:length]
        x += self.token_type[types]
        x = _layer_norm(x, *self.emb_norm, cfg.layer_norm_eps).reshape(n * length, h)
        # Padding keys get the most negative float32 added, as transformers' extended attention mask does.
        key_bias = np.where(mask, np.float32(0), np.finfo(np.float32).min)[:, None, None, :]
        scale = np.float32(1.0 / math.sqrt(d))
        for layer in self.layers:
            qkv = x @ layer["qkv_w"]
            qkv += layer["qkv_b"]
            q, k, v = qkv.reshape(n, length, 3, heads, d).transpose(2, 0, 3, 1, 4)
            scores = q @ k.transpose(0, 1, 3, 2)
            scores *= scale
            scores += key_bias
            scores -= scores.max(axis=-1, keepdims=True)
            np.exp(scores, out=scores)
            scores /= scores.sum(axis=-1, keepdims=True)
            attended = (scores @ v).transpose(0, 2, 1, 3).reshape(n * length, h) @ layer["out_w"]
            attended += layer["out_b"]
            attended += x
            x = _layer_norm(attended, *layer["norm1"], cfg.layer_norm_eps)
            hidden = x @ layer["inter_w"]
            hidden += layer["inter_b"]
            hidden = gelu(hidden)
            out = hidden @ layer["ffn_w"]
            out += layer["ffn_b"]
            out += x
            x = _layer_norm(out, *layer["norm2"], cfg.layer_norm_eps)

        x = x.reshape(n, length, h)
        weights = mask.astype(np.float32)[:, :, None]
        pooled = (x * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), np.float32(1e-9))
        norms = np.linalg.norm(pooled, axis=1, keepdims=True)
        return (pooled / np.maximum(norms, np.float32(1e-12))).astype(np.float32)


__all__ = ["BertConfig", "BertSentenceEncoder", "UnsupportedModel", "gelu", "read_config"]
