"""A fitted emotion prior: the most likely labels for the speaker's words, without an LM call.

``recognize_emotion`` on a small model is near chance on the 32 ED labels. A
softmax regression over two views of the speaker's turns does far better:

- the all-MiniLM-L6-v2 sentence embedding (the ``embed`` extra), and
- a TF-IDF bag of the words and word pairs seen in at least 3 training texts
  (sublinear term counts, unit length),

side by side in one linear model (:class:`FeatureSpec` says how each view is
weighted). It learns from the training side of the pool and, when a situations
file is given (:mod:`trace_dspy.data.situations`), from the ED train split's
17.8k labelled situation prompts as well. Dev picks the regularisation and a
temperature that calibrates the probabilities. ``compile`` stores the prior
inside the artifact as ``emotion_prior.npz``: numpy arrays and a JSON header,
loaded with ``allow_pickle=False``. The program gives the stage the top-k labels
with their probabilities as an input field; on a grammar-constrained engine
decoding may only choose among them (see ``trace_dspy.lm.grammar.listed_choices``),
on any other LM they are a hint.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np

from trace_dspy.core import env
from trace_dspy.core.dialogue import speaker_text
from trace_dspy.core.extras import install_hint
from trace_dspy.core.files import ArrayLimits, MiB, load_header_npz, write_header_npz
from trace_dspy.core.labels import EMOTIONS, ekman_group
from trace_dspy.data.sources import DEV_FRACTION
from trace_dspy.optimize.empathy import normalize

# Version 2 embeds the speaker's words in the reward's spelling (optimize.empathy.normalize), so that the
# reply reward later finds the same text in the embedder's cache; version 1 embedded them as written.
# Version 3 adds word pairs, sublinear TF-IDF, per-view weights and a temperature (all in the header).
FEATURE_VERSION = 3
READABLE_VERSIONS = (1, 2, 3)
FILE_NAME = "emotion_prior.npz"
# Fewer training samples than this (the seed set has a few dozen) cannot cover 32 labels.
MIN_TRAIN = 200
MIN_DF = 3
# Bounds on a prior file (the shipped one inflates to about 4 MB; one fitted on a large pool, tens of MB).
LIMITS = ArrayLimits(file_bytes=64 * MiB, member_bytes=128 * MiB, total_bytes=160 * MiB, members=8,
                     header_bytes=16 * MiB)
# The inverse L2 strength, in scikit-learn's convention (sum of losses + |W|^2 / 2C). Tuned on the dev side of
# the ED pool's seed-0 split with the situations (docs/results/emotion.md, "Variants tried"): C = 1 beat 0.5, 2, 3 and 10.
C_GRID = (1.0,)
TEMPERATURES = tuple(float(t) for t in np.round(np.geomspace(0.5, 4.0, 22), 3))

Encoder = Callable[[list[str]], np.ndarray]
_WORD = re.compile(r"[a-z']+")


class PriorError(ValueError):
    """The prior cannot be fitted or loaded; the message says why."""


@dataclass(frozen=True)
class FeatureSpec:
    """How a prior turns text into features: ``embed_weight * embedding | bag_weight * bag``."""

    embed_weight: float
    bag_weight: float
    ngrams: int  # 1: words; 2: words and adjacent word pairs
    tf: str  # "binary" (a term is there or not) or "sublinear" (1 + log count)

    @classmethod
    def of(cls, meta: dict[str, Any], version: int) -> FeatureSpec:
        if version < 3:
            return LEGACY_SPEC
        raw = meta.get("features")
        try:
            spec = cls(float(raw["embed_weight"]), float(raw["bag_weight"]), int(raw["ngrams"]), str(raw["tf"]))
        except (TypeError, KeyError, ValueError):
            raise PriorError(f"header features: expected embed_weight, bag_weight, ngrams and tf, found {raw!r}"
                             ) from None
        if spec.tf not in ("binary", "sublinear") or spec.ngrams not in (1, 2):
            raise PriorError(f"header features: unknown tf {spec.tf!r} or ngrams {spec.ngrams!r}")
        return spec


# Versions 1 and 2: both views scaled by 10, a binary bag of words.
LEGACY_SPEC = FeatureSpec(embed_weight=10.0, bag_weight=10.0, ngrams=1, tf="binary")
# Tuned on dev (docs/results/emotion.md, "Variants tried"): the embedding at half the bag's weight beat equal weights.
SPEC = FeatureSpec(embed_weight=0.5, bag_weight=1.0, ngrams=2, tf="sublinear")


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def terms(text: str, ngrams: int) -> list[str]:
    """The words of ``text`` and, for ``ngrams == 2``, its adjacent word pairs (``"lost job"``)."""
    w = words(text)
    return w + [f"{a} {b}" for a, b in pairwise(w)] if ngrams >= 2 else w


def prior_text(dialogue: str, feature_version: int = FEATURE_VERSION) -> str:
    """The speaker's turns of ``dialogue`` as a prior of ``feature_version`` reads them."""
    text = speaker_text(dialogue)
    return normalize(text) if feature_version >= 2 else text


