"""A learned empathy scorer: EPITOME's three mechanisms rated from text.

``EmpathyScorer.score(seeker, reply)`` returns the expected level in [0, 2]
of each mechanism (``ER`` Emotional Reactions, ``IP`` Interpretations, ``EX``
Explorations; Sharma et al., EMNLP 2020) and ``empathy``, their sum divided
by 6, in [0, 1].

The model is a small head over the sentence embeddings of the ``embed``
extra (all-MiniLM-L6-v2): for each mechanism a 3-class logistic regression on

- the reply's embedding (what it says);
- the element-wise maximum over the embeddings of the reply's sentences (one
  asking sentence in a long reply is what Explorations rate);
- a few counts of form (questions, second- and first-person words, sentences,
  words, an exclamation) and the cosine between post and reply.

Products and differences of the post's and the reply's embeddings were tried
and dropped: they lowered the held-out correlations in our trials. How
well the reply fits the speaker is the metric's ``relevance`` component.

The fitted weights ship beside this module as ``empathy_head.npz`` (numpy
arrays and a JSON header; loaded with ``allow_pickle=False``), with the
fingerprint of the EPITOME files they came from and their dev table.
``python -m trace_dspy.fit_empathy`` refits them (seeded, deterministic).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from trace_dspy.core.extras import install_hint
from trace_dspy.core.files import ArrayLimits, MiB, load_header_npz, write_header_npz
from trace_dspy.core.labels import STRATEGIES
from trace_dspy.core.text import split_sentences

MECHANISMS = STRATEGIES  # ER, IP, EX: EPITOME's mechanisms are TRACE's strategies
LEVELS = 3
FEATURE_VERSION = 1
WEIGHTS_FILE = Path(__file__).with_name("empathy_head.npz")
# Bounds on a weights file (the shipped one inflates to about 40 kB).
WEIGHT_LIMITS = ArrayLimits(file_bytes=16 * MiB, member_bytes=16 * MiB, total_bytes=64 * MiB, members=8,
                            header_bytes=1 * MiB)
MAX_SENTENCES = 8
NO_EMBED = (f'the learned empathy scorer needs the "embed" extra ({install_hint("embed")}); '
            "the empathy and strategy_fit components are off")

Encoder = Callable[[list[str]], np.ndarray]


class ScorerError(RuntimeError):
    """The scorer cannot run: no embedding model, or a missing or damaged weights file."""


# ---------------------------------------------------------------- text

_SPACED = [
    (re.compile(r" (n't|'s|'re|'ve|'m|'ll|'d)\b"), r"\1"),
    (re.compile(r" ([.,!?;:])"), r"\1"),
    (re.compile(r"_comma_"), ","),
]
_WORD = re.compile(r"[a-z']+")
_SECOND = frozenset("you your yours you're youre yourself you've you'll you'd".split())
_FIRST = frozenset("i me my mine i'm im i've i'd i'll myself".split())


def normalize(text: str) -> str:
    """One spelling for Reddit and preprocessed ED text ("i 'm sorry ." -> "i'm sorry.")."""
    text = " ".join(str(text).split())
    for pattern, repl in _SPACED:
        text = pattern.sub(repl, text)
    return text


def sentences(text: str) -> list[str]:
    parts = [s.strip() for line in text.split("\n") for s in split_sentences(line) if s.strip()]
    return parts[:MAX_SENTENCES] or [text]


def form_features(seeker: str, reply: str) -> list[float]:
    words = _WORD.findall(reply.lower())
    n = max(1, len(words))
    parts = sentences(reply)
    questions = sum(p.endswith("?") for p in parts)
    return [
        float(np.log1p(reply.count("?"))),
        float(questions > 0),
        questions / len(parts),
        sum(w in _SECOND for w in words) / n,
        sum(w in _FIRST for w in words) / n,
        float(np.log1p(len(parts))),
        float(np.log1p(len(words))),
        float("!" in reply),
    ]


N_FORM = 8


def featurize(encode: Encoder, seekers: Sequence[str], replies: Sequence[str]) -> np.ndarray:
    """The feature matrix of (seeker, reply) pairs; ``encode`` returns unit-length rows."""
    if len(seekers) != len(replies):
        raise ValueError(f"{len(seekers)} seeker texts but {len(replies)} replies")
    if not replies:
        return np.zeros((0, 0), np.float32)
    seekers = [normalize(s) for s in seekers]
    replies = [normalize(r) for r in replies]
    split = [sentences(r) for r in replies]
    flat = [s for parts in split for s in parts]
    vectors = encode(list(dict.fromkeys([*seekers, *replies, *flat])))
    index = {t: i for i, t in enumerate(dict.fromkeys([*seekers, *replies, *flat]))}
    s = vectors[[index[t] for t in seekers]]
    r = vectors[[index[t] for t in replies]]
    sent_max = np.stack([vectors[[index[t] for t in parts]].max(axis=0) for parts in split])
    cos = np.sum(s * r, axis=1, keepdims=True)
    form = np.array([form_features(a, b) for a, b in zip(seekers, replies)], np.float32)
    return np.hstack([r, sent_max, form, cos]).astype(np.float32)


# ---------------------------------------------------------------- the head


@dataclass
class Head:
    """Standardization plus one softmax regression per mechanism."""

    mean: np.ndarray  # (d,)
    scale: np.ndarray  # (d,)
    weights: np.ndarray  # (mechanisms, d, levels)
    bias: np.ndarray  # (mechanisms, levels)
    meta: dict[str, Any]

    def proba(self, features: np.ndarray) -> np.ndarray:
        """(n, mechanisms, levels) probabilities."""
        if features.shape[1] != self.mean.shape[0]:
            raise ScorerError(f"the scorer expects {self.mean.shape[0]} features, got {features.shape[1]}")
        z = (features - self.mean) / self.scale
        logits = np.einsum("nd,mdk->nmk", z, self.weights) + self.bias[None]
        logits -= logits.max(axis=2, keepdims=True)
        p = np.exp(logits)
        return p / p.sum(axis=2, keepdims=True)

    def save(self, path: str | Path) -> Path:
        return write_header_npz(path, self.meta, {"mean": self.mean, "scale": self.scale, "weights": self.weights,
                                                  "bias": self.bias})

    @classmethod
    def load(cls, path: str | Path) -> Head:
        path = Path(path)
        meta, arrays = load_header_npz(path, ("mean", "scale", "weights", "bias"), limits=WEIGHT_LIMITS,
                                       error=ScorerError, what="empathy scorer weights",
                                       hint=" (refit: python -m trace_dspy.fit_empathy)")
        d = arrays["mean"].shape
        w = arrays["weights"]
        if (len(d) != 1 or arrays["scale"].shape != d or w.shape != (len(MECHANISMS), d[0], LEVELS)
                or arrays["bias"].shape != (len(MECHANISMS), LEVELS)):
            raise ScorerError(f"{path}: the arrays' shapes do not fit together")
        if meta.get("feature_version") != FEATURE_VERSION:
            raise ScorerError(f"{path}: made for feature version {meta.get('feature_version')}, "
                              f"this code computes version {FEATURE_VERSION}; refit with python -m trace_dspy.fit_empathy")
        if not all(np.isfinite(a).all() for a in arrays.values()):
            raise ScorerError(f"{path}: the weights hold non-finite values")
        return cls(arrays["mean"].astype(np.float32), arrays["scale"].astype(np.float32),
                   w.astype(np.float32), arrays["bias"].astype(np.float32), meta)


def fit_softmax(x: np.ndarray, y: np.ndarray, *, l2: float, iterations: int = 400,
                class_weight: np.ndarray | None = None, classes: int = LEVELS) -> tuple[np.ndarray, np.ndarray]:
    """L2-regularized softmax regression on standardized ``x`` by Nesterov gradient descent.

    Deterministic (no random initialisation); ``class_weight`` rebalances rare levels.
    """
    x = np.asarray(x, dtype=np.float64)  # mixed float32/float64 products are several times slower
    n, d = x.shape
    onehot = np.eye(classes)[y]
    sample_w = np.ones(n) if class_weight is None else class_weight[y]
    sample_w = sample_w / sample_w.sum()
    w = np.zeros((d, classes))
    b = np.log((onehot * sample_w[:, None]).sum(0) + 1e-3)
    vw, vb = w.copy(), b.copy()
    # 1 / (a bound on the loss's curvature): softmax cross-entropy curves by at most 1/2 per unit of |x|^2.
    step = 1.0 / (0.5 * sample_w.max() * _top_singular(x) ** 2 * 1.05 + l2)
    for t in range(iterations):
        momentum = t / (t + 3)
        lw, lb = w + momentum * (w - vw), b + momentum * (b - vb)
        logits = x @ lw + lb
        logits -= logits.max(1, keepdims=True)
        p = np.exp(logits)
        p /= p.sum(1, keepdims=True)
        g = (p - onehot) * sample_w[:, None]
        vw, vb = w, b
        w = lw - step * (x.T @ g + l2 * lw)
        b = lb - step * g.sum(0)
    return w.astype(np.float32), b.astype(np.float32)


def _top_singular(x: np.ndarray, rounds: int = 50) -> float:
    """The largest singular value of ``x`` by power iteration (deterministic start)."""
    v = np.ones(x.shape[1]) / np.sqrt(x.shape[1])
    sigma = 0.0
    for _ in range(rounds):
        u = x @ v
        sigma = float(np.linalg.norm(u))
        if sigma == 0:
            return 0.0
        v = x.T @ (u / sigma)
        v /= np.linalg.norm(v)
    return sigma


def fit_head(features: np.ndarray, levels: np.ndarray, *, l2: float, iterations: int = 400,
             meta: dict[str, Any] | None = None) -> Head:
    """One softmax regression per mechanism; ``levels`` is (n, 3) in {0, 1, 2}."""
    features = np.asarray(features, dtype=np.float64)
    mean = features.mean(0)
    scale = features.std(0) + 1e-6
    z = (features - mean) / scale
    weights, biases = [], []
    for m in range(len(MECHANISMS)):
        y = levels[:, m].astype(int)
        counts = np.bincount(y, minlength=LEVELS).astype(float)
        balance = np.where(counts > 0, len(y) / (LEVELS * np.maximum(counts, 1)), 0.0) ** 0.5
        w, b = fit_softmax(z, y, l2=l2, iterations=iterations, class_weight=balance)
        weights.append(w)
        biases.append(b)
    return Head(mean.astype(np.float32), scale.astype(np.float32), np.stack(weights), np.stack(biases),
                {"feature_version": FEATURE_VERSION, **(meta or {})})


# ---------------------------------------------------------------- the scorer


class EmpathyScorer:
    """Expected EPITOME levels of a reply to a seeker's words, from the shipped weights."""

    def __init__(self, weights: str | Path | Head | None = None, *, encode: Encoder | None = None):
        self.head = weights if isinstance(weights, Head) else Head.load(weights or WEIGHTS_FILE)
        if encode is None:
            from trace_dspy.optimize.similarity import embedder_encode

            encode = embedder_encode(ScorerError, NO_EMBED)
        self._encode = encode

    @property
    def meta(self) -> dict[str, Any]:
        return dict(self.head.meta)

    def levels(self, seekers: Sequence[str], replies: Sequence[str]) -> np.ndarray:
        """(n, 3) expected levels in [0, 2]."""
        if not len(replies):
            return np.zeros((0, len(MECHANISMS)), np.float32)
        p = self.head.proba(featurize(self._encode, seekers, replies))
        return p @ np.arange(LEVELS, dtype=np.float32)

    def score_batch(self, seekers: Sequence[str], replies: Sequence[str]) -> list[dict[str, float]]:
        return [_as_dict(row) for row in self.levels(seekers, replies)]

    def score(self, seeker: str, reply: str) -> dict[str, float]:
        return self.score_batch([seeker], [reply])[0]


def _as_dict(levels: np.ndarray) -> dict[str, float]:
    out = {m: float(v) for m, v in zip(MECHANISMS, levels)}
    out["empathy"] = float(levels.sum() / (2 * len(MECHANISMS)))
    return out


def shared_scorer() -> EmpathyScorer | None:
    """The process-wide scorer from the shipped weights; None without the ``embed`` extra.

    A missing or damaged weights file raises ScorerError: it is a broken
    install, not an optional part.
    """
    from trace_dspy.optimize.similarity import shared_on_embedder

    return shared_on_embedder("empathy", lambda encode: EmpathyScorer(encode=encode))
