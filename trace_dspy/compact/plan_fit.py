"""Fit the further reply plans: which plans besides the LM's own are worth a reply.

The planner picks a primary and a secondary mechanism (ER, IP, EX), and the
reply stage writes to that plan. A small planner's choice is close to habit:
on ED the embedded model plans IP+EX for most dialogues. A reply written to
another plan can be better, and the reference-free reply reward (the one
Best-of-N already uses) tells which. ``fit_plans`` measures, on the training
dialogues, which further plans pay:

1. each dialogue runs through the program once (the LM's own plan, Best-of-N
   as configured), which fixes the emotion, the cause and the exemplars;
2. for every plan of ``options`` the reply stage writes the reply again with
   that plan (Best-of-N as configured); the reply reward and the compile's
   metric (against the dialogue's gold) score it;
3. plans are added greedily: at each step the plan whose addition raises the
   mean metric score most, where each dialogue keeps the reply with the best
   reward among the LM's plan and the plans chosen so far (the rule the
   program follows at inference, ties to the earlier plan), as long as the
   gain is at least ``min_gain``, up to ``max_plans`` plans.

The chosen plans are saved in the artifact's manifest (``reply_plans``) with
the table they were chosen by.

The same table answers whether the planner call pays at all. Every option was
written for every dialogue, so the fit also chooses ``max_plans`` + 1 plans
from the options alone, greedily by the same rule, as if no LM had planned.
When the LM is grammar-constrained (the embedded model) and that race scores
within ``MIN_GAIN`` of the race that starts from the LM's plan (a planner call
must earn what a further plan must), its first plan becomes the program's
``first_plan``: on such an LM the planner is not called and the reply race
starts from that plan, then the rest. The record keeps both scores and the
count of every plan the LM gave.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import dspy

from trace_dspy.core.console import progress
from trace_dspy.core.labels import check_plans

# Every pair of distinct mechanisms with a question last, and each mechanism alone (two sentences of it).
PLAN_OPTIONS: tuple[tuple[str, str], ...] = (("ER", "EX"), ("ER", "IP"), ("IP", "EX"), ("EX", "EX"),
                                             ("ER", "ER"), ("IP", "IP"))
MAX_PLANS = 2
# An added plan must raise the mean training score by this much: every plan doubles a reply's cost.
MIN_GAIN = 0.005
MIN_ITEMS = 4


@dataclass
class PlanFit:
    """The chosen further plans and what they were chosen by."""

    plans: tuple[tuple[str, str], ...]
    baseline: float  # mean metric score with the LM's plan only
    score: float  # mean metric score with the chosen plans
    steps: list[dict[str, Any]]
    options: list[dict[str, Any]]
    items: int
    replies: int
    candidates: int
    failed: int
    seconds: float
    lm_plans: dict[str, int] = field(default_factory=dict)  # the LM's own plan -> training dialogues
    constrained: bool = False  # the fit ran on a grammar-constrained LM
    first_plan: tuple[str, str] | None = None  # the race's first plan in place of a planner call; None: ask
    planless: tuple[tuple[str, str], ...] = ()  # the plans chosen without the LM's plan
    planless_score: float | None = None  # mean metric score of that race

    def record(self) -> dict[str, Any]:
        """For the manifest: the plans (and the first plan, where the planner is not asked), the training scores
        before and after, and each option's numbers."""
        return {"plans": ["+".join(p) for p in self.plans],
                "first_plan": "+".join(self.first_plan) if self.first_plan else None,
                "baseline": round(self.baseline, 4), "score": round(self.score, 4), "steps": self.steps,
                "options": self.options, "items": self.items, "replies": self.replies,
                "candidates": self.candidates, "failed": self.failed, "seconds": round(self.seconds, 1)}

    def first_plan_record(self) -> dict[str, Any]:
        """For the manifest's ``first_plan`` table: the plan (or None), both races' training scores, and the
        LM's own plans."""
        return {"plan": "+".join(self.first_plan) if self.first_plan else None,
                "planless": ["+".join(p) for p in self.planless],
                "score_with_planner": round(self.score, 4),
                "score_without": None if self.planless_score is None else round(self.planless_score, 4),
                "items": self.items, "lm_plans": dict(self.lm_plans), "constrained": self.constrained}


