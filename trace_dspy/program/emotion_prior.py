"""A fitted emotion prior: the most likely labels for the speaker's words, without an LM call.

``recognize_emotion`` on a small model is near chance on the 32 ED labels. A
softmax regression over two views of the speaker's turns does far better:

- the all-MiniLM-L6-v2 sentence embedding (the ``embed`` extra), and
- an idf-weighted bag of the words seen in at least 3 training samples,

both unit-length and scaled by the same factor, in one linear model. ``compile``
fits it on the training side of the pool (never dev), picks the L2 strength on
dev, and stores it inside the artifact as ``emotion_prior.npz``: numpy arrays
and a JSON header, loaded with ``allow_pickle=False``. The program then gives
the stage the top-k labels with their probabilities as an input field; on a
grammar-constrained engine decoding may only choose among them (see
``trace_dspy.lm.engine.listed_choices``), on any other LM they are a hint.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from trace_dspy.core.dialogue import speaker_text
from trace_dspy.core.files import ArrayLimits, MiB
from trace_dspy.core.labels import EMOTIONS, ekman_group
from trace_dspy.optimize.empathy import normalize

# Version 2 embeds the speaker's words in the reward's spelling (optimize.empathy.normalize), so that the
# reply reward later finds the same text in the embedder's cache; version 1 embedded them as written.
FEATURE_VERSION = 2
READABLE_VERSIONS = (1, 2)
FILE_NAME = "emotion_prior.npz"
# Fewer training samples than this (the seed set has a few dozen) cannot cover 32 labels.
MIN_TRAIN = 200
MIN_DF = 3
# Bounds on a prior file (the shipped one inflates to about 0.4 MB; one fitted on a large pool, a few MB).
LIMITS = ArrayLimits(file_bytes=64 * MiB, member_bytes=64 * MiB, total_bytes=160 * MiB, members=8,
                     header_bytes=16 * MiB)
SCALE = 10.0  # both views are unit vectors; this sets the regularisation's reference scale
# The L2 strength: fitted on the ED pool with the grid (0.01, 0.03, 0.1), dev chose 0.03
# (dev accuracy 0.448), so the default grid is that one value; a wider grid costs one
# more fit per value.
L2_GRID = (0.03,)
ITERATIONS = 400

Encoder = Callable[[list[str]], np.ndarray]
_WORD = re.compile(r"[a-z']+")


class PriorError(ValueError):
    """The prior cannot be fitted or loaded; the message says why."""


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def prior_text(dialogue: str, feature_version: int = FEATURE_VERSION) -> str:
    """The speaker's turns of ``dialogue`` as a prior of ``feature_version`` reads them."""
    text = speaker_text(dialogue)
    return normalize(text) if feature_version >= 2 else text


def format_candidates(candidates: Sequence[tuple[str, float]]) -> str:
    """``sad (41%), lonely (22%)``: the field value the stage reads."""
    return ", ".join(f"{label} ({round(100 * p)}%)" for label, p in candidates)


