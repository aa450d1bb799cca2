"""The compact writer: how the program writes with a small model (the embedded SmolLM2-135M).

Everything the program does only because its model is small is decided here, for the program's config:

- prompts in the compact layout (``CompactChatAdapter``: fewer layout tokens);
- the reply as a plain chat, scaffolded (one sentence per planned mechanism, each going on from an opener:
  ``trace_dspy.compact.scaffold``), the openers in the situation's tone band and varied against recent replies;
- several reply candidates (``AUTO_BEST_OF``) chosen by a reward with the reply guards and the tone floor
  (``trace_dspy.compact.reward``), less a penalty for opening as recent replies did;
- the plan race over the fitted plans (``trace_dspy.compact.race``), and the fitted first plan in place of the
  planner call;
- one emotion candidate from the prior, taken without an LM call where a grammar could only write it;
- exemplars cut to their last exchange for the planner.

The standard writer (``trace_dspy.program.writers``) does none of this: TRACE as published.
"""

from __future__ import annotations

import threading

import dspy

from trace_dspy.compact.race import plan_reply, run_race
from trace_dspy.compact.reply_adapter import chat_reply_adapter
from trace_dspy.compact.reply_cue import ReplyCue
from trace_dspy.compact.reply_variety import DEFAULT_SIZE, RecentOpenings
from trace_dspy.compact.reward import compact_reward
from trace_dspy.compact.scaffold import ScaffoldedReply
from trace_dspy.lm.adapters import COMPACT, make_adapter
from trace_dspy.lm.finetune.adapted import adapted_lm
from trace_dspy.lm.kinds import takes_grammar
from trace_dspy.optimize.selection import ReplySelection

# best_of = "auto" on the embedded model: +0.058 [+0.031, +0.088] composite over one reply on 50 ED items.
AUTO_BEST_OF = 4
# prior_k = "auto": on the embedded model the prior's first label alone beats the LM choosing among the top 2, 3
# or 5 (300 ED items: 0.413 / 0.673 against 0.390 / 0.653 for top 5; docs/results/emotion.md, "The first fitted
# prior"), so the compact writer offers 1 candidate (and, on a grammar-constrained LM, does not ask: it could only
# repeat it).
AUTO_PRIOR_K = 1
_HISTORY = threading.Lock()


def opening_history(program) -> RecentOpenings | None:
    """The program's history of openings, made on first use after ``remember_openings``; None: none kept."""
    if program.recent_openings is None and program.keeps_openings:
        with _HISTORY:
            if program.recent_openings is None:
                size = program.keeps_openings
                program.recent_openings = RecentOpenings(DEFAULT_SIZE if size is True else int(size))
    return program.recent_openings


class CompactWriter:
    """The compact writer's decisions for a program's config (see the module's doc)."""

    name = "compact"

    def __init__(self, config):
        self.config = config

    def adapter(self, stage: str) -> dspy.Adapter | None:
        """The adapter a stage's call is laid out by; None keeps the one ``dspy.settings`` holds."""
        if stage == "generate_response" and self.reply_format() in ("chat", "scaffold", "briefed"):
            return chat_reply_adapter(exemplars=self.config.reply_exemplars,
                                      scaffold=self.reply_format() == "scaffold",
                                      briefed=self.reply_format() == "briefed", second=self.config.reply_second)
        return COMPACT if self.config.adapter == "auto" else make_adapter(self.config.adapter)

    def stage_lm(self, program, stage: str) -> dspy.LM | None:
        """The LM a stage runs on in place of its own, or None to keep it: the reply stage of a program with a
        fine-tuned writer (its ``writer_adapter`` part) runs on its embedded LM with the LoRA adapter on top
        (built once, ``trace_dspy.lm.finetune.adapted``); the earlier stages stay on the base model."""
        adapter = program.parts["writer_adapter"] if stage == "generate_response" else None
        if adapter is None:
            return None
        return adapted_lm(program.lm_for(stage), adapter.path)

    def reply_format(self) -> str:
        return "scaffold" if self.config.reply_format == "auto" else self.config.reply_format

    def best_of(self) -> int:
        return AUTO_BEST_OF if self.config.best_of == "auto" else self.config.best_of

    def prior_k(self) -> int:
        return AUTO_PRIOR_K if self.config.prior_k == "auto" else self.config.prior_k

    def prior_decides(self, lm, predictor) -> bool:
        """One candidate, a grammar that could only write it, and no other output: no LM call is needed."""
        return (self.prior_k() == 1 and lm is not None and takes_grammar(lm)
                and list(predictor.signature.output_fields) == ["emotion"])

    def plan_fitted(self, first_plan, predictor) -> bool:
        """Does the fitted first plan stand in for the planner call?"""
        return (self.config.planner == "auto" and first_plan is not None and predictor is not None
                and list(predictor.signature.output_fields) == ["strategy", "secondary_strategy"])

    exemplars_last_turn = True  # the planner's prompt is the longest the program reads per dialogue

    def reward(self, program, inputs: dict, pred) -> float:
        if program.reward_fn is not None:
            return float(program.reward_fn(inputs, pred))
        return compact_reward(program, inputs, pred)

    def selection(self, program, predictor, inputs: dict) -> tuple[ReplySelection, dict]:
        """The reply selection for the reply stage, and the inputs to call it with."""
        module, inputs = predictor, dict(inputs)
        if self.reply_format() == "scaffold":
            module = ScaffoldedReply(predictor, chat_reply_adapter(exemplars=self.config.reply_exemplars,
                                                                   scaffold=True),
                                     openers=program.reply_openers, variety=self.config.opener_variety)
            inputs["cue"] = ReplyCue(pleasant=program.situation_pleasant(inputs["dialogue"]),
                                     recent=opening_history(program))
        recent, penalty = opening_history(program), self.config.variety_penalty

        def standing(pred, reward: float) -> float:
            # With a history of openings (respond, chat), a reply that opens as many recent ones did gives way.
            if recent is None or not penalty:
                return reward
            return reward - penalty * recent.share(getattr(pred, "response", ""))

        return ReplySelection(module, lambda args, pred: self.reward(program, args, pred), n=self.best_of(),
                              threshold=self.config.best_of_threshold, standing=standing, name=predictor), inputs

    def write_reply(self, program, predictor, inputs: dict, state: dict) -> dspy.Prediction:
        """The reply stage's call: the plan race where there are fitted plans, else Best-of-N as configured."""
        selection, inputs = self.selection(program, predictor, inputs)
        plans = program.race_plans()
        if plans and "strategy" in inputs:
            recent = opening_history(program)
            return run_race(selection, inputs, plans, state,
                            on_kept=None if recent is None else lambda pred: recent.add(getattr(pred, "response", "")))
        if selection.n > 1:
            kept, state["reply_rewards"] = selection.select(inputs)
            return kept.prediction
        return selection.module(**inputs)

    def plan_reply(self, program, predictor, inputs: dict, plan) -> tuple[dspy.Prediction, float, list[float]]:
        """The reply written for ``plan`` in place of the plan in ``inputs``: kept reply, best reward, rewards."""
        selection, inputs = self.selection(program, predictor, inputs)
        return plan_reply(selection, inputs, plan)
