"""This project's adapters: they pass each call's output constraint, and a compact chat layout for small models.

Every adapter here passes the stage signature's ``OutputConstraint`` with the LM call
(``trace_dspy.lm.constraint``), so that a grammar-constrained LM decodes the fields and types the signature
declares, however the prompt is worded.


DSPy's ChatAdapter spends many tokens on layout: a template of every field,
type notes repeated in the system and the user message. A 135M model reads
that slowly and tends to copy the template placeholders. When decoding is
grammar-constrained (the embedded engine, or a llama.cpp server with
``server_grammar``), the layout is enforced anyway, so this adapter keeps the
instructions first, lists the fields once, and drops the per-call reminder.
Replies use the same ``[[ ## field ## ]]`` sections, so ChatAdapter's parser,
demos and fallbacks apply unchanged.
"""

from __future__ import annotations

import re
import textwrap
import threading
from collections import Counter

import dspy

from trace_dspy.lm.constraint import constraint_kwargs

# Replies this project's adapters could not parse, counted where the parse fails (the adapter then falls back
# to DSPy's JSONAdapter, one more LM call). Keyed by the signature's name; read with parse_failures().
_PARSE_FAILURES: Counter[str] = Counter()
_PARSE_LOCK = threading.Lock()


def parse_failures() -> dict[str, int]:
    """A snapshot of the parse failures counted so far, by signature name (benchmarks read differences)."""
    with _PARSE_LOCK:
        return dict(_PARSE_FAILURES)


def _counting_parse(parse, signature, completion):
    try:
        return parse(signature, completion)
    except Exception:
        with _PARSE_LOCK:
            _PARSE_FAILURES[getattr(signature, "__name__", "signature")] += 1
        raise


class _Constraining:
    """Adds the call's output constraint (``layout``: how the reply is laid out) to the LM keywords."""

    layout = "sections"

    def constraint_layout(self, signature) -> str | None:
        """The layout to constrain this signature's reply to; None leaves the call unconstrained."""
        return self.layout

    def _constrained(self, lm, lm_kwargs, signature, inputs):
        return constraint_kwargs(lm, lm_kwargs, signature, inputs, self.constraint_layout(signature))

    def __call__(self, lm, lm_kwargs, signature, demos, inputs):
        return super().__call__(lm, self._constrained(lm, lm_kwargs, signature, inputs), signature, demos, inputs)

    async def acall(self, lm, lm_kwargs, signature, demos, inputs):
        return await super().acall(lm, self._constrained(lm, lm_kwargs, signature, inputs), signature, demos,
                                   inputs)


class ConstrainedJSONAdapter(_Constraining, dspy.JSONAdapter):
    """DSPy's JSONAdapter, passing the output constraint of its JSON layout."""

    layout = "json"


class ConstrainedChatAdapter(_Constraining, dspy.ChatAdapter):
    """DSPy's ChatAdapter, passing the output constraint; its JSON fallback passes the JSON layout's."""

    def _make_json_adapter_fallback(self):
        return ConstrainedJSONAdapter(use_native_function_calling=self.use_native_function_calling,
                                      parallel_tool_calls=self.parallel_tool_calls)


class CompactChatAdapter(ConstrainedChatAdapter):
    """The chat layout in fewer tokens: instructions first, the fields listed once, no per-call reminder."""

    def parse(self, signature, completion):
        return _counting_parse(super().parse, signature, completion)

    def format_system_message(self, signature) -> str:
        instructions = textwrap.dedent(signature.instructions).strip()
        return (
            f"{instructions}\n\n"
            f"{self.format_field_description(signature)}\n"
            "Answer with each output field under its [[ ## name ## ]] header, in order, "
            "then [[ ## completed ## ]]."
        )

    def user_message_output_requirements(self, signature) -> str:
        return ""


_COMPACT = CompactChatAdapter()
ADAPTERS = {"chat": ConstrainedChatAdapter, "compact": CompactChatAdapter, "json": ConstrainedJSONAdapter}


def make_adapter(name: str) -> dspy.Adapter:
    try:
        return ADAPTERS[name]()
    except KeyError:
        raise ValueError(f"unknown adapter {name!r}; choose from {', '.join(ADAPTERS)}") from None


