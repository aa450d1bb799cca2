"""Signatures of the comparison systems used by ``python -m trace_dspy.bench``.

``SingleCallEmpathy`` is the single-call baseline: one prompt goes from the
dialogue straight to the reply (wrapped in ``dspy.ChainOfThought``, so it also
reasons first). It names the emotion in the same call, so that the baseline is
scored on the same emotion metrics as the staged program.

``PAPER_INSTRUCTIONS`` restates, in this project's own words, what the TRACE
paper's four agents are told to do (see docs/results/quality.md); the bench applies
them to an uncompiled TraceProgram to get the "TRACE as published" system.
"""

from __future__ import annotations

import dspy

from trace_dspy.core.labels import EmotionLabel


class SingleCallEmpathy(dspy.Signature):
    """You are the listener in a conversation. Work out how the speaker feels and why,
    then write an empathetic reply of one or two sentences that responds to what they
    said."""

    dialogue: str = dspy.InputField(
        desc="The conversation so far, one 'Speaker:' or 'Listener:' line per turn; the last line is the speaker's."
    )
    emotion: EmotionLabel = dspy.OutputField(desc="The speaker's emotion, one label from the allowed set.")
    response: str = dspy.OutputField(desc="The listener's reply.")


# Stage name -> instruction. Paraphrases of the published agents' requirements
# (Affective State Identifier, Causal Analysis Engine, Strategic Response
# Planner, Empathetic Response Synthesizer); not the paper's wording.
PAPER_INSTRUCTIONS: dict[str, str] = {
    "recognize_emotion": (
        "Act as an affective state identifier. Study the conversation between a seeker and a "
        "responder, reason step by step about what the seeker is going through, and give the one "
        "emotion label that best describes the seeker."
    ),
    "analyze_cause": (
        "Act as a causal analysis engine. Given the conversation and the seeker's emotion, quote "
        "one or two sentences from the seeker that triggered it, exactly as written; summarise "
        "the cause in a single sentence; and assign one of the six cause categories."
    ),
    "plan_strategy": (
        "Act as a strategic response planner. Using the conversation, the emotion, the cause "
        "analysis and the retrieved example conversations, reason about what the seeker needs "
        "and choose the primary empathy strategy (ER emotional reaction, IP interpretation, or "
        "EX exploration) plus a secondary one. Do not write the reply itself."
    ),
    "generate_response": (
        "Act as an empathetic response synthesizer. Write the responder's next turn: start with "
        "the chosen primary strategy and blend in the secondary one, reuse one concrete detail "
        "from the trigger sentences, keep it to one or two sentences, match the tone of the "
        "examples in your own words, and give no advice the seeker did not ask for."
    ),
}

# The published planner and identifier reason before they answer.
PAPER_REASONING_STAGES: tuple[str, ...] = ("recognize_emotion", "plan_strategy")