def _plan_of(pred) -> tuple[str, str]:
    primary = str(pred.get("strategy"))
    return primary, str(pred.get("secondary_strategy") or primary)


def fit_plans(program, trainset: Sequence[dspy.Example], metric, *,
              options: Sequence[tuple[str, str]] = PLAN_OPTIONS, max_plans: int = MAX_PLANS,
              min_gain: float = MIN_GAIN, log: Callable[[str], None] | None = None) -> PlanFit | None:
    """Choose the further plans for ``program`` by ``metric`` on ``trainset``; None when too few dialogues
    could be scored or the program has no plan stage.

    ``program`` is a TraceProgram; it is not changed (the trials run on a copy
    without further plans). A dialogue or a reply that fails is skipped and
    counted.
    """
    log = log or (lambda message: None)
    options = check_plans(options)
    if getattr(program, "plan_strategy", None) is None:
        log("plans: not fitted: the program has no plan stage")
        return None
    started = time.perf_counter()
    base = program.deepcopy()
    base.reply_plans = ()
    fields = list(base.generate_response.signature.input_fields)
    table: list[dict[Any, tuple[float, float]]] = []
    lm_plans: Counter[str] = Counter()
    replies = candidates = failed = 0
    log(f"plans: writing replies for {len(options)} plans on {len(trainset)} training dialogues")
    with progress(desc="plans", total=len(trainset), unit="dialogues") as phase:
        for example in phase.track(trainset):
            try:
                first = base(dialogue=example.dialogue)
                inputs = {name: first.get(name, "") for name in fields}
                rewards = first.get("reply_rewards") or [base.reply_reward(inputs, first)]
                own = _plan_of(first)
                trials = {"lm": (float(max(rewards)), float(metric(example, first)))}
            except Exception as exc:  # noqa: BLE001 - one dialogue's failure does not stop the fit
                failed += 1
                log(f"plans: a training dialogue failed ({type(exc).__name__}: {str(exc)[:120]}); skipped")
                continue
            lm_plans["+".join(own)] += 1
            written, tried, lost = _try_plans(base, example, first, inputs, options, own, metric, trials, log)
            replies += 1 + written
            candidates += len(rewards) + tried
            failed += lost
            table.append(trials)
    seconds = time.perf_counter() - started
    if len(table) < MIN_ITEMS:
        log(f"plans: only {len(table)} training dialogues could be scored (at least {MIN_ITEMS} needed); "
            "the LM's plan stays the only one")
        return None
    plans, baseline, score, steps, rows = choose_plans(table, options, max_plans=max_plans, min_gain=min_gain)
    log(f"plans: {replies} replies on {len(table)} dialogues in {seconds:.0f} s; training score {baseline:.3f} "
        f"with the LM's plan, {score:.3f} with " + (", ".join("+".join(p) for p in plans) or "no further plan"))
    planless, planless_score = choose_planless(table, options, max_plans=max_plans, min_gain=min_gain)
    constrained = _constrained(base)
    first = planless[0] if constrained and planless and planless_score >= score - min_gain else None
    fit = PlanFit(planless[1:] if first else plans, baseline, score, steps, rows, len(table), replies, candidates,
                  failed, seconds, dict(lm_plans.most_common()), constrained, first, planless, planless_score)
    log(f"plans: without the planner's plan, {', '.join('+'.join(p) for p in planless)} score {planless_score:.3f}"
        + (f": the race starts from {'+'.join(first)} and the planner is not called on this LM" if first
           else "; the planner stays"))
    return fit


def _constrained(program) -> bool:
    """Is the planner's LM grammar-constrained (where the fitted first plan may stand in for its call)?"""
    from trace_dspy.lm.kinds import takes_grammar

    lm = program.lm_for("plan_strategy")
    return lm is not None and takes_grammar(lm)