def is_constrained(lm) -> bool:
    """Does this LM enforce the reply layout with a grammar?"""
    from trace_dspy.lm.engine import LlamaEngine
    from trace_dspy.lm.specs import GrammarLM

    if isinstance(lm, GrammarLM):
        return True
    engine = getattr(lm, "engine", None)
    return isinstance(engine, LlamaEngine) and engine.constrained


def choose_adapter(choice: str, lm) -> dspy.Adapter | None:
    """The adapter for a stage call; None keeps whatever dspy.settings holds."""
    if choice == "auto":
        return _COMPACT if lm is not None and is_constrained(lm) else None
    return make_adapter(choice)


# ---------------------------------------------------------------- chat-native reply

# How each planned mechanism is asked for, in words a small chat model follows.
_STRATEGY_WORDS = {
    "ER": "say warmly how you feel for them",
    "IP": "show that you understand what they feel and why",
    "EX": "ask one gentle question about what happened",
}
_ROLE_PREFIX = re.compile(r"^\s*(?:(?:speaker|listener|assistant|user|reply|response)\s*(?:\(reply\))?\s*:\s*)+",
                          re.IGNORECASE)
_SENTENCE = re.compile(r"[^.!?]*[.!?]+|[^.!?]+$")
REPLY_MAX_TOKENS = 80


def is_reply_signature(signature) -> bool:
    """The reply stage: its one output is the ``response`` text."""
    return list(signature.output_fields) == ["response"] and "dialogue" in signature.input_fields


LISTENER_ROLE = "You are a caring friend. Answer the person in one or two short sentences of your own."

# The scaffolded reply (reply_format "scaffold"): one sentence per planned mechanism, each begun with an
# opener the model goes on from. Asked for a whole reply, SmolLM2-135M mostly answers "I'm sorry for your
# loss." whatever happened (docs/benchmarks.md, "Scaffolded replies"); begun with "You must be feeling" it
# names a fitting feeling itself ("... really disappointed." to a failed driving test). The first opener of
# each mechanism is the first reply's; further candidates (rollout 1, 2, ...) take the next ones.
SCAFFOLD_OPENERS = {
    "ER": ("That sounds", "Oh, that is", "I'm so"),
    "IP": ("You must be feeling", "I can imagine how", "It must be"),
    "EX": ("How are you feeling", "What happened", "How did"),
}
SCAFFOLD_SENTENCE_TOKENS = 32

# The openers a compile may choose from with --opener-items (trace_dspy.optimize.openers ranks them by the metric
# on training dialogues, separately for pleasant and unpleasant emotions, and stores the ranking in the
# artifact). The stock openers come first; the others range from neutral to toned, and a toned one may only
# answer its own valence (TONED_OPENERS).
OPENER_POOL = {
    "ER": ("That sounds", "Oh, that is", "I'm so", "Oh no, that sounds", "I'm so sorry", "That's so",
           "Wow, that", "I'm really glad"),
    "IP": ("You must be feeling", "I can imagine how", "It must be", "You must have been", "I know how",
           "That must have been"),
    "EX": ("How are you feeling", "What happened", "How did", "How are you", "What did you", "Do you"),
}
# Openers with a tone, and the only valence they may answer: nobody should hear "Oh no" about good news, whatever
# a metric says (the compile's first fit on ED ranked "Oh no, that sounds" first for pleasant emotions too, on
# the strength of a few dialogues). The others are neutral; the model gives them their tone.
TONED_OPENERS = {"Oh no, that sounds": "negative", "I'm so sorry": "negative",
                 "Wow, that": "positive", "I'm really glad": "positive"}


def opener_suits(opener: str, valence: str) -> bool:
    """May ``opener`` begin a reply to an emotion of ``valence`` ("any" takes neutral openers only)?"""
    tone = TONED_OPENERS.get(opener)
    return tone is None or tone == valence


# Fitted openers are kept per valence of the recognized emotion; "any" is the ranking over all dialogues, for an
# emotion outside the 32 labels.
OPENER_VALENCES = ("positive", "negative", "any")
MAX_OPENERS = 8
MAX_OPENER_CHARS = 40
_PLEASANT_GROUPS = ("happiness", "surprise")


