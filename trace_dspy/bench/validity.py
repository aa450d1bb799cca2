"""The metric validity study (human EPITOME ratings, the scorer as a classifier, real against wrong replies,
the weight search) behind ``python -m trace_dspy.metric_validity`` (see :mod:`trace_dspy.cli.metric_validity`)."""

from __future__ import annotations

import itertools
from typing import Any

import dspy

from trace_dspy.core.console import progress
from trace_dspy.core.dialogue import normalize_dialogue, speaker_turns
from trace_dspy.optimize.metric import EmpathyMetric, MetricConfig, weighted_mean

BLAND = ("I see.", "That's nice.", "Okay.", "Interesting.", "I understand.", "Cool.", "Alright then.", "Hmm, okay.")
NEGATIVES = ("bland", "mismatched", "parroted", "constant", "copied")
FREE = ("empathy", "relevance", "rules")
# The reference-free mix before the learned scorer and head: rules and plain cosine relevance.
OLD_FREE = {"rules": 0.5, "cosine": 0.5}
OLD_NAME = "composite before the learned scorer (rules + cosine)"
# The targets: reference-free AUC against each negative, and Spearman with the human sum.
AUC_TARGET, RHO_TARGET = 0.90, 0.55


def _components(metric: EmpathyMetric, example: dspy.Example, reply: str, strategy: str | None = None,
                copy_sources=()) -> dict[str, float | None]:
    pred = dspy.Prediction(response=reply, emotion=example.get("emotion"), strategy=strategy,
                           secondary_strategy=None)
    saved = metric.copy_sources
    metric.copy_sources = tuple(copy_sources)
    try:
        scored = metric.evaluate(example, pred)
    finally:
        metric.copy_sources = saved
    out = dict(scored.components)
    out.update({m: v for m, v in (scored.details.get("levels") or {}).items()})
    # The relevance of the metric before the learned head: cosine to the speaker's words, 0 for parroting.
    speaker = " ".join(speaker_turns(example.dialogue))
    out["cosine"] = (0.0 if not scored.details.get("rules", {}).get("not_parroting", True)
                     else metric._similarity(reply, speaker)) if speaker else None
    return out


def composite(components: dict[str, float | None], weights: dict[str, float], floor: float | None = None) -> float:
    """The metric's composite; ``floor`` recomputes the relevance gate for another relevance_floor."""
    value = weighted_mean(components, weights)
    if value is None:
        return 0.0
    grounded = components.get("grounded")
    grounded = 1.0 if grounded is None else grounded
    relevance = components.get("relevance")
    if floor is not None and grounded > 0 and relevance is not None:
        grounded = min(1.0, relevance / floor) if floor > 0 else 1.0
    return value * grounded


def free_weights(config: MetricConfig) -> dict[str, float]:
    return {k: getattr(config, k) for k in FREE}


def prewarm(metric: EmpathyMetric, seekers: list[str], replies: list[str]) -> None:
    """Embed every text in large batches first: per-item scoring then hits the cache."""
    if metric.embedder is not None:
        metric.embedder.encode(list(dict.fromkeys([*seekers, *replies])))
    if metric.scorer is not None:
        for i in range(0, len(replies), 512):
            metric.scorer.levels(seekers[i:i + 512], replies[i:i + 512])


def epitome_part(metric: EmpathyMetric, pairs, weights: dict[str, float]) -> dict[str, Any]:
    from trace_dspy.data.epitome import MECHANISMS
    from trace_dspy.optimize.scorers import spearman

    rows = []
    prewarm(metric, [p.seeker for p in pairs], [p.reply for p in pairs])
    for p in progress(pairs, desc="EPITOME dev"):
        ex = dspy.Example(dialogue=normalize_dialogue([p.seeker])).with_inputs("dialogue")
        comp = _components(metric, ex, p.reply)
        comp["fit_by_plan"] = {m: _components(metric, ex, p.reply, strategy=m)["strategy_fit"] for m in MECHANISMS}
        rows.append(comp)
    human = {m: [p.level(m) for p in pairs] for m in MECHANISMS}
    human["sum"] = [sum(p.levels) for p in pairs]
    table = {}
    names = ["empathy", *MECHANISMS, "strategy_fit", "relevance", "cosine", "rules", "composite", OLD_NAME]
    for name in names:
        table[name] = {}
        for col, gold in human.items():
            if name == "strategy_fit":
                if col == "sum":
                    continue
                vals = [r["fit_by_plan"][col] for r in rows]
            elif name == "composite":
                vals = [composite(r, weights) for r in rows]
            elif name == OLD_NAME:
                vals = [weighted_mean(r, OLD_FREE) for r in rows]
            else:
                vals = [r.get(name) for r in rows]
            if any(v is None for v in vals):
                continue
            table[name][col] = spearman(vals, gold)
    return {"pairs": len(pairs), "posts": len({p.sp_id for p in pairs}), "spearman": table, "rows": rows}


