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

Step 1 also shows how the LM plans. When the LM is grammar-constrained (the
embedded model) and it gave one plan on at least ``HABIT_SHARE`` of the
dialogues, that plan is its habit (``planner_habit``): the program then takes
it without calling the planner on such an LM (``planner = auto``), and the
further plans race it as before. The habit's record keeps the count of every
plan the LM gave. Every further plan costs one more reply (its
Best-of-N candidates) per dialogue; the fit records the candidates it took.
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
# A constrained LM's plan is a habit when it gave it on this share of the training dialogues.
HABIT_SHARE = 0.9


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

    @property
    def habit(self) -> tuple[str, str] | None:
        """The constrained LM's habitual plan: the one it gave on at least ``HABIT_SHARE`` of the dialogues."""
        if not self.constrained or not self.lm_plans:
            return None
        top, count = max(self.lm_plans.items(), key=lambda kv: kv[1])
        return tuple(top.split("+")) if count >= HABIT_SHARE * sum(self.lm_plans.values()) else None

    def habit_record(self) -> dict[str, Any]:
        """For the manifest's ``planner_habit`` table: the habit (or None) and the LM's plans it was read from."""
        top, count = max(self.lm_plans.items(), key=lambda kv: kv[1]) if self.lm_plans else (None, 0)
        return {"plan": "+".join(self.habit) if self.habit else None, "top": top, "count": count,
                "items": sum(self.lm_plans.values()), "lm_plans": dict(self.lm_plans),
                "min_share": HABIT_SHARE, "constrained": self.constrained}

    def record(self) -> dict[str, Any]:
        """For the manifest: the plans, the training scores before and after, and each option's numbers."""
        return {"plans": ["+".join(p) for p in self.plans], "baseline": round(self.baseline, 4),
                "score": round(self.score, 4), "steps": self.steps, "options": self.options,
                "items": self.items, "replies": self.replies, "candidates": self.candidates,
                "failed": self.failed, "seconds": round(self.seconds, 1)}


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
    fit = PlanFit(plans, baseline, score, steps, rows, len(table), replies, candidates, failed, seconds,
                  dict(lm_plans.most_common()), _constrained(base))
    if fit.habit:
        log(f"plans: the LM planned {'+'.join(fit.habit)} on {lm_plans['+'.join(fit.habit)]} of {len(table)} "
            "dialogues: that habit stands in for the planner call on this LM")
    return fit


def _constrained(program) -> bool:
    from trace_dspy.lm.adapters import is_constrained

    lm = program._stage_lm("plan_strategy") or dspy.settings.lm
    return lm is not None and is_constrained(lm)


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
            with base._stage_context("generate_response"):
                result, reward, rewards = base.plan_reply(base.generate_response, inputs, plan)
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


__all__ = ["HABIT_SHARE", "MAX_PLANS", "MIN_GAIN", "PLAN_OPTIONS", "PlanFit", "choose_plans", "fit_plans"]