def emotion_valence(emotion) -> str:
    """"positive" for the happiness and surprise groups, "negative" for the other four, "any" for no label."""
    from trace_dspy.core.labels import EMOTION_TO_GROUP

    group = EMOTION_TO_GROUP.get(str(emotion or "").strip().lower())
    if group is None:
        return "any"
    return "positive" if group in _PLEASANT_GROUPS else "negative"


def check_openers(openers) -> dict[str, dict[str, tuple[str, ...]]]:
    """Fitted openers as stored (valence -> mechanism -> openers, best first), checked; ValueError says what
    is wrong. Mechanisms a valence leaves out keep the stock openers."""
    if not isinstance(openers, dict):
        raise ValueError(f"reply openers must be a table of valences, not {type(openers).__name__}")
    checked: dict[str, dict[str, tuple[str, ...]]] = {}
    for valence, table in openers.items():
        if valence not in OPENER_VALENCES:
            raise ValueError(f"reply openers: unknown valence {valence!r}; expected {', '.join(OPENER_VALENCES)}")
        if not isinstance(table, dict):
            raise ValueError(f"reply openers[{valence!r}] must be a table of mechanisms")
        checked[valence] = {}
        for kind, options in table.items():
            if kind not in SCAFFOLD_OPENERS:
                raise ValueError(f"reply openers[{valence!r}]: unknown mechanism {kind!r}; expected ER, IP or EX")
            if isinstance(options, str) or not isinstance(options, (list, tuple)) \
                    or not 1 <= len(options) <= MAX_OPENERS \
                    or not all(isinstance(o, str) and o.strip() and len(o) <= MAX_OPENER_CHARS for o in options):
                raise ValueError(f"reply openers[{valence!r}][{kind!r}] must be a list of 1 to {MAX_OPENERS} "
                                 f"non-empty strings of at most {MAX_OPENER_CHARS} characters")
            checked[valence][kind] = tuple(o.strip() for o in options)
    return checked


def openers_for(inputs: dict, fitted=None) -> dict[str, tuple[str, ...]]:
    """The openers of each mechanism for this reply: the fitted ones of the emotion's valence (then "any"),
    else the stock ``SCAFFOLD_OPENERS``."""
    if not fitted:
        return SCAFFOLD_OPENERS
    table = fitted.get(emotion_valence(inputs.get("emotion"))) or fitted.get("any") or {}
    return {kind: tuple(table.get(kind) or stock) for kind, stock in SCAFFOLD_OPENERS.items()}


def scaffold_kinds(inputs: dict) -> list[str]:
    """The mechanisms of a scaffolded reply's two sentences: the planned ones in order, the question (EX)
    last. A plan of one mechanism writes two of its sentences; a plan of questions only, or none (the
    strategy stage off), acknowledges first (ER)."""
    kinds = list(dict.fromkeys(s for s in (inputs.get("strategy"), inputs.get("secondary_strategy"))
                               if s in SCAFFOLD_OPENERS))
    if kinds in ([], ["EX"]):
        kinds = ["ER", "EX"]
    elif len(kinds) == 1:
        kinds = kinds * 2
    kinds.sort(key=lambda kind: kind == "EX")
    return kinds


def scaffold_openers(inputs: dict, candidate: int = 0, openers=None) -> list[str]:
    """The openers of a scaffolded reply's two sentences, for candidate ``candidate`` (0: the first reply).

    ``openers`` maps each mechanism to its openers, best first (default ``SCAFFOLD_OPENERS``; see
    ``openers_for``); candidate c takes the c-th of each, coming round again past the last.
    """
    openers = openers or SCAFFOLD_OPENERS
    kinds = scaffold_kinds(inputs)
    chosen = []
    for slot, kind in enumerate(kinds):
        options = openers[kind]
        repeat = slot > 0 and kind == kinds[0]  # the second sentence of a one-mechanism plan: the next opener
        chosen.append(options[(candidate + repeat) % len(options)])
    return chosen