def ed_part(metric: EmpathyMetric, examples, constant: str) -> dict[str, list[dict]]:
    n = len(examples)
    turns = [speaker_turns(ex.dialogue) for ex in examples]
    replies = {
        "gold": [ex.response for ex in examples],
        "bland": [BLAND[i % len(BLAND)] for i in range(n)],
        "mismatched": [examples[(i + n // 2) % n].response for i in range(n)],
        "parroted": [t[-1] for t in turns],
        "constant": [constant] * n,
    }
    speakers = [" ".join(t) for t in turns]
    for batch in replies.values():
        prewarm(metric, speakers, batch)
    conditions: dict[str, list[dict]] = {"gold": [], **{k: [] for k in NEGATIVES}}
    for i, ex in enumerate(progress(examples, desc="ED items")):
        for kind, batch in replies.items():
            conditions[kind].append(_components(metric, ex, batch[i]))
        conditions["copied"].append(_components(metric, ex, constant, copy_sources=[constant]))
    return conditions


def _value(name: str, components: dict, weights: dict[str, float], floor: float | None = None) -> float | None:
    if name == "composite":
        return composite(components, weights, floor)
    if name == "old":  # the old mix had no grounding factor
        return weighted_mean(components, weights)
    return components.get(name)


def auc_table(conditions: dict[str, list[dict]], names: list[str], weights: dict[str, float],
              floor: float | None = None) -> dict[str, dict]:
    from trace_dspy.optimize.scorers import auc

    table: dict[str, dict] = {}
    for name in names:
        row: dict[str, Any] = {}
        for neg in NEGATIVES:
            pos_vals, neg_vals = [], []
            for g, b in zip(conditions["gold"], conditions[neg]):
                gv = _value(name, g, weights, floor)
                bv = _value(name, b, weights, floor)
                if gv is not None and bv is not None:
                    pos_vals.append(gv)
                    neg_vals.append(bv)
            row[neg] = auc(pos_vals, neg_vals) if pos_vals else None
        gold = [_value(name, g, weights, floor) for g in conditions["gold"]]
        gold = [v for v in gold if v is not None]
        row["mean_gold"] = sum(gold) / len(gold) if gold else None
        table[name] = row
    return table


FLOORS = (0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 1.0)


def search_weights(ed: dict[str, list[dict]], ep_rows: list[dict], ep_sum: list[int], step: float = 0.1):
    """Every split of the reference-free weight among empathy, relevance and rules (in ``step``s),
    with every relevance floor of FLOORS."""
    from trace_dspy.optimize.scorers import spearman

    ticks = round(1 / step)
    results = []
    for a, b, floor in itertools.product(range(ticks + 1), range(ticks + 1), FLOORS):
        if a + b > ticks:
            continue
        w = {"empathy": round(a * step, 3), "relevance": round(b * step, 3), "rules": round((ticks - a - b) * step, 3)}
        if sum(w.values()) <= 0:
            continue
        aucs = auc_table(ed, ["composite"], w, floor)["composite"]
        worst = min(v for k, v in aucs.items() if k in NEGATIVES and v is not None)
        rho = spearman([composite(r, w, floor) for r in ep_rows], ep_sum)
        results.append({"weights": w, "relevance_floor": floor, "worst_auc": worst, "epitome_sum_spearman": rho,
                        "objective": min(worst / AUC_TARGET, rho / RHO_TARGET),
                        **{f"auc_{k}": aucs[k] for k in NEGATIVES}})
    results.sort(key=rank_key)
    return results


def rank_key(result: dict) -> tuple:
    """Mixes that reach the AUC target on every negative first, by EPITOME Spearman; then the rest by
    the nearer target (min(worst AUC / 0.90, Spearman / 0.55))."""
    if result["worst_auc"] >= AUC_TARGET:
        return (0, -result["epitome_sum_spearman"])
    return (1, -result["objective"])