def format_candidates(candidates: Sequence[tuple[str, float]]) -> str:
    """``sad (41%), lonely (22%)``: the field value the stage reads."""
    return ", ".join(f"{label} ({round(100 * p)}%)" for label, p in candidates)


def _softmax(logits: np.ndarray) -> np.ndarray:
    logits = logits - logits.max(axis=1, keepdims=True)
    p = np.exp(logits)
    return p / p.sum(axis=1, keepdims=True)


@dataclass
class EmotionPrior:
    labels: tuple[str, ...]
    vocab: tuple[str, ...]
    idf: np.ndarray  # (V,)
    weights: np.ndarray  # (embedding_dim + V, C)
    bias: np.ndarray  # (C,)
    meta: dict[str, Any]

    # -- features and predictions ---------------------------------------------

    @property
    def feature_version(self) -> int:
        return int(self.meta.get("feature_version", FEATURE_VERSION))

    @property
    def spec(self) -> FeatureSpec:
        return FeatureSpec.of(self.meta, self.feature_version)

    @property
    def temperature(self) -> float:
        return float(self.meta.get("temperature", 1.0))

    def bag_rows(self, texts: Sequence[str]) -> list[tuple[np.ndarray, np.ndarray]]:
        """Each text's bag as (vocabulary indices, unit-length idf-weighted values)."""
        index = self.__dict__.get("_index")
        if index is None:
            index = self.__dict__["_index"] = {w: i for i, w in enumerate(self.vocab)}
        spec, rows = self.spec, []
        for text in texts:
            counts = Counter(t for t in terms(text, spec.ngrams) if t in index)
            idx = np.fromiter((index[t] for t in counts), dtype=np.int64, count=len(counts))
            tf = np.fromiter(counts.values(), dtype=np.float64, count=len(counts))
            values = (1.0 + np.log(tf) if spec.tf == "sublinear" else np.ones_like(tf)) * self.idf[idx]
            rows.append((idx, values / (np.linalg.norm(values) + 1e-9)))
        return rows

    def bag_matrix(self, texts: Sequence[str]):
        """The bags of ``texts`` as a scipy CSR matrix ``(len(texts), V)``."""
        from scipy.sparse import csr_matrix

        rows = self.bag_rows(texts)
        indptr = np.cumsum([0] + [len(i) for i, _ in rows])
        indices = np.concatenate([i for i, _ in rows]) if rows else np.zeros(0, np.int64)
        values = np.concatenate([v for _, v in rows]) if rows else np.zeros(0)
        return csr_matrix((values, indices, indptr), shape=(len(rows), len(self.vocab)))

    def logits(self, texts: Sequence[str], encode: Encoder, *, calibrated: bool = True) -> np.ndarray:
        texts = list(texts)
        spec = self.spec
        embedded = np.asarray(encode(texts), np.float32)
        dim = self.weights.shape[0] - len(self.vocab)
        out = spec.embed_weight * (embedded @ self.weights[:dim]) + self.bias
        for row, (idx, values) in enumerate(self.bag_rows(texts)):
            out[row] += spec.bag_weight * (values.astype(np.float32) @ self.weights[dim + idx])
        return out / self.temperature if calibrated else out

    def proba_texts(self, texts: Sequence[str], encode: Encoder) -> np.ndarray:
        return _softmax(self.logits(texts, encode))

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
        header = {**self.meta, "labels": list(self.labels), "vocab": list(self.vocab),
                  "feature_version": self.feature_version}
        # Half precision halves the file; the predictions it changes are ties to three decimals.
        return write_header_npz(path, header, {"idf": self.idf.astype(np.float32),
                                               "weights": self.weights.astype(np.float16),
                                               "bias": self.bias.astype(np.float32)})

    @classmethod
    def load(cls, path: str | os.PathLike, *, root: str | os.PathLike | None = None) -> EmotionPrior:
        """Read a saved prior, checking the file (kind, size, each array's size and dtype) before inflating it.

        ``root``: the folder the file must stay inside (an artifact's). Any problem is a ``PriorError``
        naming the file.
        """
        path = Path(path)
        header, arrays = load_header_npz(path, ("idf", "weights", "bias"), limits=LIMITS, root=root, finite=True,
                                         error=PriorError, what="emotion prior")
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
        try:
            FeatureSpec.of(header, version)
            temperature = float(header.get("temperature", 1.0))
        except (PriorError, TypeError, ValueError) as exc:
            raise PriorError(f"{path}: {exc}") from None
        if not 0 < temperature < 100:
            raise PriorError(f"{path}: header temperature: expected a number between 0 and 100, found {temperature}")
        return cls(labels, vocab, arrays["idf"].astype(np.float32), w.astype(np.float32),
                   arrays["bias"].astype(np.float32), header)

    def describe(self) -> dict[str, Any]:
        keys = ("dev_accuracy", "dev_group_accuracy", "dev_top3", "c", "l2", "temperature", "train_samples",
                "dialogue_samples", "situation_samples", "dev_samples", "refit_on_dev", "data_fingerprint",
                "situations_fingerprint", "fit_seconds", "feature_version")
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