def first_sentence(text: str, opener: str = "") -> str:
    """The first sentence of a completion that begins with ``opener``, cleaned as a reply is (one line, no
    role prefix, no loop). A sentence cut off by the token limit ends at its first comma after the opener,
    if it has one: "... hurt him, it is a lot to take care of, and it is hard to be a" keeps "... hurt him."
    Complete sentences are kept whole: cutting those over 16 words at their first comma lowered the
    composite on 100 ED items (0.5515 to 0.5440, docs/benchmarks.md, "Scaffolded replies").
    """
    cleaned = clean_reply(text)
    found = _SENTENCE.findall(cleaned)
    sentence = (found[0] if found else cleaned).strip()
    if sentence and sentence[-1] not in ".!?":
        comma = sentence.find(",", len(opener))
        sentence = (sentence[:comma] if comma > 0 else sentence).rstrip(" ,;:") + "."
    return sentence


def plan_in_words(inputs: dict) -> str:
    """The plan of the earlier stages as one plain instruction.

    Only the mechanisms are given: on the embedded model the emotion label and
    the cause summary are often wrong or copied from the message, and a small
    writer repeats them.
    """
    steps = [_STRATEGY_WORDS[s] for s in (inputs.get("strategy"), inputs.get("secondary_strategy"))
             if s in _STRATEGY_WORDS]
    steps = list(dict.fromkeys(steps))
    return ("First " + ", then ".join(steps) + ".") if steps else ""


# EmpatheticDialogues text is tokenized and lower-cased ("i 'm sorry . what happened ?"); a model shown it
# answers the same way. tidy_text writes it as a person would.
_SPACE_BEFORE_PUNCT = re.compile(r"\s+([.,!?;:])")
_SPLIT_CONTRACTION = re.compile(r"(?<=\w)\s+(n't|'s|'re|'ve|'ll|'d|'m)\b", re.IGNORECASE)
_LONE_I = re.compile(r"\bi\b")
_SENTENCE_START = re.compile(r"(^|[.!?]\s+)([a-z])")


def tidy_text(text: str) -> str:
    """Tokenized, lower-cased dataset text as written prose: no space before punctuation or inside
    contractions, a capital "I", sentences starting with a capital letter."""
    text = " ".join(str(text).split())
    text = _SPLIT_CONTRACTION.sub(r"\1", _SPACE_BEFORE_PUNCT.sub(r"\1", text))
    text = _LONE_I.sub("I", text)
    return _SENTENCE_START.sub(lambda m: m.group(1) + m.group(2).upper(), text)


_REPLY_WORD = re.compile(r"[A-Za-z0-9']+")
_TRAILING_JOINER = re.compile(r"(?:[\s,;:-]+|\b(?:and|but|so|or|because|that)\b)+$", re.IGNORECASE)
REPEAT_RUN = 4


def _cut_repeated_run(line: str, size: int = REPEAT_RUN) -> str:
    """The line up to where it starts saying ``size`` or more of its words again.

    "I'm so glad you got the job, and I'm so glad you got the job" keeps its
    first clause; a dangling joiner ("and", a comma) goes with the repeat.
    """
    words = list(_REPLY_WORD.finditer(line))
    low = [m.group(0).lower() for m in words]
    seen: dict[tuple[str, ...], int] = {}
    for j in range(len(low) - size + 1):
        run = tuple(low[j:j + size])
        if run in seen and seen[run] + size <= j:
            kept = _TRAILING_JOINER.sub("", line[:words[j].start()]).rstrip()
            if kept and kept[-1] not in ".!?":
                kept += "."
            return kept
        seen.setdefault(run, j)
    return line


