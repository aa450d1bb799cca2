"""A learned relevance head: does this reply answer this speaker?

Cosine similarity between a reply and the speaker's words ranks a real
EmpatheticDialogues reply above another conversation's real reply only about
88% of the time: a generic reply ("that is great, maybe you will get a raise")
sits close to many messages. This head learns what a fitting reply looks like
from the ED pool's own (conversation, reply) pairs.

Inputs are the unit MiniLM embeddings of the speaker's words ``s`` (all their
turns), of their last turn ``l`` and of the reply ``r``. The score is

    z = w_s * (s . r) + w_l * (l . r) + (A s) . (B r) + (C l) . (B r)

with low-rank projections A, B, C (384 x 16). It is fitted contrastively
(each batch's other replies are the negatives; symmetric cross-entropy, Adam,
seeded, plain numpy), stopped at the epoch with the best held-out AUC, and
turned into ``P(fits) = sigmoid(a z + b)`` by a logistic fit on held-out
conversations against mismatched replies. That probability is the metric's
``relevance`` component.

The weights ship beside this module as ``relevance_head.npz`` (no pickle);
``python -m trace_dspy.fit_relevance`` refits them from the ED pool.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from trace_dspy.core.files import ArrayLimits, MiB, load_header_npz, write_header_npz
from trace_dspy.optimize.empathy import normalize

FEATURE_VERSION = 1
WEIGHTS_FILE = Path(__file__).with_name("relevance_head.npz")
# Bounds on a weights file (the shipped one inflates to about 0.15 MB).
WEIGHT_LIMITS = ArrayLimits(file_bytes=64 * MiB, member_bytes=64 * MiB, total_bytes=256 * MiB, members=8,
                            header_bytes=1 * MiB)
ARRAYS = ("A", "B", "C", "w", "calibration")
TEMPERATURE = 10.0  # logits scale during the contrastive fit

Encoder = Callable[[list[str]], np.ndarray]


class RelevanceError(RuntimeError):
    """The relevance head cannot run: a missing or damaged weights file."""


@dataclass
class RelevanceHead:
    A: np.ndarray  # (d, rank) projection of the speaker's words
    B: np.ndarray  # (d, rank) projection of the reply
    C: np.ndarray  # (d, rank) projection of the last turn
    w: np.ndarray  # (2,) weights of the two plain cosines
    calibration: np.ndarray  # (2,) a, b of sigmoid(a z + b)
    meta: dict[str, Any]

    def raw(self, s: np.ndarray, last: np.ndarray, r: np.ndarray) -> np.ndarray:
        """Uncalibrated score z of row-aligned embeddings."""
        rb = r @ self.B
        return (self.w[0] * np.sum(s * r, 1) + self.w[1] * np.sum(last * r, 1)
                + np.sum((s @ self.A) * rb, 1) + np.sum((last @ self.C) * rb, 1))

    def proba(self, s: np.ndarray, last: np.ndarray, r: np.ndarray) -> np.ndarray:
        a, b = self.calibration
        return 1.0 / (1.0 + np.exp(-(a * self.raw(s, last, r) + b)))

    def save(self, path: str | Path) -> Path:
        return write_header_npz(path, self.meta, {k: getattr(self, k) for k in ARRAYS})

    @classmethod
    def load(cls, path: str | Path) -> RelevanceHead:
        path = Path(path)
        meta, arrays = load_header_npz(path, ARRAYS, limits=WEIGHT_LIMITS, error=RelevanceError,
                                       what="relevance head weights", hint=" (refit: python -m trace_dspy.fit_relevance)")
        a = arrays["A"]
        if (a.ndim != 2 or arrays["B"].shape != a.shape or arrays["C"].shape != a.shape
                or arrays["w"].shape != (2,) or arrays["calibration"].shape != (2,)):
            raise RelevanceError(f"{path}: the arrays' shapes do not fit together")
        if meta.get("feature_version") != FEATURE_VERSION:
            raise RelevanceError(f"{path}: made for feature version {meta.get('feature_version')}, this code "
                                 f"computes version {FEATURE_VERSION}; refit with python -m trace_dspy.fit_relevance")
        if not all(np.isfinite(v).all() for v in arrays.values()):
            raise RelevanceError(f"{path}: the weights hold non-finite values")
        return cls(**{k: arrays[k].astype(np.float64) for k in ARRAYS}, meta=meta)


def embed_triples(encode: Encoder, speakers: Sequence[str], lasts: Sequence[str],
                  replies: Sequence[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Embeddings of normalized texts (ED's spaced tokens and plain text spelled alike)."""
    if not (len(speakers) == len(lasts) == len(replies)):
        raise ValueError(f"{len(speakers)} speaker texts, {len(lasts)} last turns, {len(replies)} replies")
    groups = [[normalize(t) for t in texts] for texts in (speakers, lasts, replies)]
    unique = list(dict.fromkeys(t for g in groups for t in g))
    if not unique:
        empty = np.zeros((0, 0))
        return empty, empty, empty
    vectors = np.asarray(encode(unique), dtype=np.float64)
    index = {t: i for i, t in enumerate(unique)}
    s, last, r = (vectors[[index[t] for t in g]] for g in groups)
    return s, last, r


