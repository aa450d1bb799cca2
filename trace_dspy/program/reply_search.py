"""How the reply stage searches for the reply it keeps: Best-of-N candidates scored by the reference-free
reward, and, with fitted further plans, a reply per plan.

``ReplySearch`` is a mixin of ``TraceProgram`` (``trace_dspy.program.pipeline``): it uses the program's config
(``best_of``, ``best_of_threshold``), its reply plans and its stage predictor.
"""

from __future__ import annotations

import logging

import dspy

from trace_dspy.core import spans

_log = logging.getLogger(__name__)


class ReplySearch:
    """Best-of-N and plan replies for ``TraceProgram``."""

    def plan_reply(self, predictor, inputs: dict, plan: tuple[str, str]) -> tuple[dspy.Prediction, float, list[float]]:
        """The reply written for ``plan`` (primary, secondary) in place of the plan in ``inputs`` (Best-of-N as
        configured): the kept reply, its reward, and every candidate's reward. Call inside the reply stage's
        context."""
        inputs = self._plan_inputs(inputs, plan)
        with self.reply_cue(inputs["dialogue"]):
            if self.best_of(dspy.settings.lm) > 1:
                result, rewards = self._best_reply(predictor, inputs)
                return result, max(rewards), rewards
            result = predictor(**inputs)
        reward = self.reply_reward(inputs, result)
        return result, reward, [reward]

    def _plan_replies(self, predictor, inputs: dict, state: dict):
        """Replies for the LM's plan (or the fitted first plan in its place) and each fitted plan, in two
        rounds; the best by reward is kept, and its plan becomes the program's.

        First every plan gets its first reply. Only when none of them reaches ``best_of_threshold`` are more
        candidates sampled (Best-of-N as configured), plan by plan from the one whose first reply scored best,
        until a candidate reaches the threshold. A further plan whose reply fails is skipped (the LM's own
        must not fail).
        """
        own = (inputs["strategy"], inputs.get("secondary_strategy", inputs["strategy"]))
        tried: dict[tuple[str, str], dict] = {}
        for number, plan in enumerate(dict.fromkeys([own, *self.race_plans()])):
            plan_inputs = self._plan_inputs(inputs, plan)
            with spans.span(f"plan {'+'.join(plan)}", inputs={"strategy": plan[0], "secondary_strategy": plan[1]}) \
                    as sp:
                try:
                    result, reward = self._first_reply(predictor, plan_inputs)
                except Exception:
                    if number == 0:
                        raise
                    continue
                sp.set_outputs({"response": getattr(result, "response", None), "reward": reward})
            tried[plan] = {"inputs": plan_inputs, "best": (result, reward), "rewards": [reward]}
        threshold = self.config.best_of_threshold
        more = self.best_of(dspy.settings.lm) - 1
        if more > 0 and max(t["best"][1] for t in tried.values()) < threshold:
            for plan in sorted(tried, key=lambda p: -tried[p]["best"][1]):
                entry = tried[plan]
                entry["best"] = self._sample_better(predictor, entry["inputs"], entry["best"], entry["rewards"], more)
                if entry["best"][1] >= threshold:
                    break
        # The first of equals: the LM's own plan first. With a history of openings (respond, chat), a reply that
        # opens as many recent ones did gives way to one that does not.
        plan = max(tried, key=lambda p: self._standing(*tried[p]["best"]))
        recent = self.recent_openings
        if recent is not None:
            recent.add(getattr(tried[plan]["best"][0], "response", ""))
        state["strategy"] = plan[0]
        if "secondary_strategy" in inputs:
            state["secondary_strategy"] = plan[1]
        state["plan_choice"] = [{"plan": "+".join(p), "reward": round(float(t["best"][1]), 4)}
                                for p, t in tried.items()]
        state["reply_rewards"] = [r for t in tried.values() for r in t["rewards"]]
        return tried[plan]["best"][0]

    def _standing(self, pred, reward: float) -> float:
        """What a candidate is chosen by: its reward, less ``variety_penalty`` times the share of recent replies
        that opened as it does (with a history of openings; without one, the reward)."""
        recent = self.recent_openings
        if recent is None or not self.config.variety_penalty:
            return reward
        return reward - self.config.variety_penalty * recent.share(getattr(pred, "response", ""))

    @staticmethod
    def _plan_inputs(inputs: dict, plan: tuple[str, str]) -> dict:
        inputs = {**inputs, "strategy": plan[0]}
        if "secondary_strategy" in inputs:
            inputs["secondary_strategy"] = plan[1]
        return inputs

    def reply_reward(self, inputs: dict, pred) -> float:
        """The reference-free metric score of a reply candidate: no gold reply, no LM call.

        Uses ``self.reward_fn`` when set (tests, custom rewards), else the
        default EmpathyMetric's learned empathy, strategy fit, relevance and rules,
        with its reply guards on (a candidate that talks as the speaker or says
        the listener's earlier turn again scores 0).
        """
        if self.reward_fn is not None:
            return float(self.reward_fn(inputs, pred))
        # The writer's demo replies are copy sources: a candidate that pastes one scores 0.
        demos = tuple(str(d["response"]) for d in self.generate_response.demos if d.get("response"))
        key = (demos, self.config.tone_floor)
        if self._reward_metric is None or self._reward_metric[0] != key:
            self._reward_metric = (key, self._make_reward_metric(demos))
        candidate = dspy.Prediction(response=pred.response, emotion=inputs.get("emotion"),
                                    situation_pleasant=self.situation_pleasant(inputs["dialogue"]),
                                    strategy=inputs.get("strategy"),
                                    secondary_strategy=inputs.get("secondary_strategy"),
                                    exemplars=inputs.get("exemplars") or [])
        return self._reward_metric[1].evaluate(dspy.Example(dialogue=inputs["dialogue"]), candidate).score

    def _make_reward_metric(self, demos: tuple[str, ...]):
        """The reward's metric: the default one with the reply guards and the program's tone floor (off, with a
        warning once, where the tone head cannot run)."""
        from trace_dspy.optimize.metric import EmpathyMetric, MetricConfig
        from trace_dspy.optimize.tone import shared_tone

        floor = self.config.tone_floor
        if floor > 0 and shared_tone() is None:  # the metric finds the same head (None: no embed extra)
            from trace_dspy.core.console import warn_once
            from trace_dspy.optimize.similarity import MISSING_EMBED

            warn_once(_log, "tone_floor", "the reply reward's tone guard is off: %s", MISSING_EMBED.split(";")[0])
            floor = 0.0
        return EmpathyMetric(MetricConfig(tone_floor=floor), copy_sources=demos, reply_guards=True)

    def _best_reply(self, predictor, inputs: dict):
        """The first reply as configured; below the threshold, ``dspy.BestOfN`` samples the rest.

        Returns the kept prediction and the reward of every candidate, in order.
        """
        first, reward = self._first_reply(predictor, inputs)
        rewards = [reward]
        if reward >= self.config.best_of_threshold:
            return first, rewards
        kept, _ = self._sample_better(predictor, inputs, (first, reward), rewards, self.best_of(dspy.settings.lm) - 1)
        return kept, rewards

    def _sample_better(self, predictor, inputs: dict, first: tuple, rewards: list[float], n: int) -> tuple:
        """Up to ``n`` sampled candidates after the ``first`` (prediction, reward), whose reward is ``rewards[0]``;
        the best sample replaces it only when it scores higher (every attempt failing keeps it)."""
        standings: list[float] = []
        base = len(rewards)
        sampled = self._more_replies(predictor, inputs, rewards, n, standings)
        if sampled is None or not standings or max(standings) <= self._standing(*first):
            return first
        return sampled, rewards[base + standings.index(max(standings))]

    def _first_reply(self, predictor, inputs: dict) -> tuple[dspy.Prediction, float]:
        """The reply as configured (greedy on the embedded model) and its reward."""
        first = predictor(**inputs)
        reward = self.reply_reward(inputs, first)
        _candidate_span(1, first, reward)
        return first, reward

    def _more_replies(self, predictor, inputs: dict, rewards: list[float], n: int, standings: list[float]):
        """Up to ``n`` sampled candidates (``dspy.BestOfN``, stopping at the threshold); each reward is appended
        to ``rewards`` and what it is chosen by (``_standing``) to ``standings``. Returns the sample that stands
        best, or None when every attempt failed."""
        trace = dspy.settings.trace
        mark = len(trace) if trace is not None else 0

        def reward(args, pred):
            value = self.reply_reward(args, pred)
            rewards.append(value)
            standings.append(self._standing(pred, value))
            _candidate_span(len(rewards), pred, value)
            return standings[-1]

        sampled = dspy.BestOfN(module=predictor, N=n, threshold=self.config.best_of_threshold,
                               reward_fn=reward)(**inputs)
        if trace is not None:
            # BestOfN records its copy of the predictor; name the original so optimizers find the demo.
            trace[mark:] = [(predictor, a, o) for _, a, o in trace[mark:]]
        return sampled


def _candidate_span(number: int, pred, reward: float) -> None:
    """A Best-of-N candidate in the trace: its reply and its reward (no-op with tracing off)."""
    if spans.enabled():
        with spans.span(f"candidate {number}", attributes={"reward": float(reward)}) as sp:
            sp.set_outputs({"response": getattr(pred, "response", None), "reward": float(reward)})