@dataclass(frozen=True)
class TrainingSet:
    """What a prior learns from: dialogue texts, then situation texts, with their labels."""

    texts: tuple[str, ...]
    labels: tuple[str, ...]
    situations: int = 0  # how many of the texts (the last ones) are situations

    @classmethod
    def of(cls, texts: Sequence[str], labels: Sequence[str], situations=None) -> TrainingSet:
        """``texts`` (dialogue texts) plus the situations (a ``data.situations.Situations``), if any."""
        extra_t = [normalize(t) for t in situations.texts] if situations is not None else []
        extra_l = list(situations.labels) if situations is not None else []
        return cls(tuple(texts) + tuple(extra_t), tuple(labels) + tuple(extra_l), len(extra_t))


def _half(w: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The weights at the half precision they are saved in (see ``save``): what dev scores is what a reload gives."""
    return w.astype(np.float16).astype(np.float32), b


def _calibrate(logits: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """The temperature (of :data:`TEMPERATURES`) with the lowest mean negative log-likelihood on dev."""
    best = (float("inf"), 1.0)
    for t in TEMPERATURES:
        z = logits / t
        z = z - z.max(axis=1, keepdims=True)
        nll = float(np.mean(np.log(np.exp(z).sum(axis=1)) - z[np.arange(len(y)), y]))
        best = min(best, (nll, t))
    return best[1], best[0]


def _best_c(shell: EmotionPrior, x_train, y: np.ndarray, x_dev, dev_texts: Sequence[str], dev_labels: Sequence[str],
            encode: Encoder, c_grid: Sequence[float]):
    """(C, (weights, bias), dev scores, dev logits) of the fit that scores best on dev; the first C wins a tie."""
    from trace_dspy.optimize.softmax import fit_softmax_lbfgs

    best = None
    for c in c_grid:
        w, b = _half(*fit_softmax_lbfgs(x_train, y, c=c, classes=len(shell.labels)))
        logits = np.asarray(x_dev @ w) + b
        scores = accuracy(shell, dev_texts, dev_labels, encode, p=_softmax(logits))
        if best is None or scores["accuracy"] > best[2]["accuracy"]:
            best = (c, (w, b), scores, logits)
    return best


def fit_prior(train: TrainingSet, dev_texts: Sequence[str], dev_labels: Sequence[str], encode: Encoder, *,
              meta: dict[str, Any] | None = None, c_grid: Sequence[float] = C_GRID, spec: FeatureSpec = SPEC,
              min_df: int = MIN_DF, refit_on_dev: bool = False) -> EmotionPrior:
    """Fit on ``train``, keep the C best on dev, and calibrate a temperature on dev.

    ``refit_on_dev``: once dev has chosen C and the temperature, fit again on train and dev together (the
    recorded dev scores stay those of the train-only fit, the last ones dev could measure). Only for a
    prior whose users never evaluate on that dev side. ``meta`` goes into the header (fingerprints).
    Deterministic: the optimiser starts from zero and has no randomness.
    """
    from scipy.sparse import csr_matrix, hstack, vstack

    from trace_dspy.optimize.softmax import fit_softmax_lbfgs

    if len(train.texts) != len(train.labels) or len(dev_texts) != len(dev_labels):
        raise PriorError("texts and labels differ in length")
    if len(train.texts) < MIN_TRAIN:
        raise PriorError(f"{len(train.texts)} training samples; the prior needs at least {MIN_TRAIN}")
    if not dev_texts:
        raise PriorError("the prior needs dev samples to choose its regularisation")
    started = time.perf_counter()
    labels = tuple(e for e in EMOTIONS if e in set(train.labels))
    df = Counter(t for text in train.texts for t in set(terms(text, spec.ngrams)))
    vocab = tuple(sorted(t for t, c in df.items() if c >= min_df))
    n = len(train.texts)
    idf = (np.log((1 + n) / (1 + np.array([df[t] for t in vocab], dtype=np.float64))) + 1).astype(np.float32)
    header = {"feature_version": FEATURE_VERSION, "features": asdict(spec)}
    shell = EmotionPrior(labels, vocab, idf, np.zeros((1 + len(vocab), len(labels)), np.float32),
                         np.zeros(len(labels), np.float32), header)

    def features(texts):
        return hstack([csr_matrix(spec.embed_weight * np.asarray(encode(list(texts)), np.float64)),
                       spec.bag_weight * shell.bag_matrix(texts)]).tocsr()

    x_train, x_dev = features(train.texts), features(dev_texts)
    y = np.array([labels.index(e) for e in train.labels])
    c, (w, b), scores, logits = _best_c(shell, x_train, y, x_dev, dev_texts, dev_labels, encode, c_grid)
    seen = [i for i, e in enumerate(dev_labels) if e in labels]  # a label training never saw has no output
    y_dev = np.array([labels.index(dev_labels[i]) for i in seen], dtype=int)
    temperature, dev_nll = _calibrate(logits[seen], y_dev) if seen else (1.0, float("nan"))
    n_train = n
    if refit_on_dev and seen:
        # The vocabulary and idf stay the train side's: the features dev chose C for.
        w, b = _half(*fit_softmax_lbfgs(vstack([x_train, x_dev[seen]]).tocsr(), np.concatenate([y, y_dev]), c=c,
                                        classes=len(labels)))
        n_train += len(seen)
    prior = EmotionPrior(labels, vocab, idf, w, b, {
        **(meta or {}), **header, "c": c, "c_grid": list(c_grid), "temperature": temperature,
        "dev_nll": round(dev_nll, 4), "dev_accuracy": round(scores["accuracy"], 4),
        "dev_group_accuracy": round(scores["group_accuracy"], 4), "dev_top3": round(scores["top3"], 4),
        "train_samples": n_train, "dialogue_samples": n - train.situations, "situation_samples": train.situations,
        "dev_samples": len(dev_texts), "refit_on_dev": refit_on_dev, "embedder": "all-MiniLM-L6-v2",
        "fit_seconds": round(time.perf_counter() - started, 1)})
    return prior


def fit_from_source(source, *, situations=None, seed: int = 0, dev_fraction: float = DEV_FRACTION,
                    encode: Encoder | None = None, refit_on_dev: bool = False) -> EmotionPrior:
    """Fit on a data source's pool (every training-side sample, dev chosen the way ``load_splits`` does)
    and on ``situations`` (a ``data.situations.Situations``) when given.

    Raises PriorError when the pool is too small or the ``embed`` extra is missing.
    """
    from trace_dspy.data.sources import select_view, split_pool

    if encode is None:
        encode = default_encoder()
    train, dev = split_pool(source, seed=seed, dev_fraction=dev_fraction)
    dev = select_view(dev, "longest")
    meta = {"data_fingerprint": source.fingerprint, "split_seed": seed, "dev_fraction": dev_fraction}
    if situations is not None:
        meta["situations_fingerprint"] = situations.fingerprint
    return fit_prior(TrainingSet.of([prior_text(s.dialogue) for s in train], [s.emotion for s in train], situations),
                     [prior_text(s.dialogue) for s in dev], [s.emotion for s in dev], encode, meta=meta,
                     refit_on_dev=refit_on_dev)


# The prior that ships in the package: fitted on the ED valid pool's training side (seed 0) and the ED train
# split's situations, its C and temperature chosen on the dev side, by
#     python -m trace_dspy.fit_prior --data ../shared/data/empathetic_dialogues \
#         --situations ../shared/data/empathetic_dialogues_situations/train.csv
# It is not refitted on that dev side, so that a compile on ED can compare it fairly with the prior it fits.
# It stands in where the data cannot carry a prior of their own (the seed set has a few dozen samples).
SHIPPED = Path(__file__).with_name(FILE_NAME)


def shipped_prior() -> EmotionPrior | None:
    """The packaged prior, or None when the package was built without it."""
    return EmotionPrior.load(SHIPPED) if SHIPPED.is_file() else None


MISSING_EMBED = f'the emotion prior needs the "embed" extra ({install_hint("embed")})'


def default_encoder() -> Encoder:
    from trace_dspy.optimize.similarity import get_embedder

    embedder = get_embedder()
    if embedder is None:
        raise PriorError(MISSING_EMBED)
    return embedder.encode


def prior_cache_dir() -> Path:
    return env.cache_dir("emotion-prior")


def cached_prior_path(source, *, situations=None, seed: int = 0, dev_fraction: float = DEV_FRACTION) -> Path:
    key = json.dumps([source.fingerprint, situations.fingerprint if situations is not None else None, seed,
                      dev_fraction, FEATURE_VERSION, list(C_GRID), asdict(SPEC), MIN_DF])
    return prior_cache_dir() / f"{hashlib.sha256(key.encode()).hexdigest()[:20]}.npz"


def cached_prior(source, *, situations=None, seed: int = 0, dev_fraction: float = DEV_FRACTION) -> EmotionPrior:
    """:func:`fit_from_source`, fitted once per data (and situations) fingerprint and split, reused after."""
    path = cached_prior_path(source, situations=situations, seed=seed, dev_fraction=dev_fraction)
    if path.is_file():
        try:
            return EmotionPrior.load(path)
        except PriorError:
            pass  # damaged cache entry: refit it
    prior = fit_from_source(source, situations=situations, seed=seed, dev_fraction=dev_fraction)
    path.parent.mkdir(parents=True, exist_ok=True)
    prior.save(path)
    return prior


__all__ = [
    "FILE_NAME",
    "EmotionPrior",
    "FeatureSpec",
    "PriorError",
    "TrainingSet",
    "cached_prior",
    "fit_from_source",
    "fit_prior",
    "format_candidates",
    "shipped_prior",
]


