"""Fit the scaffolded reply's openers: the compile's own parameter for a small writer.

With ``reply_format = "scaffold"`` each sentence of a reply is begun with an
opener ("That sounds", "You must be feeling", ...) that the model goes on from.
Which openers a small model continues best, and which suit pleasant or
unpleasant news, is a question for data, not taste. ``fit_openers`` answers it
on the training dialogues:

1. each dialogue runs through the program once (one greedy reply, stock
   openers), which fixes the emotion, the cause and the plan;
2. for each sentence of that plan, every opener of the mechanism's pool
   (``trace_dspy.compact.openers.OPENER_POOL``) writes the reply again in its place,
   the other sentence keeping its stock opener, and the metric scores it
   against the dialogue's gold (the same metric the optimizer uses);
3. per mechanism, the openers are ranked by their mean score, separately for
   dialogues whose recognized emotion is pleasant (happiness, surprise) or
   unpleasant, each valence's means shrunk towards the opener's mean over all
   dialogues (``shrink`` pseudo-dialogues), so that a handful of dialogues
   cannot reorder much. An opener with a tone ("Oh no, that sounds", "Wow,
   that"; ``TONED_OPENERS``) is tried and ranked only for its own valence,
   and the "any" ranking (an emotion outside the labels) takes neutral ones.

The best ``keep`` openers of each mechanism become the first reply's and the
further Best-of-N candidates' openers, in order. They are saved in the
artifact's manifest (``reply_openers``) with the scores they were chosen by.
"""

from __future__ import annotations

import dataclasses
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import dspy

from trace_dspy.core.console import progress
from trace_dspy.compact.openers import (
    OPENER_POOL,
    SCAFFOLD_OPENERS,
    emotion_valence,
    opener_suits,
    scaffold_kinds,
)

KEEP = 3  # as many as the stock openers: the first reply's and two further candidates'
SHRINK = 4.0
MIN_ITEMS = 4
# A mechanism planned for fewer training dialogues than this keeps its stock openers: on 16 ED dialogues ER was
# planned once, and one dialogue would have chosen its openers for every valence.
MIN_TRIALS = 3


@dataclass
class OpenerFit:
    """The fitted openers (valence -> mechanism -> openers, best first) and what they were chosen by."""

    openers: dict[str, dict[str, tuple[str, ...]]]
    scores: list[dict[str, Any]]
    items: int
    replies: int
    failed: int
    seconds: float

    def record(self) -> dict[str, Any]:
        """For the manifest: the openers, and each candidate opener's mean score and count per valence."""
        return {"openers": {v: {k: list(o) for k, o in table.items()} for v, table in self.openers.items()},
                "items": self.items, "replies": self.replies, "failed": self.failed,
                "seconds": round(self.seconds, 1), "scores": self.scores}


def _trial(kind: str, opener: str, twice: bool) -> dict[str, dict[str, tuple[str, ...]]]:
    """Openers that put ``opener`` in ``kind``'s first sentence and leave everything else stock."""
    if twice:  # a one-mechanism plan: its second sentence takes the next opener, a stock one that differs
        return {"any": {kind: (opener, next(o for o in SCAFFOLD_OPENERS[kind] if o != opener))}}
    return {"any": {kind: (opener,)}}


def _is_stock(kind: str, opener: str, twice: bool) -> bool:
    """Would this trial write the reply the stock openers write?"""
    return opener == SCAFFOLD_OPENERS[kind][0] and (not twice or SCAFFOLD_OPENERS[kind][1] != opener)


def fit_openers(program, trainset: Sequence[dspy.Example], metric, *, pool: dict | None = None, keep: int = KEEP,
                shrink: float = SHRINK, log: Callable[[str], None] | None = None) -> OpenerFit | None:
    """Rank each mechanism's openers by ``metric`` on ``trainset``; None when too few dialogues could be scored.

    ``program`` is a TraceProgram whose reply stage is scaffolded; it is not
    changed (the trials run on a copy, one greedy reply each, no Best-of-N).
    A reply that fails is skipped and counted.
    """
    log = log or (lambda message: None)
    pool = pool or OPENER_POOL
    started = time.perf_counter()
    base = program.deepcopy()
    base.config = dataclasses.replace(program.config, best_of=1)
    base.reply_openers = None
    fields = list(base.generate_response.signature.input_fields)
    # (kind, opener) -> [(valence, score)]
    scored: dict[tuple[str, str], list[tuple[str, float]]] = defaultdict(list)
    items = replies = failed = 0
    log(f"openers: scoring {sum(len(v) for v in pool.values())} candidate openers on {len(trainset)} "
        "training dialogues")
    with progress(desc="openers", total=len(trainset), unit="dialogues") as phase:
        for example in phase.track(trainset):
            try:
                first = base(dialogue=example.dialogue)
                first_score = float(metric(example, first))
            except Exception as exc:  # noqa: BLE001 - one dialogue's failure does not stop the fit
                failed += 1
                log(f"openers: a training dialogue failed ({type(exc).__name__}: {str(exc)[:120]}); skipped")
                continue
            items += 1
            tried, lost = _try_openers(base, example, first, first_score, metric, fields, pool, scored, log)
            replies += 1 + tried
            failed += lost
    seconds = time.perf_counter() - started
    if items < MIN_ITEMS:
        log(f"openers: only {items} training dialogues could be scored (at least {MIN_ITEMS} needed); "
            "the stock openers stay")
        return None
    openers, rows = rank_openers(scored, pool, keep=keep, shrink=shrink)
    log(f"openers: {replies} replies on {items} dialogues in {seconds:.0f} s; first openers "
        + "; ".join(f"{v}: " + ", ".join(f"{k} {t[k][0]!r}" for k in t) for v, t in openers.items()))
    return OpenerFit(openers, rows, items, replies, failed, seconds)