class RelevanceScorer:
    """P(the reply fits the speaker) from the shipped head."""

    def __init__(self, weights: str | Path | RelevanceHead | None = None, *, encode: Encoder | None = None):
        self.head = weights if isinstance(weights, RelevanceHead) else RelevanceHead.load(weights or WEIGHTS_FILE)
        if encode is None:
            from trace_dspy.optimize.similarity import embedder_encode

            encode = embedder_encode(RelevanceError, 'the relevance head needs the "embed" extra')
        self._encode = encode

    @property
    def meta(self) -> dict[str, Any]:
        return dict(self.head.meta)

    def score_batch(self, speakers: Sequence[str], lasts: Sequence[str], replies: Sequence[str]) -> list[float]:
        if not len(replies):
            return []
        s, last, r = embed_triples(self._encode, speakers, lasts, replies)
        if s.shape[1] != self.head.A.shape[0]:
            raise RelevanceError(f"the head expects {self.head.A.shape[0]}-dim embeddings, got {s.shape[1]}")
        return [float(p) for p in self.head.proba(s, last, r)]

    def score(self, speaker: str, last: str, reply: str) -> float:
        return self.score_batch([speaker], [last], [reply])[0]


# ---------------------------------------------------------------- fitting


def _softmax(z: np.ndarray, axis: int) -> np.ndarray:
    z = z - z.max(axis=axis, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=axis, keepdims=True)


def contrastive_step(params: dict[str, np.ndarray], s, last, r) -> tuple[float, dict[str, np.ndarray]]:
    """Symmetric in-batch cross-entropy and its gradients (row i's reply is the positive)."""
    A, B, C, w = params["A"], params["B"], params["C"], params["w"]
    n = len(s)
    sr, lr = s @ r.T, last @ r.T
    left = s @ A + last @ C  # (n, rank)
    rb = r @ B
    z = TEMPERATURE * (w[0] * sr + w[1] * lr + left @ rb.T)
    p_row, p_col = _softmax(z, 1), _softmax(z, 0)
    diag = np.arange(n)
    loss = -0.5 * (np.log(p_row[diag, diag] + 1e-12).mean() + np.log(p_col[diag, diag] + 1e-12).mean())
    eye = np.eye(n)
    dz = TEMPERATURE * 0.5 * ((p_row - eye) + (p_col - eye)) / n
    d_left = dz @ rb
    grads = {
        "A": s.T @ d_left,
        "C": last.T @ d_left,
        "B": r.T @ (dz.T @ left),
        "w": np.array([np.sum(dz * sr), np.sum(dz * lr)]),
    }
    return float(loss), grads


def fit_contrastive(s, last, r, *, rank: int = 16, epochs: int = 8, batch: int = 128, lr: float = 1e-3,
                    weight_decay: float = 0.1, seed: int = 0,
                    on_epoch: Callable[[int, dict[str, np.ndarray]], None] | None = None) -> dict[str, np.ndarray]:
    """AdamW on the contrastive loss; ``on_epoch(epoch, params)`` sees a copy after each epoch."""
    rng = np.random.default_rng(seed)
    d = s.shape[1]
    bound = 1.0 / np.sqrt(d)
    params = {k: rng.uniform(-bound, bound, (d, rank)) for k in ("A", "B", "C")}
    params["w"] = np.array([1.0, 0.0])
    m = {k: np.zeros_like(v) for k, v in params.items()}
    v = {k: np.zeros_like(x) for k, x in params.items()}
    b1, b2, eps, t = 0.9, 0.999, 1e-8, 0
    for epoch in range(epochs):
        order = rng.permutation(len(s))
        for i in range(0, len(order), batch):
            j = order[i:i + batch]
            if len(j) < 2:
                continue
            _, grads = contrastive_step(params, s[j], last[j], r[j])
            t += 1
            for k, g in grads.items():
                params[k] *= 1 - lr * weight_decay
                m[k] = b1 * m[k] + (1 - b1) * g
                v[k] = b2 * v[k] + (1 - b2) * g * g
                params[k] -= lr * (m[k] / (1 - b1 ** t)) / (np.sqrt(v[k] / (1 - b2 ** t)) + eps)
        if on_epoch is not None:
            on_epoch(epoch + 1, {k: x.copy() for k, x in params.items()})
    return params