@dataclass
class EmotionPrior:
    labels: tuple[str, ...]
    vocab: tuple[str, ...]
    idf: np.ndarray  # (V,)
    weights: np.ndarray  # (embedding_dim + V, C)
    bias: np.ndarray  # (C,)
    meta: dict[str, Any]

    # -- features and predictions ---------------------------------------------

    def bag(self, texts: Sequence[str]) -> np.ndarray:
        index = {w: i for i, w in enumerate(self.vocab)}
        out = np.zeros((len(texts), len(self.vocab)), np.float32)
        for row, text in enumerate(texts):
            for w in words(text):
                j = index.get(w)
                if j is not None:
                    out[row, j] = 1.0
        out *= self.idf
        out /= np.linalg.norm(out, axis=1, keepdims=True) + 1e-9
        return out

    def features(self, texts: Sequence[str], encode: Encoder) -> np.ndarray:
        texts = list(texts)
        return SCALE * np.hstack([np.asarray(encode(texts), np.float32), self.bag(texts)])

    def proba_texts(self, texts: Sequence[str], encode: Encoder) -> np.ndarray:
        logits = self.features(texts, encode) @ self.weights + self.bias
        logits -= logits.max(axis=1, keepdims=True)
        p = np.exp(logits)
        return p / p.sum(axis=1, keepdims=True)

    @property
    def feature_version(self) -> int:
        return int(self.meta.get("feature_version", FEATURE_VERSION))

    def text_of(self, dialogue: str) -> str:
        """The text this prior reads from a dialogue: the speaker's turns, spelled as its features expect."""
        return prior_text(dialogue, self.feature_version)

    def candidates(self, dialogue: str, k: int, encode: Encoder) -> list[tuple[str, float]]:
        """The ``k`` most likely labels for the speaker's turns of ``dialogue``, with probabilities."""
        p = self.proba_texts([self.text_of(dialogue)], encode)[0]
        order = np.argsort(-p, kind="stable")[:k]
        return [(self.labels[i], float(p[i])) for i in order]

    # -- files ----------------------------------------------------------------

    def save(self, path: str | os.PathLike) -> Path:
        path = Path(path)
        header = {**self.meta, "labels": list(self.labels), "vocab": list(self.vocab),
                  "feature_version": self.feature_version}
        raw = np.frombuffer(json.dumps(header, sort_keys=True).encode(), dtype=np.uint8)
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "wb") as fh:
            np.savez_compressed(fh, idf=self.idf, weights=self.weights, bias=self.bias, header=raw)
        os.replace(tmp, path)
        return path

    @classmethod
    def load(cls, path: str | os.PathLike, *, root: str | os.PathLike | None = None) -> EmotionPrior:
        """Read a saved prior, checking the file (kind, size, each array's size and dtype) before inflating it.

        ``root``: the folder the file must stay inside (an artifact's). Any problem is a ``PriorError``
        naming the file.
        """
        from trace_dspy.core.files import FileCheckError, check_finite, read_header_npz

        path = Path(path)
        try:
            header, arrays = read_header_npz(path, ("idf", "weights", "bias"), limits=LIMITS, root=root)
            check_finite(path, arrays)
        except FileCheckError as exc:
            if exc.missing:
                raise PriorError(f"emotion prior not found: {path}") from None
            raise PriorError(f"{exc.path}: damaged emotion prior: {exc.reason}") from None
        version = header.get("feature_version")
        if isinstance(version, bool) or version not in READABLE_VERSIONS:
            raise PriorError(f"{path}: made for feature version {version!r}, this code "
                             f"reads versions {', '.join(map(str, READABLE_VERSIONS))}; recompile to refit it")
        labels, vocab = header.pop("labels", None), header.pop("vocab", None)
        for key, value in (("labels", labels), ("vocab", vocab)):
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise PriorError(f"{path}: header {key}: expected a list of text")
        labels, vocab = tuple(labels), tuple(vocab)
        if not labels or set(labels) - set(EMOTIONS):
            raise PriorError(f"{path}: header labels: expected emotion labels, found {', '.join(labels)[:200]!r}")
        w = arrays["weights"]
        if (arrays["idf"].shape != (len(vocab),) or arrays["bias"].shape != (len(labels),) or w.ndim != 2
                or w.shape[1] != len(labels) or w.shape[0] <= len(vocab)):
            raise PriorError(f"{path}: the arrays' shapes do not fit together")
        return cls(labels, vocab, arrays["idf"].astype(np.float32), w.astype(np.float32),
                   arrays["bias"].astype(np.float32), header)

    def describe(self) -> dict[str, Any]:
        keys = ("dev_accuracy", "dev_group_accuracy", "dev_top3", "l2", "train_samples", "dev_samples",
                "refit_on_dev", "data_fingerprint", "fit_seconds", "feature_version")
        return {k: self.meta[k] for k in keys if k in self.meta}