def choose_planless(table: list[dict], options: Sequence[tuple[str, str]], *, max_plans: int = MAX_PLANS,
                    min_gain: float = MIN_GAIN) -> tuple[tuple[tuple[str, str], ...], float]:
    """The race without the LM's plan: up to ``max_plans`` + 1 plans of ``options``, chosen greedily as
    ``choose_plans`` does, and its mean metric score. A dialogue without a reply for any chosen plan scores 0."""
    blank = [{**t, "lm": (float("-inf"), 0.0)} for t in table]
    plans, _, score, _, _ = choose_plans(blank, options, max_plans=max_plans + 1, min_gain=min_gain)
    return plans, score


def _value(table: list[dict], plans: Sequence) -> float:
    """Mean metric score when each dialogue keeps the reply with the best reward among the LM's plan and
    ``plans`` (in that order; a tie keeps the earlier); a plan missing for a dialogue is not tried there."""
    total = 0.0
    for trials in table:
        best = trials["lm"]
        for plan in plans:
            if plan in trials and trials[plan][0] > best[0]:
                best = trials[plan]
        total += best[1]
    return total / len(table)


def _try_plans(base, example, first, inputs: dict, options: Sequence[tuple[str, str]], own: tuple[str, str], metric,
               trials: dict, log: Callable[[str], None]) -> tuple[int, int, int]:
    """Write a reply for each plan of ``options`` and put its (reward, metric score) in ``trials``; the LM's
    own plan keeps the LM's reply. (replies written, candidates they weighed, replies that failed)."""
    replies = candidates = failed = 0
    for plan in options:
        if plan == own:
            trials[plan] = trials["lm"]
            continue
        try:
            writer = base.writer()
            with base._stage_context("generate_response", writer):
                result, reward, rewards = writer.plan_reply(base, base.generate_response, inputs, plan)
            pred = dspy.Prediction(**{**first.toDict(), "response": result.response, "strategy": plan[0],
                                      "secondary_strategy": plan[1]})
            trials[plan] = (float(reward), float(metric(example, pred)))
        except Exception as exc:  # noqa: BLE001 - one reply's failure does not stop the fit
            failed += 1
            log(f"plans: a reply for {'+'.join(plan)} failed ({type(exc).__name__}); skipped")
            continue
        replies += 1
        candidates += len(rewards)
    return replies, candidates, failed


def choose_plans(table: list[dict], options: Sequence[tuple[str, str]], *, max_plans: int = MAX_PLANS,
                 min_gain: float = MIN_GAIN):
    """Greedy forward choice of further plans: (plans, baseline, score, steps, per-option rows).

    ``table`` holds, per dialogue, ``{"lm": (reward, score), plan: (reward, score), ...}``.
    """
    baseline = _value(table, [])
    rows = []
    for plan in options:
        scored = [t[plan][1] for t in table if plan in t]
        rows.append({"plan": "+".join(plan), "n": len(scored),
                     "alone": round(sum(scored) / len(scored), 4) if scored else None,
                     "with_lm": round(_value(table, [plan]), 4)})
    chosen: list[tuple[str, str]] = []
    current = baseline
    steps = []
    for _ in range(max_plans):
        ranked = sorted(((_value(table, [*chosen, plan]), -index, plan) for index, plan in enumerate(options)
                         if plan not in chosen), reverse=True)
        if not ranked:
            break
        value, _, plan = ranked[0]
        steps.append({"plan": "+".join(plan), "score": round(value, 4), "gain": round(value - current, 4),
                      "kept": value - current >= min_gain})
        if value - current < min_gain:
            break
        chosen.append(plan)
        current = value
    return tuple(chosen), baseline, current, steps, rows


__all__ = ["MAX_PLANS", "MIN_GAIN", "PLAN_OPTIONS", "PlanFit", "choose_planless", "choose_plans", "fit_plans"]
