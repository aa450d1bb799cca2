"""A learned tone head: does this reply answer a pleasant or an unpleasant situation?

A small writer sometimes picks the wrong valence ("That sounds like a dream come true." to a friend moving
abroad), and neither relevance nor the empathy levels see it: both reward a warm, on-topic sentence whatever
its tone. This head reads the tone of the reply alone.

Inputs are the unit MiniLM embedding ``r`` of a reply. The score is a logistic regression,
``P(pleasant) = sigmoid(w . r + b)``, fitted (L-BFGS, L2 with ``C``, deterministic) on the EmpatheticDialogues
pool's listener replies, each labelled by the tone its conversation's emotion asks for (``tone_valence``:
joyful, proud ... pleasant; sad, angry ... unpleasant; emotions whose situations go either way, such as
caring or surprised, are left out). A seeded fifth of the conversations is held out for the dev table.

``agreement(reply, valence)`` is the probability that the reply's tone is the one ``valence`` asks for: the
metric reports it as ``tone`` and the reply reward scales a candidate down when it falls below the program's
``tone_floor``.

The weights ship beside this module as ``tone_head.npz`` (no pickle); ``python -m trace_dspy.fit_tone`` refits
them from the ED pool.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from trace_dspy.core.files import ArrayLimits, MiB, load_header_npz, write_header_npz
from trace_dspy.optimize.empathy import normalize

FEATURE_VERSION = 2  # 2: labels from tone_valence (emotions that go either way left out)
WEIGHTS_FILE = Path(__file__).with_name("tone_head.npz")
WEIGHT_LIMITS = ArrayLimits(file_bytes=4 * MiB, member_bytes=4 * MiB, total_bytes=16 * MiB, members=4,
                            header_bytes=1 * MiB)
ARRAYS = ("w", "b")
VALENCES = ("positive", "negative")
DEFAULT_C = 1.0
# The tone each emotion asks a reply for. Ekman groups are too coarse here: in EmpatheticDialogues "caring"
# is often about a sick relative, "sentimental" and "nostalgic" about a loss, "surprised" about good and bad
# news alike. Those, and the other emotions whose conversations go either way, ask for no tone: the fit
# leaves their replies out, and a situation the prior reads as one of them counts as half pleasant.
PLEASANT_EMOTIONS = frozenset(("joyful", "excited", "proud", "grateful", "impressed", "content", "confident"))
UNPLEASANT_EMOTIONS = frozenset((
    "sad", "lonely", "disappointed", "devastated", "guilty", "ashamed", "embarrassed", "angry", "furious",
    "annoyed", "jealous", "afraid", "terrified", "anxious", "apprehensive", "disgusted"))


def tone_valence(emotion) -> str:
    """"positive", "negative", or "any" for an emotion whose situations go either way (or no label)."""
    label = str(emotion or "").strip().lower()
    if label in PLEASANT_EMOTIONS:
        return "positive"
    return "negative" if label in UNPLEASANT_EMOTIONS else "any"


def situation_pleasantness(candidates) -> float | None:
    """How pleasant a situation is, from (emotion, probability) pairs: the mass on pleasant emotions plus half
    the mass on emotions that go either way (None for no pairs)."""
    if not candidates:
        return None
    total = sum(p for _, p in candidates) or 1.0
    score = sum(p * {"positive": 1.0, "negative": 0.0}.get(tone_valence(e), 0.5) for e, p in candidates)
    return score / total

Encoder = Callable[[list[str]], np.ndarray]


class ToneError(RuntimeError):
    """The tone head cannot run: a missing or damaged weights file."""


@dataclass
class ToneHead:
    w: np.ndarray  # (d,) weights over the reply's unit embedding
    b: np.ndarray  # (1,) bias
    meta: dict[str, Any]

    def proba(self, r: np.ndarray) -> np.ndarray:
        """P(the reply answers a pleasant situation) for each row of embeddings ``r``."""
        return 1.0 / (1.0 + np.exp(-(r @ self.w + self.b[0])))

    def save(self, path: str | Path) -> Path:
        return write_header_npz(path, self.meta, {k: getattr(self, k) for k in ARRAYS})

    @classmethod
    def load(cls, path: str | Path) -> ToneHead:
        path = Path(path)
        meta, arrays = load_header_npz(path, ARRAYS, limits=WEIGHT_LIMITS, error=ToneError,
                                       what="tone head weights", hint=" (refit: python -m trace_dspy.fit_tone)")
        if arrays["w"].ndim != 1 or arrays["b"].shape != (1,):
            raise ToneError(f"{path}: the arrays' shapes do not fit together")
        if meta.get("feature_version") != FEATURE_VERSION:
            raise ToneError(f"{path}: made for feature version {meta.get('feature_version')}, this code computes "
                            f"version {FEATURE_VERSION}; refit with python -m trace_dspy.fit_tone")
        if not all(np.isfinite(v).all() for v in arrays.values()):
            raise ToneError(f"{path}: the weights hold non-finite values")
        return cls(arrays["w"].astype(np.float64), arrays["b"].astype(np.float64), meta)


def agreement(p_pleasant: float, valence: str) -> float | None:
    """How likely a reply with ``P(pleasant) = p_pleasant`` has the tone ``valence`` asks for; None for a
    valence with no tone ("any": no emotion label)."""
    if valence == "positive":
        return float(p_pleasant)
    if valence == "negative":
        return 1.0 - float(p_pleasant)
    return None


def soft_agreement(p_pleasant: float, q_pleasant: float) -> float:
    """The agreement of a reply with ``P(pleasant) = p_pleasant`` with a situation that is pleasant with
    probability ``q_pleasant``: the chance that the two are on the same side. Where the situation's valence is
    uncertain (q near 0.5), no tone disagrees much."""
    p, q = float(p_pleasant), min(1.0, max(0.0, float(q_pleasant)))
    return p * q + (1.0 - p) * (1.0 - q)


class ToneScorer:
    """P(pleasant) of replies from the shipped head (or ``weights``)."""

    def __init__(self, weights: str | Path | ToneHead | None = None, *, encode: Encoder | None = None):
        self.head = weights if isinstance(weights, ToneHead) else ToneHead.load(weights or WEIGHTS_FILE)
        if encode is None:
            from trace_dspy.optimize.similarity import embedder_encode

            encode = embedder_encode(ToneError, 'the tone head needs the "embed" extra')
        self._encode = encode

    @property
    def meta(self) -> dict[str, Any]:
        return dict(self.head.meta)

    def pleasant_batch(self, replies: Sequence[str]) -> list[float]:
        if not len(replies):
            return []
        r = np.asarray(self._encode([normalize(t) for t in replies]), dtype=np.float64)
        if r.shape[1] != self.head.w.shape[0]:
            raise ToneError(f"the head expects {self.head.w.shape[0]}-dim embeddings, got {r.shape[1]}")
        return [float(p) for p in self.head.proba(r)]

    def pleasant(self, reply: str) -> float:
        return self.pleasant_batch([reply])[0]

    def agreement(self, reply: str, valence: str) -> float | None:
        """P(the reply's tone is ``valence``'s); None when ``valence`` asks for none."""
        return None if valence not in VALENCES else agreement(self.pleasant(reply), valence)


def shared_tone() -> ToneScorer | None:
    """The process-wide head from the shipped weights; None without the ``embed`` extra."""
    from trace_dspy.optimize.similarity import shared_on_embedder

    return shared_on_embedder("tone", lambda encode: ToneScorer(encode=encode))


# ---------------------------------------------------------------- the fit on the ED pool


@dataclass
class ToneFit:
    head: ToneHead
    table: dict[str, float]


def tone_rows(samples) -> list[tuple[str, str, int]]:
    """(conversation key, listener reply, 1 pleasant / 0 unpleasant) per sample with a reply and a known emotion."""
    rows = []
    for sample in samples:
        valence = tone_valence(sample.emotion)
        if valence in VALENCES and sample.response.strip():
            rows.append((sample.split_key, sample.response, int(valence == "positive")))
    return rows


def fit_tone(rows: Sequence[tuple[str, str, int]], encode: Encoder, *, seed: int = 0, held_out: float = 0.2,
             c: float = DEFAULT_C, meta: dict[str, Any] | None = None) -> ToneFit:
    """Fit on (conversation key, reply, label) rows, conversations split (seeded); the dev table on the rest.

    The dev table: ``auc`` of P(pleasant) between held-out pleasant and unpleasant replies; ``auc_swap`` of a
    held-out reply's agreement with its own conversation's valence against the agreement of a reply from a
    conversation of the other valence with that same valence (the swapped-tone negative: the right words for
    the wrong situation); the mean agreement of each side, and the share of held-out replies on the right side
    of 0.5.
    """
    from trace_dspy.optimize.scorers import auc
    from trace_dspy.optimize.softmax import fit_softmax_lbfgs

    keys = sorted({r[0] for r in rows})
    if len(keys) < 10 or len({r[2] for r in rows}) < 2:
        raise ValueError(f"the tone fit needs at least 10 conversations of both valences, got {len(keys)}")
    random.Random(seed).shuffle(keys)
    held = set(keys[:max(2, round(len(keys) * held_out))])
    train = [r for r in rows if r[0] not in held]
    dev = [r for r in rows if r[0] in held]
    texts = list(dict.fromkeys(normalize(r[1]) for r in rows))
    vectors = np.asarray(encode(texts), dtype=np.float64)
    index = {t: i for i, t in enumerate(texts)}

    def embed(part):
        return vectors[[index[normalize(r[1])] for r in part]], np.array([r[2] for r in part])

    x, y = embed(train)
    weights, bias = fit_softmax_lbfgs(x, y, c=c, classes=2)
    head = ToneHead((weights[:, 1] - weights[:, 0]).astype(np.float64),
                    np.array([float(bias[1] - bias[0])]), {})
    dx, dy = embed(dev)
    p = head.proba(dx)
    own = np.where(dy == 1, p, 1 - p)
    # Each held-out reply's valence, answered by a reply from a conversation of the other valence (seeded).
    rng = np.random.default_rng(seed)
    pos, neg = np.flatnonzero(dy == 1), np.flatnonzero(dy == 0)
    other = np.where(dy == 1, rng.choice(neg, len(dy)), rng.choice(pos, len(dy)))
    swapped = np.where(dy == 1, p[other], 1 - p[other])
    table = {
        "auc": round(auc(p[dy == 1].tolist(), p[dy == 0].tolist()), 6),
        "auc_swap": round(auc(own.tolist(), swapped.tolist()), 6),
        "mean_agreement_own": round(float(own.mean()), 6),
        "mean_agreement_swapped": round(float(swapped.mean()), 6),
        "right_side_rate": round(float((own > 0.5).mean()), 6),
        "pleasant_share": round(float(dy.mean()), 6),
    }
    head.meta = {"feature_version": FEATURE_VERSION, "seed": seed, "c": c, "held_out_fraction": held_out,
                 "train_rows": len(train), "held_out_rows": len(dev), "held_out_conversations": len(held),
                 "dev_table": table, **(meta or {})}
    return ToneFit(head, table)
