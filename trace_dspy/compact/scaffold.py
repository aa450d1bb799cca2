"""The scaffolded reply as a DSPy module: one LM call per sentence, each going on from an opener.

``ScaffoldedReply`` wraps the reply stage's predictor (its signature, instructions and demos are the ones a
compile fits and an artifact stores) and writes the reply a sentence at a time: one sentence per planned
mechanism, each begun with an opener the model goes on from (``trace_dspy.compact.reply_text``). The calls go
through ``ChatReplyAdapter``, which only formats and parses. What the openers depend on besides the stage's
inputs (the situation's tone band, the history of openings) comes in as a ``ReplyCue`` argument.

Like ``dspy.Predict`` it records one trace entry per reply, under the wrapped predictor, so that optimizers
find the reply as that predictor's demo.
"""

from __future__ import annotations

import dspy

from trace_dspy.compact.openers import WHOLE_QUESTIONS, comma_may_follow, scaffold_kinds
from trace_dspy.compact.reply_adapter import (
    CONTINUATION,
    SO_FAR,
    ChatReplyAdapter,
    continuation_signature,
    reply_bounds,
)
from trace_dspy.compact.reply_cue import ReplyCue
from trace_dspy.compact.reply_text import (
    clean_reply,
    first_sentence,
    openers_for,
    question_clause,
    scaffold_openers,
    spare_openers,
)
from trace_dspy.core.labels import check_openers
from trace_dspy.core.text import words

# Each sentence of a scaffolded reply is one call of this many tokens at most.
SCAFFOLD_SENTENCE_TOKENS = 32


class ScaffoldedReply(dspy.Module):
    """The reply written one sentence per planned mechanism, each continuing an opener.

    ``predictor``: the reply stage's ``dspy.Predict`` (not a sub-module of this one: the program owns it).
    ``openers``: fitted openers (valence -> mechanism -> openers); None: the stock ones. ``variety``: how many
    of each mechanism's best openers a first reply is drawn from (``ProgramConfig.opener_variety``).
    Call it with the reply stage's inputs and ``cue``. Under ``dspy.BestOfN`` (an LM with a ``rollout_id``)
    candidate n + 1 takes the next openers.
    """

    def __init__(self, predictor: dspy.Predict, adapter: ChatReplyAdapter, *, openers=None, variety: int = 1):
        super().__init__()
        self._predictor = predictor  # held, not a sub-module: its demos are saved under the program's name
        self.adapter = adapter
        self.openers = check_openers(openers) if openers else None
        self.variety = int(variety)

    def forward(self, cue: ReplyCue | None = None, **inputs) -> dspy.Prediction:
        predictor = self._predictor
        lm = predictor.lm or dspy.settings.lm
        if lm is None:
            raise ValueError("No LM is loaded: configure one with dspy.configure(lm=...)")
        signature, demos = predictor.signature, predictor.demos
        lm_kwargs = reply_bounds(dict(predictor.config))
        said = self._sentences(lm, lm_kwargs, signature, demos, inputs, cue or ReplyCue())
        if said:
            pred = dspy.Prediction(**self.adapter.parse(signature, " ".join(said)))
        else:  # the model went on from no opener: ask for the whole reply instead (the chat layout)
            pred = dspy.Prediction(**self.adapter(lm, lm_kwargs, signature, demos, inputs)[0])
        trace = dspy.settings.trace
        if trace is not None:
            trace.append((predictor, dict(inputs), pred))
        return pred

    def _sentences(self, lm, lm_kwargs: dict, signature, demos, inputs: dict, cue: ReplyCue) -> list[str]:
        """The sentences kept, in order: each mechanism's opener, or its spare once where the model did not go
        on from the first (a reply that only asks, or only acknowledges, reads curt)."""
        # dspy.BestOfN numbers its samples by rollout id from 0; the first reply (no rollout id) is candidate 0.
        rollout = lm_kwargs.get("rollout_id", lm.kwargs.get("rollout_id"))
        candidate = 0 if rollout is None else int(rollout) + 1
        call = _SentenceCall(self.adapter, lm, {**lm_kwargs, "max_tokens": min(lm_kwargs["max_tokens"],
                                                                                SCAFFOLD_SENTENCE_TOKENS)},
                             continuation_signature(signature), demos, inputs)
        table = openers_for(inputs, self.openers, cue.band)
        leads = scaffold_openers(inputs, candidate, table, self.variety, cue.recent)
        spares = spare_openers(inputs, candidate, table, self.variety, cue.recent)
        said: list[str] = []
        for kind, opener, spare in zip(scaffold_kinds(inputs), leads, spares):
            question = kind == "EX"
            sentence = call.sentence(said, opener, question)
            if sentence is None and spare != opener:
                sentence = call.sentence(said, spare, question)
            if sentence is not None:
                said.append(sentence)
        return said


class _SentenceCall:
    """One scaffolded reply's sentence calls: the same chat, the reply so far growing."""

    def __init__(self, adapter: ChatReplyAdapter, lm, lm_kwargs: dict, signature, demos, inputs: dict):
        self.adapter, self.lm, self.lm_kwargs = adapter, lm, lm_kwargs
        self.signature, self.demos, self.inputs = signature, demos, inputs

    def sentence(self, said: list[str], opener: str, question: bool) -> str | None:
        """The sentence begun with ``opener`` after the sentences ``said`` (``question``: the plan's question,
        EX); None where it is left out."""
        if question and opener in WHOLE_QUESTIONS:
            return f"{opener}?"
        inputs = {**self.inputs, SO_FAR: " ".join([*said, opener])}
        outputs = self.adapter(self.lm, dict(self.lm_kwargs), self.signature, self.demos, inputs)
        text = outputs[0].get(CONTINUATION) or ""
        if str(text).lstrip().startswith(",") and not comma_may_follow(opener):
            return None  # it did not go on from the opener
        sentence = first_sentence(f"{opener}{text}", opener)
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
