"""The compact writer's reply reward: the metric's reference-free score with the reply guards and the tone floor.

A candidate that talks as the speaker, says the listener's earlier turn again, pastes one of the writer's demo
replies or cheers at bad news (its tone below ``ProgramConfig.tone_floor``) loses to one that does not. No gold
reply and no LM call: the same score ``dspy.BestOfN`` and the plan race choose by.
"""

from __future__ import annotations

import logging

import dspy

from trace_dspy.compact.guards import GUARDS
from trace_dspy.optimize.selection import reply_demos, reward_candidate

_log = logging.getLogger(__name__)


def reward_metric(demos: tuple[str, ...], tone_floor: float):
    """The reward's metric for a writer whose demo replies are ``demos`` (copy sources: a candidate that pastes
    one scores 0): the default metric with the reply guards and ``tone_floor`` (off, with a warning once, where
    the tone head cannot run)."""
    from trace_dspy.optimize.metric import EmpathyMetric, MetricConfig
    from trace_dspy.optimize.tone import shared_tone

    if tone_floor > 0 and shared_tone() is None:  # the metric finds the same head (None: no embed extra)
        from trace_dspy.core.console import warn_once
        from trace_dspy.optimize.similarity import MISSING_EMBED

        warn_once(_log, "tone_floor", "the reply reward's tone guard is off: %s", MISSING_EMBED.split(";")[0])
        tone_floor = 0.0
    return EmpathyMetric(MetricConfig(tone_floor=tone_floor), copy_sources=demos, guards=GUARDS)


def compact_reward(program, inputs: dict, pred) -> float:
    """The reward of a reply candidate ``pred`` written for the reply stage's ``inputs`` by ``program``."""
    demos = reply_demos(program.generate_response)
    floor = float(program.config.tone_floor)
    metric = program.reward_metrics.get(("compact", demos, floor), lambda: reward_metric(demos, floor))
    # The situation's pleasantness (from the emotion prior) is what the tone floor weighs the reply's tone by.
    candidate = reward_candidate(inputs, pred, situation_pleasant=program.situation_pleasant(inputs["dialogue"]))
    return metric.evaluate(dspy.Example(dialogue=inputs["dialogue"]), candidate).score
