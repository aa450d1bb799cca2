"""The reply stage as a plain chat (``ChatReplyAdapter``): the conversation as turns, the reply as the answer."""

from __future__ import annotations

import textwrap

from trace_dspy.core.openers import WHOLE_QUESTIONS, check_openers, comma_may_follow, scaffold_kinds
from trace_dspy.core.text import words
from trace_dspy.lm.adapters import ConstrainedChatAdapter, counting_parse
from trace_dspy.lm.constraint import CONSTRAINT_KWARG, OutputConstraint
from trace_dspy.program.reply_cue import current_cue
from trace_dspy.program.reply_text import (
    clean_reply,
    first_sentence,
    openers_for,
    plan_in_words,
    question_clause,
    scaffold_openers,
    spare_openers,
    tidy_text,
)

REPLY_MAX_TOKENS = 80


def is_reply_signature(signature) -> bool:
    """The reply stage: its one output is the ``response`` text."""
    return list(signature.output_fields) == ["response"] and "dialogue" in signature.input_fields


LISTENER_ROLE = "You are a caring friend. Answer the person in one or two short sentences of your own."
# Each sentence of a scaffolded reply (see trace_dspy.program.reply_text.SCAFFOLD_OPENERS) is one call of this
# many tokens at most.
SCAFFOLD_SENTENCE_TOKENS = 32


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

    The completion is the reply (``clean_reply``). With ``scaffold``
    (``reply_format = "scaffold"``) the system line drops the plan in words and
    the reply is written one sentence per planned mechanism, each call
    continuing an opener (see ``scaffold_openers``): the stock ones, or with
    ``openers`` those a compile fitted, for the valence of the recognized
    emotion (``openers_for``). Every other stage is formatted as by DSPy's
    ChatAdapter.
    """

    def __init__(self, *args, exemplars: bool = False, scaffold: bool = False, openers=None, variety: int = 1,
                 **kwargs):
        super().__init__(*args, **kwargs)
        self.exemplars = exemplars
        self.scaffold = scaffold
        # How many of each mechanism's best openers a first reply is drawn from (ProgramConfig.opener_variety).
        self.variety = int(variety)
        # Fitted openers (valence -> mechanism -> openers, see check_openers); None: the stock ones.
        self.openers = check_openers(openers) if openers else None

    def constraint_layout(self, signature) -> str | None:
        # The reply is plain chat text: its only bound is the stop at the line break.
        return None if is_reply_signature(signature) else self.layout

    def __call__(self, lm, lm_kwargs, signature, demos, inputs):
        if is_reply_signature(signature):
            lm_kwargs = {**lm_kwargs, "stop": ["\n"], "max_tokens": min(lm_kwargs.get("max_tokens") or REPLY_MAX_TOKENS,
                                                        REPLY_MAX_TOKENS)}
            if self.scaffold:
                return self._scaffolded(lm, lm_kwargs, signature, demos, inputs)
        return super().__call__(lm, lm_kwargs, signature, demos, inputs)

    def _scaffolded(self, lm, lm_kwargs, signature, demos, inputs):
        """One LM call per sentence: each continues its opener after the sentences written so far."""
        messages = self.format(signature, demos, inputs)
        # dspy.BestOfN numbers its samples by rollout id from 0; the first reply (no rollout id) is candidate 0.
        rollout = lm_kwargs.get("rollout_id", lm.kwargs.get("rollout_id"))
        candidate = 0 if rollout is None else int(rollout) + 1
        kwargs = {**lm_kwargs, "max_tokens": min(lm_kwargs["max_tokens"], SCAFFOLD_SENTENCE_TOKENS)}
        if getattr(lm, "takes_output_constraint", False):  # only the first sentence is kept: stop after it
            kwargs[CONSTRAINT_KWARG] = OutputConstraint.plain_text("response", max_sentences=1)
        said: list[str] = []
        cue = current_cue()
        table = openers_for(inputs, self.openers, cue.band)
        leads = scaffold_openers(inputs, candidate, table, self.variety, cue.recent)
        # Openers to try once in the place of one the model does not go on from: a reply that only asks ("How are
        # you feeling about that?" to a father's all-clear), or only acknowledges, reads curt.
        spares = spare_openers(inputs, candidate, table, self.variety, cue.recent)
        for kind, opener, spare in zip(scaffold_kinds(inputs), leads, spares):
            question = kind == "EX"
            sentence = self._sentence(lm, messages, said, opener, question, kwargs)
            if sentence is None and spare != opener:
                sentence = self._sentence(lm, messages, said, spare, question, kwargs)
            if sentence is not None:
                said.append(sentence)
        if not said:  # the model went on from no opener: ask for the whole reply instead (the chat layout)
            return super().__call__(lm, lm_kwargs, signature, demos, inputs)
        return self._call_postprocess(signature, signature, [" ".join(said)], lm, lm_kwargs)

    @staticmethod
    def _sentence(lm, messages, said: list[str], opener: str, question: bool, kwargs) -> str | None:
        """The sentence begun with ``opener`` after the sentences ``said`` (``question``: the plan's question, EX);
        None where it is left out."""
        from dspy.clients._deprecation import adapter_message_call

        if question and opener in WHOLE_QUESTIONS:
            return f"{opener}?"
        call = [*messages, {"role": "assistant", "content": " ".join([*said, opener])}]
        with adapter_message_call(lm, call):
            outputs = lm(messages=call, **kwargs)
        text = outputs[0].get("text") if isinstance(outputs[0], dict) else outputs[0]
        if str(text or "").lstrip().startswith(",") and not comma_may_follow(opener):
            return None  # it did not go on from the opener
        sentence = first_sentence(f"{opener}{text or ''}", opener)
        if question:
            sentence = question_clause(sentence, opener)
        # Cleaned with what was said before, as the whole reply will be: a run of words said again is cut
        # ("... the part you wanted to play. I can imagine how you wanted to play" keeps "I can imagine how").
        if said:
            before = " ".join(said)
            together = clean_reply(f"{before} {sentence}")
            if together.startswith(before):
                sentence = together[len(before):].strip()
        # Left out: an opener the model did not go on from, and a question opener it made a statement of
        # ("What happened next was sad.").
        if len(words(sentence)) > len(words(opener)) and (not question or sentence.endswith("?")):
            return sentence
        return None

    def format(self, signature, demos, inputs):
        if not is_reply_signature(signature):
            return super().format(signature, demos, inputs)
        from trace_dspy.core.dialogue import LISTENER, last_speaker_turn, parse_dialogue, split_exemplar

        # Compiled instructions are the writer's; the stock ones describe the field layout.
        instructions = textwrap.dedent(signature.instructions).strip()
        stock = textwrap.dedent(_stock_instructions()).strip()
        lead = LISTENER_ROLE if instructions == stock else instructions
        # Scaffolded, the openers carry the plan; in words it would only lengthen the prompt.
        system = lead if self.scaffold else f"{lead} {plan_in_words(inputs)}".strip()
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

    def parse(self, signature, completion):
        return counting_parse(self._parse, signature, completion)

    def _parse(self, signature, completion):
        if not is_reply_signature(signature):
            return super().parse(signature, completion)
        reply = clean_reply(completion)
        if not reply:
            from dspy.utils.exceptions import AdapterParseError

            raise AdapterParseError(adapter_name="ChatReplyAdapter", signature=signature, lm_response=completion,
                                    message="the reply was empty after removing role prefixes and loops")
        return {"response": reply}


_CHAT_REPLY: dict[tuple[bool, bool, int], ChatReplyAdapter] = {}


def chat_reply_adapter(*, exemplars: bool = False, scaffold: bool = False, variety: int = 1) -> ChatReplyAdapter:
    """A shared ChatReplyAdapter (it holds no per-call state, like the compact adapter)."""
    key = (bool(exemplars), bool(scaffold), int(variety))
    if key not in _CHAT_REPLY:  # a race makes an equal one at worst
        _CHAT_REPLY[key] = ChatReplyAdapter(exemplars=key[0], scaffold=key[1], variety=key[2])
    return _CHAT_REPLY[key]


def _stock_instructions() -> str:
    from trace_dspy.signatures import STAGE_SIGNATURES

    return STAGE_SIGNATURES["generate_response"].instructions
