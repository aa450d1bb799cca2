"""The plan race: a reply for the planner's plan and for each fitted plan, the best by reward kept.

With fitted further plans (``trace_dspy.compact.plan_fit``) the compact writer writes a reply for the plan the
LM gave (or the fitted first plan in its place) and for each further plan, in two rounds. First every plan gets
its first reply. Only when none of them reaches ``best_of_threshold`` are more candidates sampled (Best-of-N as
configured), plan by plan from the one whose first reply scored best, until a candidate reaches the threshold.
A further plan whose reply fails is skipped (the LM's own must not fail). The kept reply's plan becomes the
program's.
"""

from __future__ import annotations

from collections.abc import Callable

import dspy

from trace_dspy.core import spans
from trace_dspy.optimize.selection import Candidate, ReplySelection

Plan = tuple[str, str]


def plan_inputs(inputs: dict, plan: Plan) -> dict:
    """The reply stage's ``inputs`` with ``plan`` (primary, secondary) in place of theirs."""
    inputs = {**inputs, "strategy": plan[0]}
    if "secondary_strategy" in inputs:
        inputs["secondary_strategy"] = plan[1]
    return inputs


def run_race(selection: ReplySelection, inputs: dict, plans: tuple[Plan, ...], state: dict,
             on_kept: Callable[[dspy.Prediction], None] | None = None) -> dspy.Prediction:
    """Race ``plans`` after the LM's own (see the module's doc); ``selection`` writes and scores each plan's
    replies. Sets the kept plan, ``plan_choice`` and ``reply_rewards`` in ``state``; returns the kept reply.
    ``on_kept`` is told the kept reply (the history of openings)."""
    own = (inputs["strategy"], inputs.get("secondary_strategy", inputs["strategy"]))
    tried: dict[Plan, dict] = {}
    for number, plan in enumerate(dict.fromkeys([own, *plans])):
        entry_inputs = plan_inputs(inputs, plan)
        with spans.span(f"plan {'+'.join(plan)}", inputs={"strategy": plan[0], "secondary_strategy": plan[1]}) \
                as sp:
            try:
                first = selection.first(entry_inputs)
            except Exception:
                if number == 0:
                    raise
                continue
            sp.set_outputs({"response": getattr(first.prediction, "response", None), "reward": first.reward})
        tried[plan] = {"inputs": entry_inputs, "best": first, "rewards": [first.reward]}
    more = selection.n - 1
    if more > 0 and max(t["best"].reward for t in tried.values()) < selection.threshold:
        for plan in sorted(tried, key=lambda p: -tried[p]["best"].reward):
            entry = tried[plan]
            entry["best"] = selection.better(entry["inputs"], entry["best"], entry["rewards"], more)
            if entry["best"].reward >= selection.threshold:
                break
    # The first of equals: the LM's own plan first.
    plan = max(tried, key=lambda p: _standing(selection, tried[p]["best"]))
    kept = tried[plan]["best"].prediction
    if on_kept is not None:
        on_kept(kept)
    state["strategy"] = plan[0]
    if "secondary_strategy" in inputs:
        state["secondary_strategy"] = plan[1]
    state["plan_choice"] = [{"plan": "+".join(p), "reward": round(float(t["best"].reward), 4)}
                            for p, t in tried.items()]
    state["reply_rewards"] = [r for t in tried.values() for r in t["rewards"]]
    return kept


def _standing(selection: ReplySelection, candidate: Candidate) -> float:
    return selection.standing(candidate.prediction, candidate.reward)


def plan_reply(selection: ReplySelection, inputs: dict, plan: Plan) -> tuple[dspy.Prediction, float, list[float]]:
    """The reply written for ``plan`` in place of the plan in ``inputs`` (Best-of-N as ``selection`` is set):
    the kept reply, the best reward, and every candidate's reward."""
    kept, rewards = selection.select(plan_inputs(inputs, plan))
    return kept.prediction, max(rewards), rewards