# ---------------------------------------------------------------- fitting


def accuracy(prior: EmotionPrior, texts: Sequence[str], gold: Sequence[str], encode: Encoder,
             p: np.ndarray | None = None) -> dict[str, float]:
    """Top-1 label and group accuracy and top-3 recall of the prior on ``texts``."""
    p = prior.proba_texts(texts, encode) if p is None else p
    top = np.argsort(-p, axis=1, kind="stable")
    pred = [prior.labels[i] for i in top[:, 0]]
    n = max(1, len(gold))
    return {"accuracy": sum(a == g for a, g in zip(pred, gold)) / n,
            "group_accuracy": sum(ekman_group(a) == ekman_group(g) for a, g in zip(pred, gold)) / n,
            "top3": sum(g in {prior.labels[i] for i in row[:3]} for row, g in zip(top, gold)) / n}


def fit_prior(train_texts: Sequence[str], train_labels: Sequence[str], dev_texts: Sequence[str],
              dev_labels: Sequence[str], encode: Encoder, *, data_fingerprint: str = "",
              l2_grid: Sequence[float] = L2_GRID, refit_on_dev: bool = False) -> EmotionPrior:
    """Fit on the training texts (the speaker's turns) and keep the L2 strength best on dev.

    ``refit_on_dev``: once dev has chosen the L2 strength, fit again on train and dev together (the
    recorded dev accuracies stay those of the train-only fit, the last ones dev could measure). Only
    for a prior whose users never evaluate on that dev side, such as the one shipped in the package.
    Deterministic: the optimiser starts from zero, so the same data give the same prior.
    """
    from trace_dspy.optimize.empathy import fit_softmax

    if len(train_texts) != len(train_labels) or len(dev_texts) != len(dev_labels):
        raise PriorError("texts and labels differ in length")
    if len(train_texts) < MIN_TRAIN:
        raise PriorError(f"{len(train_texts)} training samples; the prior needs at least {MIN_TRAIN}")
    if not dev_texts:
        raise PriorError("the prior needs dev samples to choose its regularisation")
    started = time.perf_counter()
    labels = tuple(e for e in EMOTIONS if e in set(train_labels))
    df = Counter(w for text in train_texts for w in set(words(text)))
    vocab = tuple(sorted(w for w, c in df.items() if c >= MIN_DF))
    idf = np.log(len(train_texts) / np.array([df[w] for w in vocab], dtype=np.float64)).astype(np.float32)
    shell = EmotionPrior(labels, vocab, idf, np.zeros((0, len(labels)), np.float32),
                         np.zeros(len(labels), np.float32), {})
    x_train = shell.features(train_texts, encode)
    x_dev = shell.features(dev_texts, encode)
    y = np.array([labels.index(e) for e in train_labels])
    best = None
    for l2 in l2_grid:
        w, b = fit_softmax(x_train, y, l2=l2, iterations=ITERATIONS, classes=len(labels))
        prior = EmotionPrior(labels, vocab, idf, w, b, {"l2": l2})
        logits = x_dev @ w + b
        scores = accuracy(prior, dev_texts, dev_labels, encode, p=np.exp(logits - logits.max(1, keepdims=True)))
        if best is None or scores["accuracy"] > best[1]["accuracy"]:
            best = (prior, scores)
    prior, scores = best
    n_train = len(train_texts)
    if refit_on_dev:
        # The vocabulary and idf stay the train side's: the features dev chose the strength for. A dev
        # label that training never saw has no output to learn; those samples are left out.
        keep = [i for i, e in enumerate(dev_labels) if e in labels]
        y_all = np.concatenate([y, [labels.index(dev_labels[i]) for i in keep]]).astype(int)
        w, b = fit_softmax(np.vstack([x_train, x_dev[keep]]), y_all, l2=prior.meta["l2"],
                           iterations=ITERATIONS, classes=len(labels))
        prior = EmotionPrior(labels, vocab, idf, w, b, dict(prior.meta))
        n_train += len(keep)
    prior.meta.update(dev_accuracy=round(scores["accuracy"], 4), dev_group_accuracy=round(scores["group_accuracy"], 4),
                      dev_top3=round(scores["top3"], 4), train_samples=n_train, dev_samples=len(dev_texts),
                      refit_on_dev=refit_on_dev, data_fingerprint=data_fingerprint, embedder="all-MiniLM-L6-v2",
                      l2_grid=list(l2_grid), feature_version=FEATURE_VERSION,
                      fit_seconds=round(time.perf_counter() - started, 1))
    return prior


