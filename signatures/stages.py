"""The four TRACE stages as typed signatures.

Analysis comes first (emotion, then its cause), planning next, and the reply
last. Closed label sets are ``Literal`` types, so an answer outside the set is
a parse error the caller sees, never a silent default.
"""

from __future__ import annotations

from typing import Literal

import dspy

from trace_dspy.core.labels import CauseCategory, EmotionLabel, Strategy
from trace_dspy.core.stages import AUDITABLE_STAGES, REGISTRY

_DIALOGUE_DESC = (
    "The conversation so far, one 'Speaker:' or 'Listener:' line per turn; "
    "the last line is the speaker's."
)
_EXEMPLARS_DESC = (
    "Similar past conversations with the reply a good listener gave; follow their tone, "
    "never copy their wording. May be empty."
)


class RecognizeEmotion(dspy.Signature):
    """Read the conversation as an attentive listener and decide which single emotion the
    speaker is feeling about the situation they describe. Judge from the speaker's own
    words and the events they report, not from the listener's turns. Answer with exactly
    one of the allowed emotion labels."""

    dialogue: str = dspy.InputField(desc=_DIALOGUE_DESC)
    emotion: EmotionLabel = dspy.OutputField(desc="The speaker's emotion, one label from the allowed set.")


class AnalyzeCause(dspy.Signature):
    """Find out why the speaker feels the given emotion. Copy, word for word, the one or
    two sentences from the speaker's turns that best show what triggered the feeling;
    then state the cause in one short sentence of your own, and file it under one of the
    six cause categories."""

    dialogue: str = dspy.InputField(desc=_DIALOGUE_DESC)
    emotion: EmotionLabel = dspy.InputField(desc="The speaker's emotion, from the previous stage.")
    trigger_spans: list[str] = dspy.OutputField(
        desc="One or two sentences quoted verbatim from the speaker's turns."
    )
    cause_summary: str = dspy.OutputField(desc="One sentence: what caused the emotion.")
    cause_category: CauseCategory = dspy.OutputField(desc="The category the cause belongs to.")


class PlanStrategy(dspy.Signature):
    """Choose how the listener should show empathy in the next reply, using the EPITOME
    mechanisms: ER (Emotional Reaction: voice warmth, compassion or concern), IP
    (Interpretation: show that you understand the feeling or the experience behind it),
    or EX (Exploration: ask a specific, gentle question that invites the speaker to say
    more). Pick the primary mechanism that fits this speaker, emotion and cause best, and
    a different secondary one to blend in. Only plan: do not write the reply."""

    dialogue: str = dspy.InputField(desc=_DIALOGUE_DESC)
    emotion: EmotionLabel = dspy.InputField(desc="The speaker's emotion.")
    trigger_spans: list[str] = dspy.InputField(desc="Sentences of the speaker's that triggered the emotion.")
    cause_summary: str = dspy.InputField(desc="What caused the emotion.")
    cause_category: CauseCategory = dspy.InputField(desc="The category of the cause.")
    exemplars: list[str] = dspy.InputField(desc=_EXEMPLARS_DESC)
    strategy: Strategy = dspy.OutputField(desc="The primary mechanism: ER, IP or EX.")
    secondary_strategy: Strategy = dspy.OutputField(
        desc="A different mechanism to blend in: ER, IP or EX."
    )


class GenerateResponse(dspy.Signature):
    """Write the listener's next reply to the speaker. Use one or two sentences. Open with
    the planned primary strategy and weave in the secondary one. Mention one concrete
    detail from the trigger sentences so the speaker knows they were heard. Use your own
    words, in the tone of the exemplars without copying them, and do not give advice the
    speaker did not ask for."""

    dialogue: str = dspy.InputField(desc=_DIALOGUE_DESC)
    emotion: EmotionLabel = dspy.InputField(desc="The speaker's emotion.")
    trigger_spans: list[str] = dspy.InputField(desc="Sentences of the speaker's that triggered the emotion.")
    cause_summary: str = dspy.InputField(desc="What caused the emotion.")
    cause_category: CauseCategory = dspy.InputField(desc="The category of the cause.")
    strategy: Strategy = dspy.InputField(desc="The primary mechanism to open with.")
    secondary_strategy: Strategy = dspy.InputField(desc="The mechanism to blend in.")
    exemplars: list[str] = dspy.InputField(desc=_EXEMPLARS_DESC)
    response: str = dspy.OutputField(desc="The reply: one or two sentences, no unsolicited advice.")


# ---------------------------------------------------------------- optional stages


class InferCommonsense(dspy.Signature):
    """Reason about the speaker the way a commonsense knowledge base (ATOMIC) would. From
    what the speaker said and the emotion they feel, infer briefly: what they intended
    (xIntent), what they needed beforehand (xNeed), what they want next (xWant), how the
    event affects them (xEffect), and how they react inside (xReact). One short phrase each."""

    dialogue: str = dspy.InputField(desc=_DIALOGUE_DESC)
    emotion: EmotionLabel = dspy.InputField(desc="The speaker's emotion.")
    x_intent: str = dspy.OutputField(desc="Why the speaker did what they describe.")
    x_need: str = dspy.OutputField(desc="What the speaker needed before it happened.")
    x_want: str = dspy.OutputField(desc="What the speaker wants now.")
    x_effect: str = dspy.OutputField(desc="What the event does to the speaker.")
    x_react: str = dspy.OutputField(desc="How the speaker feels inside about it.")


AuditTarget = Literal[("none", *AUDITABLE_STAGES)]  # type: ignore[valid-type]


class AuditReply(dspy.Signature):
    """Audit the whole analysis and the reply before it is sent. Check: is the emotion
    consistent with what the speaker said; are the trigger sentences really quoted from
    the speaker; does the reply follow the planned strategy; does it reuse a concrete
    detail; does it avoid giving advice. Name the earliest stage that went wrong (or none)
    and say in one sentence what to fix."""

    dialogue: str = dspy.InputField(desc=_DIALOGUE_DESC)
    emotion: EmotionLabel = dspy.InputField(desc="The emotion the first stage recognised.")
    trigger_spans: list[str] = dspy.InputField(desc="The sentences the cause stage quoted.")
    cause_summary: str = dspy.InputField(desc="The cause the cause stage found.")
    strategy: Strategy = dspy.InputField(desc="The planned primary mechanism.")
    secondary_strategy: Strategy = dspy.InputField(desc="The planned secondary mechanism.")
    response: str = dspy.InputField(desc="The reply to audit.")
    emotion_consistent: bool = dspy.OutputField()
    spans_quoted: bool = dspy.OutputField()
    strategy_followed: bool = dspy.OutputField()
    detail_reused: bool = dspy.OutputField()
    advice_avoided: bool = dspy.OutputField()
    faulty_stage: AuditTarget = dspy.OutputField(desc="The earliest stage to redo, or none.")
    critique: str = dspy.OutputField(desc="One sentence: what the redone stage must change.")


# Stage name -> signature, in pipeline order, from the stage registry (trace_dspy.core.stages). The names are
# the program's predictor attribute names and therefore the compiled artifact's schema.
STAGE_SIGNATURES: dict[str, type[dspy.Signature]] = {s.name: globals()[s.signature] for s in REGISTRY if s.core}
OPTIONAL_SIGNATURES: dict[str, type[dspy.Signature]] = {s.name: globals()[s.signature] for s in REGISTRY
                                                        if not s.core}
