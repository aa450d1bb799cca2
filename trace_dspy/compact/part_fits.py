"""The compact writer's parts a compile fits before its optimizer runs: the reply openers, then the plans.

With ``opener_items`` > 0 and a scaffolded reply, each mechanism's openers are ranked by the metric on that many
training dialogues (``trace_dspy.compact.opener_fit``); a reply that is not scaffolded keeps its layout, and the
log says no openers were fitted. With ``plan_items`` > 0 the further reply plans, and the first plan that may
stand in for the planner call, are chosen next (``trace_dspy.compact.plan_fit``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import dspy

from trace_dspy.optimize.optimizers import FitRecords, OptimizerConfig, PreFit


def fit_reply_parts(cfg: OptimizerConfig, metric, program, trainset: Sequence[dspy.Example],
                    log: Callable[[str], None]) -> PreFit | None:
    """Fit what ``cfg`` asks for on ``program`` (a copy carries them); None where nothing was fitted."""
    parts: dict = {}
    fit = plan_fit = None
    if cfg.opener_items and program.reply_format() != "scaffold":
        log("openers: not fitted: the reply stage is not scaffolded for this LM (reply_format scaffold, or auto "
            "with the embedded model)")
    elif cfg.opener_items:
        from trace_dspy.compact.opener_fit import fit_openers

        fit = fit_openers(program, list(trainset)[:cfg.opener_items], metric, log=log)
        if fit is not None:
            program = program.deepcopy()
            program.reply_openers = parts["reply_openers"] = fit.openers
    if cfg.plan_items:
        from trace_dspy.compact.plan_fit import fit_plans

        plan_fit = fit_plans(program, list(trainset)[:cfg.plan_items], metric, log=log)
        if plan_fit is not None and (plan_fit.plans or plan_fit.first_plan):
            program = program.deepcopy()
            program.reply_plans = parts["reply_plans"] = plan_fit.plans
            program.first_plan = parts["first_plan"] = plan_fit.first_plan
    if fit is None and plan_fit is None:
        return None
    return PreFit(program, FitRecords(
        reply_openers=fit.record() if fit is not None else None,
        reply_plans=plan_fit.record() if plan_fit is not None else None,
        first_plan=plan_fit.first_plan_record() if plan_fit is not None else None), parts)