def fit_from_source(source, *, seed: int = 0, dev_fraction: float = 0.2, encode: Encoder | None = None,
                    refit_on_dev: bool = False) -> EmotionPrior:
    """Fit on a data source's pool: every training-side sample, dev chosen the way ``load_splits`` does.

    ``refit_on_dev`` (see :func:`fit_prior`) is for the shipped prior only: a compile evaluates on that dev.
    Raises PriorError when the pool is too small or the ``embed`` extra is missing.
    """
    from trace_dspy.data.sources import partition_by_conversation, select_view

    if encode is None:
        encode = default_encoder()
    train, dev = partition_by_conversation(source.pool, dev_fraction, seed=seed)
    dev = select_view(dev, "longest")
    return fit_prior([prior_text(s.dialogue) for s in train], [s.emotion for s in train],
                     [prior_text(s.dialogue) for s in dev], [s.emotion for s in dev], encode,
                     data_fingerprint=source.fingerprint, refit_on_dev=refit_on_dev)


# The prior that ships in the package: fitted on the ED valid pool's training side (seed 0), its L2
# strength chosen on the dev side, then refitted on both (no compile evaluates on ED data with it) by
#     python -m trace_dspy.fit_prior --data ../shared/data/empathetic_dialogues
# It stands in where the data cannot carry a prior of their own (the seed set has a few dozen samples).
SHIPPED = Path(__file__).with_name(FILE_NAME)


def shipped_prior() -> EmotionPrior | None:
    """The packaged prior, or None when the package was built without it."""
    return EmotionPrior.load(SHIPPED) if SHIPPED.is_file() else None


MISSING_EMBED = 'the emotion prior needs the "embed" extra (pip install -e ".[embed]")'


def default_encoder() -> Encoder:
    from trace_dspy.optimize.similarity import get_embedder

    embedder = get_embedder()
    if embedder is None:
        raise PriorError(MISSING_EMBED)
    return embedder.encode


def prior_cache_dir() -> Path:
    base = os.environ.get("TRACE_DSPY_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "trace-dspy")
    return Path(base) / "emotion-prior"


def cached_prior_path(source, *, seed: int = 0, dev_fraction: float = 0.2) -> Path:
    key = json.dumps([source.fingerprint, seed, dev_fraction, FEATURE_VERSION, list(L2_GRID)])
    return prior_cache_dir() / f"{hashlib.sha256(key.encode()).hexdigest()[:20]}.npz"


def cached_prior(source, *, seed: int = 0, dev_fraction: float = 0.2) -> EmotionPrior:
    """:func:`fit_from_source`, fitted once per data fingerprint and split and reused after."""
    path = cached_prior_path(source, seed=seed, dev_fraction=dev_fraction)
    if path.is_file():
        try:
            return EmotionPrior.load(path)
        except PriorError:
            pass  # damaged cache entry: refit it
    prior = fit_from_source(source, seed=seed, dev_fraction=dev_fraction)
    path.parent.mkdir(parents=True, exist_ok=True)
    prior.save(path)
    return prior




__all__ = ["EmotionPrior", "FILE_NAME", "PriorError", "cached_prior", "fit_from_source", "fit_prior",
           "format_candidates", "shipped_prior"]


