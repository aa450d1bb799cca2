"""Which emotion prior a program gets for a data source: the one fitted on it, or the shipped one.

``compile`` and the uncompiled program on a data source both ask :func:`choose_prior`. It fits a prior on
the training side of the source's pool (plus the situations, when a file is named), scores it and the
prior shipped in the package on the same dev items (the pool's dev side, longest view), and keeps the
higher; a tie keeps the fitted one. A pool too small to fit a prior on (the seed set) gets the shipped
one. The choice is a :class:`PriorChoice`: the prior, where it came from, both dev scores, and a line
that says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from trace_dspy.core.console import heartbeat
from trace_dspy.data.sources import DEV_FRACTION


@dataclass
class PriorChoice:
    """The prior a program gets (None: the LM decides alone) and why."""

    prior: Any  # EmotionPrior | None
    source: str  # "fitted", "shipped" or "none"
    reason: str = ""
    fitted_dev: float | None = None
    shipped_dev: float | None = None
    dev_samples: int = 0
    notes: list[str] = field(default_factory=list)

    def record(self) -> dict[str, Any]:
        """What the artifact's manifest and the MLflow run keep about the prior."""
        from trace_dspy.program.emotion_prior import FILE_NAME

        if self.prior is None:
            return {"file": None, "source": "none", "reason": self.reason}
        out: dict[str, Any] = {"file": FILE_NAME, "source": self.source, **self.prior.describe()}
        if self.fitted_dev is not None and self.shipped_dev is not None:
            out["compared_on_dev"] = {"fitted": round(self.fitted_dev, 4), "shipped": round(self.shipped_dev, 4),
                                      "dev_samples": self.dev_samples}
        return out

    def summary(self) -> str:
        """One line for the console: which prior, and the scores that chose it."""
        if self.prior is None:
            return f"emotion prior: not used ({self.reason}); the LM decides the emotion alone"
        if self.fitted_dev is None or self.shipped_dev is None:
            line = f"emotion prior: the {self.source} one ({self.reason})"
        else:
            other = "shipped" if self.source == "fitted" else "fitted"
            mine = self.fitted_dev if self.source == "fitted" else self.shipped_dev
            theirs = self.shipped_dev if self.source == "fitted" else self.fitted_dev
            line = (f"emotion prior: kept the {self.source} one: dev accuracy {mine:.3f} against the {other} "
                    f"one's {theirs:.3f} on {self.dev_samples} dev items")
        return "; ".join([line, *self.notes])


def _shipped_overlap(shipped, source, seed: int) -> str | None:
    """A note when the shipped prior was fitted on part of this source's dev side."""
    meta = shipped.meta
    if meta.get("data_fingerprint") != source.fingerprint:
        return None
    same_split = meta.get("split_seed", 0) == seed and meta.get("dev_fraction", DEV_FRACTION) == DEV_FRACTION
    if same_split and not meta.get("refit_on_dev"):
        return None
    return ("note: the shipped prior was fitted on this pool with another split or with its dev side, so it "
            "has seen some of these dev items and its dev score is optimistic")


def _shipped_dev_accuracy(shipped, source, seed: int, texts, labels) -> float:
    """The shipped prior's accuracy on the dev items: read from its header when it was measured on the very
    same items (same data, split and dev side), else computed."""
    from trace_dspy.program.emotion_prior import accuracy, default_encoder

    meta = shipped.meta
    if (meta.get("data_fingerprint") == source.fingerprint and meta.get("split_seed") == seed
            and meta.get("dev_fraction") == DEV_FRACTION and isinstance(meta.get("dev_accuracy"), (int, float))
            and meta.get("dev_samples") == len(texts)):
        return float(meta["dev_accuracy"])
    return accuracy(shipped, [shipped.text_of(d) for d in texts], labels, default_encoder())["accuracy"]


def choose_prior(source, *, situations=None, seed: int = 0, prior_k: Any = "auto") -> PriorChoice:
    """The better of the prior fitted on ``source`` (and ``situations``) and the shipped one, on dev."""
    from trace_dspy.program.emotion_prior import MIN_TRAIN, PriorError, shipped_prior

    if prior_k == 0:
        return PriorChoice(None, "none", "prior_k = 0")
    try:
        shipped = shipped_prior()
    except PriorError as exc:
        shipped, shipped_error = None, str(exc)
    else:
        shipped_error = "this installation has no shipped prior"
    if len(source.pool) < MIN_TRAIN:
        reason = f"the pool has {len(source.pool)} samples, fewer than the {MIN_TRAIN} a prior needs"
        if shipped is None:
            return PriorChoice(None, "none", f"{reason}; {shipped_error}")
        return PriorChoice(shipped, "shipped", f"{reason}; dev accuracy {shipped.meta.get('dev_accuracy')} "
                                               "on the ED pool it was fitted on")
    # An L-BFGS fit and the embeddings of the whole pool: minutes on ED, with no count to report.
    with heartbeat("emotion prior") as phase:
        return _fit_and_compare(source, situations, seed, shipped, shipped_error, phase)


def _fit_and_compare(source, situations, seed: int, shipped, shipped_error: str, phase) -> PriorChoice:
    """The prior fitted on ``source`` (cached) against ``shipped`` on the pool's dev side; the better one."""
    from trace_dspy.data.sources import select_view, split_pool
    from trace_dspy.program.emotion_prior import PriorError, cached_prior

    phase.note("fitting (or reading the cached fit)")
    try:
        fitted = cached_prior(source, situations=situations, seed=seed, dev_fraction=DEV_FRACTION)
    except PriorError as exc:
        if shipped is None:
            return PriorChoice(None, "none", str(exc))
        return PriorChoice(shipped, "shipped", f"no prior could be fitted on this pool: {exc}")
    if shipped is None:
        return PriorChoice(fitted, "fitted", shipped_error)
    phase.note("scoring the shipped prior on dev")
    dev = select_view(split_pool(source, seed=seed)[1], "longest")
    texts, labels = [s.dialogue for s in dev], [s.emotion for s in dev]
    try:
        shipped_dev = _shipped_dev_accuracy(shipped, source, seed, texts, labels)
    except PriorError as exc:  # the embed extra vanished between the fit and now
        return PriorChoice(fitted, "fitted", f"the shipped prior could not be scored: {exc}")
    fitted_dev, shipped_dev = float(fitted.meta["dev_accuracy"]), round(shipped_dev, 4)  # as recorded
    notes = [n for n in (_shipped_overlap(shipped, source, seed),) if n]
    kept = (fitted, "fitted") if fitted_dev >= shipped_dev else (shipped, "shipped")
    return PriorChoice(*kept, fitted_dev=fitted_dev, shipped_dev=shipped_dev, dev_samples=len(texts),
                       notes=notes)


__all__ = ["PriorChoice", "choose_prior"]
