"""Reply selection as a DSPy module: the first reply as the LM is configured, then Best-of-N by a reward.

``ReplySelection`` wraps the reply module (the reply stage's predictor, or the compact writer's scaffolded
reply) with a reward function, as ``dspy.BestOfN`` and ``dspy.Refine`` wrap theirs. It writes one reply as
the LM is configured (greedy on the embedded model); only when its reward is below ``threshold`` does it
sample up to ``n - 1`` more with ``dspy.BestOfN`` (temperature 1.0, one rollout id each), stopping at the
first that reaches the threshold, and keeps a sample only where it stands higher than the first reply.

What a candidate is chosen by (``standing``) is its reward unless the caller says otherwise (the compact
writer lowers replies that open as recent ones did); the rewards recorded are always the rewards.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from dataclasses import dataclass

import dspy

from trace_dspy.core import spans

Reward = Callable[[dict, dspy.Prediction], float]


@dataclass(frozen=True)
class Candidate:
    """A reply and its reward."""

    prediction: dspy.Prediction
    reward: float


class ReplySelection(dspy.Module):
    """Best-of-N over ``module`` by ``reward_fn(inputs, prediction)``, the first reply greedy.

    ``n``: the most replies written (1: just the first); ``threshold``: a reward that ends the search;
    ``standing``: what a candidate is chosen by, from its prediction and reward (default: the reward);
    ``name``: the predictor the samples' trace entries are recorded under (optimizers look for it there;
    ``dspy.BestOfN`` records its own copy).
    """

    def __init__(self, module, reward_fn: Reward, *, n: int = 1, threshold: float = 1.0,
                 standing: Callable[[dspy.Prediction, float], float] | None = None, name=None):
        super().__init__()
        self.module = module
        self.reward_fn = reward_fn
        self.n = int(n)
        self.threshold = float(threshold)
        self.standing = standing or (lambda prediction, reward: reward)
        self._name = name

    def forward(self, **inputs) -> dspy.Prediction:
        """The kept reply, with ``reply_rewards``: every candidate's reward, in order."""
        kept, rewards = self.select(inputs)
        out = dspy.Prediction(**kept.prediction.toDict())
        out.reply_rewards = rewards
        return out

    def select(self, inputs: dict) -> tuple[Candidate, list[float]]:
        """The kept candidate and the reward of every candidate, in order."""
        first = self.first(inputs)
        rewards = [first.reward]
        if first.reward >= self.threshold or self.n <= 1:
            return first, rewards
        return self.better(inputs, first, rewards, self.n - 1), rewards

    def first(self, inputs: dict) -> Candidate:
        """The reply as the LM is configured, and its reward."""
        prediction = self.module(**inputs)
        reward = float(self.reward_fn(inputs, prediction))
        candidate_span(1, prediction, reward)
        return Candidate(prediction, reward)

    def better(self, inputs: dict, first: Candidate, rewards: list[float], n: int) -> Candidate:
        """Up to ``n`` samples after ``first``, each reward appended to ``rewards``; the sample that stands best
        replaces ``first`` only where it stands higher (every sample failing keeps ``first``)."""
        standings: list[float] = []
        base = len(rewards)
        trace = dspy.settings.trace
        mark = len(trace) if trace is not None else 0

        def reward(args, prediction):
            value = float(self.reward_fn(args, prediction))
            rewards.append(value)
            standings.append(self.standing(prediction, value))
            candidate_span(len(rewards), prediction, value)
            return standings[-1]

        sampled = dspy.BestOfN(module=self.module, N=n, threshold=self.threshold, reward_fn=reward)(**inputs)
        if trace is not None and self._name is not None:
            trace[mark:] = [(self._name, a, o) for _, a, o in trace[mark:]]
        if sampled is None or not standings or max(standings) <= self.standing(first.prediction, first.reward):
            return first
        return Candidate(sampled, rewards[base + standings.index(max(standings))])


class MetricCache:
    """The reward metrics a program has built, by key (the demo replies they guard against, their settings):
    building one loads scorers, so a program keeps the last few. Shared by a program's copies; thread-safe."""

    SIZE = 4

    def __init__(self):
        self._metrics: dict[Hashable, object] = {}
        self._lock = threading.Lock()

    def get(self, key: Hashable, build: Callable[[], object]):
        """The metric under ``key``, built by ``build`` the first time (a race builds an equal one at worst)."""
        with self._lock:
            if key in self._metrics:
                return self._metrics[key]
        metric = build()
        with self._lock:
            if len(self._metrics) >= self.SIZE:
                self._metrics.clear()
            self._metrics[key] = metric
        return metric


def reply_demos(predictor) -> tuple[str, ...]:
    """The replies of a reply predictor's demos: a candidate that pastes one is no reply (the reward's copy
    sources), and the key a reward metric is kept under."""
    return tuple(str(d["response"]) for d in predictor.demos if d.get("response"))


def reward_candidate(inputs: dict, pred, **extra) -> dspy.Prediction:
    """What a reward metric reads of a candidate written for the reply stage's ``inputs``: the reply, the plan
    it was written for, the emotion, the exemplars, and ``extra`` fields (the compact writer's
    ``situation_pleasant``)."""
    return dspy.Prediction(response=pred.response, emotion=inputs.get("emotion"), **extra,
                           strategy=inputs.get("strategy"), secondary_strategy=inputs.get("secondary_strategy"),
                           exemplars=inputs.get("exemplars") or [])


def candidate_span(number: int, prediction, reward: float) -> None:
    """A Best-of-N candidate in the trace: its reply and its reward (no-op with tracing off)."""
    if spans.enabled():
        with spans.span(f"candidate {number}", attributes={"reward": float(reward)}) as sp:
            sp.set_outputs({"response": getattr(prediction, "response", None), "reward": float(reward)})