def fit_calibration(z: np.ndarray, y: np.ndarray, iterations: int = 50) -> np.ndarray:
    """a, b of sigmoid(a z + b) by Newton's method on the log-loss (tiny ridge for stability)."""
    x = np.stack([z, np.ones_like(z)], 1)
    theta = np.zeros(2)
    for _ in range(iterations):
        p = 1.0 / (1.0 + np.exp(-(x @ theta)))
        g = x.T @ (p - y) + 1e-6 * theta
        h = (x * (p * (1 - p))[:, None]).T @ x + 1e-6 * np.eye(2)
        step = np.linalg.solve(h, g)
        theta -= step
        if np.abs(step).max() < 1e-10:
            break
    return theta


def mismatch(n: int) -> np.ndarray:
    """A fixed derangement: item i is paired with item (i + n // 2) mod n."""
    return (np.arange(n) + max(1, n // 2)) % n


def shared_relevance() -> RelevanceScorer | None:
    """The process-wide head from the shipped weights; None without the ``embed`` extra."""
    from trace_dspy.optimize.similarity import shared_on_embedder

    return shared_on_embedder("relevance", lambda encode: RelevanceScorer(encode=encode))


# ---------------------------------------------------------------- the fit on the ED pool

MAX_EPOCHS = 12


@dataclass
class RelevanceFit:
    head: RelevanceHead
    table: dict[str, float]


def fit_pool(triples: Sequence[tuple[str, str, str, str]], encode: Encoder, *, seed: int = 0,
             held_out: float = 0.1, rank: int = 16, max_epochs: int = MAX_EPOCHS,
             meta: dict[str, Any] | None = None) -> RelevanceFit:
    """Fit on (group, speaker words, last turn, reply) rows; groups (conversations) are split, seeded.

    The epoch count is the one with the best held-out AUC of a real reply against a
    mismatched one; the calibration is fitted on the held-out rows.
    """
    import random

    from trace_dspy.optimize.scorers import auc

    groups = sorted({t[0] for t in triples})
    if len(groups) < 10:
        raise ValueError(f"the relevance fit needs at least 10 conversations, got {len(groups)}")
    random.Random(seed).shuffle(groups)
    held = set(groups[:max(2, round(len(groups) * held_out))])
    train = [t for t in triples if t[0] not in held]
    dev = [t for t in triples if t[0] in held]
    s, last, r = embed_triples(encode, *zip(*[t[1:] for t in train]))
    ds, dl, dr = embed_triples(encode, *zip(*[t[1:] for t in dev]))
    wrong = mismatch(len(dev))
    best: dict[str, Any] = {"auc": -1.0}

    def on_epoch(epoch: int, params: dict[str, np.ndarray]) -> None:
        head = RelevanceHead(params["A"], params["B"], params["C"], params["w"], np.array([1.0, 0.0]), {})
        value = auc(head.raw(ds, dl, dr).tolist(), head.raw(ds, dl, dr[wrong]).tolist())
        if value > best["auc"]:
            best.update(auc=value, epoch=epoch, params=params)

    fit_contrastive(s, last, r, rank=rank, epochs=max_epochs, seed=seed, on_epoch=on_epoch)
    p = best["params"]
    head = RelevanceHead(p["A"], p["B"], p["C"], p["w"], np.array([1.0, 0.0]), {})
    pos, neg = head.raw(ds, dl, dr), head.raw(ds, dl, dr[wrong])
    head.calibration = fit_calibration(np.concatenate([pos, neg]),
                                       np.concatenate([np.ones(len(pos)), np.zeros(len(neg))]))
    cos_pos, cos_neg = np.sum(ds * dr, 1), np.sum(ds * dr[wrong], 1)
    prob_pos, prob_neg = head.proba(ds, dl, dr), head.proba(ds, dl, dr[wrong])
    table = {
        "auc_head": round(float(best["auc"]), 6),
        "auc_cosine": round(auc(cos_pos.tolist(), cos_neg.tolist()), 6),
        "mean_p_real": round(float(prob_pos.mean()), 6),
        "mean_p_mismatched": round(float(prob_neg.mean()), 6),
    }
    head.meta = {"feature_version": FEATURE_VERSION, "seed": seed, "rank": rank, "epochs": best["epoch"],
                 "max_epochs": max_epochs, "held_out_fraction": held_out, "train_rows": len(train),
                 "held_out_rows": len(dev), "held_out_conversations": len(held), "dev_table": table,
                 **(meta or {})}
    return RelevanceFit(head, table)