def _try_openers(base, example, first, first_score: float, metric, fields: list[str], pool: dict,
                 scored: dict[tuple[str, str], list[tuple[str, float]]], log: Callable[[str], None]) -> tuple[int, int]:
    """Score, into ``scored``, a reply begun with each opener that suits ``first``'s plan and emotion; the
    stock opener keeps ``first``'s score. (replies written, replies that failed)."""
    inputs = {name: first.get(name, "") for name in fields}
    valence = emotion_valence(first.get("emotion"))
    kinds = scaffold_kinds(inputs)
    twice = kinds[0] == kinds[1]
    replies = failed = 0
    for kind in dict.fromkeys(kinds):
        for opener in pool.get(kind, ()):
            if not opener_suits(opener, valence):  # a toned opener is only tried where it may be used
                continue
            if _is_stock(kind, opener, twice):
                scored[kind, opener].append((valence, first_score))
                continue
            base.reply_openers = _trial(kind, opener, twice)
            try:
                reply = base._call("generate_response", dict(inputs))
                score = float(metric(example, dspy.Prediction(**{**first.toDict(), "response": reply.response})))
            except Exception as exc:  # noqa: BLE001 - one reply's failure does not stop the fit
                failed += 1
                log(f"openers: a reply with {opener!r} failed ({type(exc).__name__}); skipped")
                continue
            finally:
                base.reply_openers = None
            replies += 1
            scored[kind, opener].append((valence, score))
    return replies, failed


def rank_openers(scored: dict[tuple[str, str], list[tuple[str, float]]], pool: dict, *, keep: int = KEEP,
                 shrink: float = SHRINK, min_trials: int = MIN_TRIALS,
                 ) -> tuple[dict[str, dict[str, tuple[str, ...]]], list[dict[str, Any]]]:
    """Openers per valence and mechanism, best first, and the table of scores they were ranked by.

    A valence's score of an opener is its mean there, shrunk towards its mean
    over all dialogues; "any" ranks by that overall mean. Ties keep pool order
    (stock openers first). A mechanism planned for fewer than ``min_trials``
    dialogues keeps its stock openers.
    """
    openers: dict[str, dict[str, tuple[str, ...]]] = {}
    rows: list[dict[str, Any]] = []
    for valence in ("positive", "negative", "any"):
        table = {}
        for kind, options in pool.items():
            if max((len(scored.get((kind, o)) or []) for o in options), default=0) < min_trials:
                continue
            ranked = []
            for index, opener in enumerate(options):
                values = scored.get((kind, opener)) or []
                if not values or not opener_suits(opener, valence):
                    continue
                overall = sum(s for _, s in values) / len(values)
                mine = values if valence == "any" else [(v, s) for v, s in values if v == valence]
                score = overall if valence == "any" else \
                    (sum(s for _, s in mine) + shrink * overall) / (len(mine) + shrink)
                ranked.append((-score, index, opener))
                rows.append({"valence": valence, "mechanism": kind, "opener": opener, "score": round(score, 4),
                             "mean": round(sum(s for _, s in mine) / len(mine), 4) if mine else None,
                             "n": len(mine)})
            if not ranked:
                continue
            best = [opener for _, _, opener in sorted(ranked)][:keep]
            best += [o for o in SCAFFOLD_OPENERS[kind] if o not in best][:max(0, keep - len(best))]
            table[kind] = tuple(best)
        if table:
            openers[valence] = table
    return openers, rows


__all__ = ["KEEP", "OpenerFit", "fit_openers", "rank_openers"]
