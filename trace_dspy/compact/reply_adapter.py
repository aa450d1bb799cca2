"""The reply stage as a plain chat (``ChatReplyAdapter``): the conversation as turns, the reply as the answer.

The adapter only formats and parses. The scaffolded reply's sentences are separate calls, which
``trace_dspy.compact.scaffold.ScaffoldedReply`` makes; each one goes through this adapter with the
continuation signature (``continuation_signature``): the same chat, then the reply so far as the
assistant's unfinished turn.
"""

from __future__ import annotations

import textwrap

import dspy

from trace_dspy.compact.reply_text import clean_reply, plan_in_words, tidy_text
from trace_dspy.lm.adapters import ConstrainedChatAdapter, counting_parse
from trace_dspy.lm.constraint import CONSTRAINT_KWARG, OutputConstraint

REPLY_MAX_TOKENS = 80
# The input that carries a scaffolded reply's words so far, and the output that is their raw continuation.
SO_FAR = "reply_so_far"
CONTINUATION = "continuation"


def is_reply_signature(signature) -> bool:
    """The reply stage: its one output is the ``response`` text."""
    return list(signature.output_fields) == ["response"] and "dialogue" in signature.input_fields


def is_continuation_signature(signature) -> bool:
    """A scaffolded sentence's call: the reply stage's inputs and the reply so far; its output, the raw text."""
    return list(signature.output_fields) == [CONTINUATION] and SO_FAR in signature.input_fields


def continuation_signature(signature) -> type[dspy.Signature]:
    """The reply stage's ``signature`` (its instructions kept) turned into a scaffolded sentence's call."""
    return (signature.delete("response")
            .append(SO_FAR, dspy.InputField(desc="The reply so far, ending with the opener to go on from."), type_=str)
            .append(CONTINUATION, dspy.OutputField(desc="What follows the reply so far."), type_=str))


def reply_bounds(lm_kwargs: dict) -> dict:
    """A reply call's keywords: it stops at the line break, after at most ``REPLY_MAX_TOKENS``."""
    return {**lm_kwargs, "stop": ["\n"],
            "max_tokens": min(lm_kwargs.get("max_tokens") or REPLY_MAX_TOKENS, REPLY_MAX_TOKENS)}


LISTENER_ROLE = "You are a caring friend. Answer the person in one or two short sentences of your own."