def clean_reply(text: str) -> str:
    """The listener's words from a chat completion: one line, no role prefix, no loop, two sentences at most."""
    from trace_dspy.lm.decoding import repeated_tail

    line = next((ln for ln in text.strip().splitlines() if ln.strip()), "")
    line = tidy_text(_ROLE_PREFIX.sub("", line).strip().strip('"').strip())
    cut = repeated_tail(line)
    if cut is not None:
        line = line[:cut].rstrip(" ,;")
    line = _cut_repeated_run(line)
    sentences, seen = [], set()
    for sentence in (s.strip() for s in _SENTENCE.findall(line)):
        if sentence and sentence.lower() not in seen:
            seen.add(sentence.lower())
            sentences.append(sentence)
    return " ".join(sentences[:2])


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

    def __init__(self, *args, exemplars: bool = False, scaffold: bool = False, openers=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.exemplars = exemplars
        self.scaffold = scaffold
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
        from dspy.clients._deprecation import adapter_message_call

        messages = self.format(signature, demos, inputs)
        # dspy.BestOfN numbers its samples by rollout id from 0; the first reply (no rollout id) is candidate 0.
        rollout = lm_kwargs.get("rollout_id", lm.kwargs.get("rollout_id"))
        candidate = 0 if rollout is None else int(rollout) + 1
        kwargs = {**lm_kwargs, "max_tokens": min(lm_kwargs["max_tokens"], SCAFFOLD_SENTENCE_TOKENS)}
        said: list[str] = []
        for opener in scaffold_openers(inputs, candidate, openers_for(inputs, self.openers)):
            call = [*messages, {"role": "assistant", "content": " ".join([*said, opener])}]
            with adapter_message_call(lm, call):
                outputs = lm(messages=call, **kwargs)
            text = outputs[0].get("text") if isinstance(outputs[0], dict) else outputs[0]
            sentence = first_sentence(f"{opener}{text or ''}", opener)
            # Cleaned with what was said before, as the whole reply will be: a run of words said again is cut
            # ("... the part you wanted to play. I can imagine how you wanted to play" keeps "I can imagine how").
            if said:
                before = " ".join(said)
                together = clean_reply(f"{before} {sentence}")
                if together.startswith(before):
                    sentence = together[len(before):].strip()
            # Left out: an opener the model did not go on from, and a question opener it made a statement of
            # ("What happened next was sad.").
            if len(_REPLY_WORD.findall(sentence)) > len(_REPLY_WORD.findall(opener)) \
                    and (opener not in SCAFFOLD_OPENERS["EX"] or sentence.endswith("?")):
                said.append(sentence)
        if not said:  # the model went on from no opener: ask for the whole reply instead (the chat layout)
            return super().__call__(lm, lm_kwargs, signature, demos, inputs)
        return self._call_postprocess(signature, signature, [" ".join(said)], lm, lm_kwargs)

    def format(self, signature, demos, inputs):
        if not is_reply_signature(signature):
            return super().format(signature, demos, inputs)
        from trace_dspy.core.dialogue import LISTENER, parse_dialogue, split_exemplar

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
                said = [t.text for t in parse_dialogue(dialogue) if t.role != LISTENER]
            except ValueError:  # not a dialogue: nothing to show
                continue
            if said:
                messages += [{"role": "user", "content": tidy_text(said[-1])},
                             {"role": "assistant", "content": tidy_text(reply)}]
        for turn in parse_dialogue(inputs["dialogue"]):
            messages.append({"role": "assistant" if turn.role == LISTENER else "user", "content": turn.text})
        return messages

    def parse(self, signature, completion):
        return _counting_parse(self._parse, signature, completion)

    def _parse(self, signature, completion):
        if not is_reply_signature(signature):
            return super().parse(signature, completion)
        reply = clean_reply(completion)
        if not reply:
            from dspy.utils.exceptions import AdapterParseError

            raise AdapterParseError(adapter_name="ChatReplyAdapter", signature=signature, lm_response=completion,
                                    message="the reply was empty after removing role prefixes and loops")
        return {"response": reply}


_CHAT_REPLY = {(ex, sc): ChatReplyAdapter(exemplars=ex, scaffold=sc) for ex in (False, True) for sc in (False, True)}


def chat_reply_adapter(*, exemplars: bool = False, scaffold: bool = False) -> ChatReplyAdapter:
    """A shared ChatReplyAdapter (it holds no per-call state, like the compact adapter)."""
    return _CHAT_REPLY[bool(exemplars), bool(scaffold)]


def _stock_instructions() -> str:
    from trace_dspy.signatures import STAGE_SIGNATURES

    return STAGE_SIGNATURES["generate_response"].instructions