class ChatReplyAdapter(ConstrainedChatAdapter):
    """The reply stage as a plain chat: the conversation as user/assistant turns, the reply as the answer.

    A 135M chat model answers a message sensibly in its own chat format but
    loses its way in DSPy's multi-field layout (it repeats the speaker's turn or
    the field markers). For the reply stage this adapter sends:

    - a one-line system message: a caring-friend lead (or the stage's
      instructions once they are compiled), the planned mechanisms in words,
      and, when the reflection loop redoes the reply, its audit note;
    - each demo as a user turn (the speaker's last words) and an assistant
      turn (the demo's reply);
    - with ``exemplars`` (``ProgramConfig.reply_exemplars``), each retrieved
      exemplar the same way, written as prose (``tidy_text``): the nearest
      conversations of the pool teach a small model the tone of a reply to
      this kind of message;
    - the conversation itself, speaker turns as user messages and listener
      turns as assistant messages.

    The completion is the reply (``clean_reply``; with ``second="question"``,
    ``ProgramConfig.reply_second``, a second sentence only where it asks). With ``scaffold``
    (``reply_format = "scaffold"``) the system line drops the plan in words:
    the openers of the scaffolded sentences carry it. With ``briefed``
    (``reply_format = "briefed"``, the layout a fine-tuned writer learns:
    ``trace_dspy.compact.finetune``) it names the recognized emotion before the
    plan. A continuation call
    (``continuation_signature``) sends the same chat with the reply so far as
    the assistant's last, unfinished turn, and its completion is returned as
    written. Every other stage is formatted as by DSPy's ChatAdapter.
    """

    def __init__(self, *args, exemplars: bool = False, scaffold: bool = False, briefed: bool = False,
                 second: str = "any", **kwargs):
        super().__init__(*args, **kwargs)
        self.exemplars = exemplars
        self.scaffold = scaffold
        self.briefed = briefed
        self.second = second

    def constraint_layout(self, signature) -> str | None:
        # The reply is plain chat text: its only bound is the stop at the line break.
        return None if is_reply_signature(signature) or is_continuation_signature(signature) else self.layout

    def _constrained(self, lm, lm_kwargs, signature, inputs):
        if is_continuation_signature(signature) and getattr(lm, "takes_output_constraint", False):
            # A scaffolded sentence: only its first sentence is kept, so decoding stops after it.
            return {**lm_kwargs, CONSTRAINT_KWARG: OutputConstraint.plain_text("response", max_sentences=1)}
        return super()._constrained(lm, lm_kwargs, signature, inputs)

    def __call__(self, lm, lm_kwargs, signature, demos, inputs):
        if is_reply_signature(signature):
            lm_kwargs = reply_bounds(lm_kwargs)
        return super().__call__(lm, lm_kwargs, signature, demos, inputs)

    def format(self, signature, demos, inputs):
        if is_continuation_signature(signature):
            return [*self._chat(signature, demos, inputs), {"role": "assistant", "content": inputs[SO_FAR]}]
        if not is_reply_signature(signature):
            return super().format(signature, demos, inputs)
        return self._chat(signature, demos, inputs)

    def _chat(self, signature, demos, inputs) -> list[dict]:
        from trace_dspy.core.dialogue import LISTENER, last_speaker_turn, parse_dialogue, split_exemplar

        # Compiled instructions are the writer's; the stock ones describe the field layout.
        instructions = textwrap.dedent(signature.instructions).strip()
        stock = textwrap.dedent(_stock_instructions()).strip()
        lead = LISTENER_ROLE if instructions == stock else instructions
        # Scaffolded, the openers carry the plan; in words it would only lengthen the prompt.
        system = lead if self.scaffold else f"{lead} {self._brief(inputs)}{plan_in_words(inputs)}".strip()
        note = str(inputs.get("revision_note") or "").strip()
        if note:  # the reflection loop's audit of an earlier reply
            system += f" Your last reply was not right: {note}"
        messages = [{"role": "system", "content": system}]
        pairs = [(demo["dialogue"], str(demo["response"])) for demo in demos
                 if demo.get("dialogue") and demo.get("response")]
        if self.exemplars:
            exemplars = (split_exemplar(text) for text in inputs.get("exemplars") or [] if isinstance(text, str))
            pairs += [pair for pair in exemplars if pair is not None]
        for dialogue, reply in pairs:
            try:
                said = last_speaker_turn(dialogue)
            except ValueError:  # not a dialogue: nothing to show
                continue
            if said:
                messages += [{"role": "user", "content": tidy_text(said)},
                             {"role": "assistant", "content": tidy_text(reply)}]
        for turn in parse_dialogue(inputs["dialogue"]):
            messages.append({"role": "assistant" if turn.role == LISTENER else "user", "content": turn.text})
        return messages

    def _brief(self, inputs) -> str:
        """The briefed layout's words on the emotion ("They feel lonely. "); empty in the other layouts."""
        emotion = str(inputs.get("emotion") or "").strip().lower()
        return f"They feel {emotion}. " if self.briefed and emotion else ""

    def parse(self, signature, completion):
        return counting_parse(self._parse, signature, completion)

    def _parse(self, signature, completion):
        if is_continuation_signature(signature):
            return {CONTINUATION: completion}
        if not is_reply_signature(signature):
            return super().parse(signature, completion)
        reply = clean_reply(completion, self.second)
        if not reply:
            from dspy.utils.exceptions import AdapterParseError

            raise AdapterParseError(adapter_name="ChatReplyAdapter", signature=signature, lm_response=completion,
                                    message="the reply was empty after removing role prefixes and loops")
        return {"response": reply}


_CHAT_REPLY: dict[tuple[bool, bool, bool, str], ChatReplyAdapter] = {}


def chat_reply_adapter(*, exemplars: bool = False, scaffold: bool = False, briefed: bool = False,
                       second: str = "any") -> ChatReplyAdapter:
    """A shared ChatReplyAdapter (it holds no per-call state)."""
    key = (bool(exemplars), bool(scaffold), bool(briefed), str(second))
    if key not in _CHAT_REPLY:  # a race makes an equal one at worst
        _CHAT_REPLY[key] = ChatReplyAdapter(exemplars=key[0], scaffold=key[1], briefed=key[2], second=key[3])
    return _CHAT_REPLY[key]


def _stock_instructions() -> str:
    from trace_dspy.signatures import STAGE_SIGNATURES

    return STAGE_SIGNATURES["generate_response"].instructions
