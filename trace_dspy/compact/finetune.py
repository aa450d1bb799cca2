"""The compact writer compiled into the model's weights: a LoRA adapter for the embedded model's reply stage.

DSPy's answer for a small model is to compile the program into the model (``dspy.BootstrapFinetune``: run
a teacher, keep the traces a metric passes, call the student LM's provider to fine-tune on them). Here the
reply stage learns from what its own inputs would be on the data pool, in the layout it reads at run time
(``reply_format = "briefed"``: the conversation as chat turns, the emotion and the plan in the system line):

- ``human``: each pool conversation's first listener reply (ED valid, detokenised and truecased:
  ``trace_dspy.data.listener_replies``), with ED's emotion label and, as the plan, the two mechanisms the
  learned EPITOME scorer finds strongest in that reply;
- ``program``: the program's own replies on pool dialogues that the metric passes (the BootstrapFinetune
  traces), with the inputs the earlier stages gave.

``FinetuneConfig.mix`` says which go in. The examples are chat messages as DSPy's chat fine-tuning data
is; the embedded model's provider (``trace_dspy.lm.finetune``) trains and writes the adapter.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from trace_dspy.compact.reply_adapter import ChatReplyAdapter
from trace_dspy.core.config import ConfigError, ProgramConfig
from trace_dspy.optimize.optimizers import FINETUNE_MIXES as MIXES
from trace_dspy.optimize.optimizers import ReplyFloors  # the floors' one home, beside the optimizer's setting


@dataclass(frozen=True)
class FinetuneConfig:
    """What the writer is trained on and how: ``mix`` (``MIXES``), ``limit`` (pool conversations; None: all),
    ``floors`` (the human replies learned from), the LoRA settings (``lora``: keywords of
    ``trace_dspy.lm.finetune.lora.LoraSettings``), ``float16`` adapter weights, and ``seed``."""

    mix: str = "human"
    limit: int | None = None
    seed: int = 0
    floors: ReplyFloors = field(default_factory=ReplyFloors)
    float16: bool = True
    lora: dict[str, Any] = field(default_factory=lambda: {
        "rank": 16, "alpha": 32.0, "learning_rate": 5e-4, "epochs": 1, "batch_size": 8, "max_length": 192,
        "target_modules": ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")})

    def __post_init__(self) -> None:
        if self.mix not in MIXES:
            raise ConfigError(f"finetune mix must be one of {', '.join(MIXES)}, not {self.mix!r}")
        if self.limit is not None and (not isinstance(self.limit, int) or self.limit < 1):
            raise ConfigError(f"finetune limit must be a positive number of conversations, not {self.limit!r}")

    def train_kwargs(self) -> dict[str, Any]:
        return {**self.lora, "seed": self.seed, "float16": self.float16}


# The program as a fine-tuned writer runs it: the compact writer, the reply in the briefed layout, no exemplar
# turns (the adapter learned the tone they were there to show).
TUNED_PROGRAM = {"writer": "compact", "reply_format": "briefed", "reply_exemplars": False}


def tuned_config(config: ProgramConfig) -> ProgramConfig:
    """``config`` as a fine-tuned writer runs it (``TUNED_PROGRAM``)."""
    return ProgramConfig.from_dict({**config.to_dict(), **TUNED_PROGRAM})


def plan_of(levels: dict[str, float]) -> tuple[str, str]:
    """The (primary, secondary) plan a reply carries out: its two strongest EPITOME mechanisms."""
    ranked = sorted(("ER", "IP", "EX"), key=lambda m: -levels[m])
    return ranked[0], ranked[1]


@dataclass(frozen=True)
class HumanExamples:
    """The chat examples made from human replies, and how many replies the floors left out."""

    examples: list[dict[str, Any]]
    below_floors: int


def human_examples(replies: Sequence, scorer, signature, *, relevance=None,
                   floors: ReplyFloors = ReplyFloors(0.0, 0.0)) -> HumanExamples:
    """Chat fine-tuning examples from pool conversations' first listener replies (``ListenerReply``): the
    reply stage's prompt in the briefed layout, then the human reply; replies below ``floors`` (read by the
    EPITOME ``scorer`` and the ``relevance`` scorer, where given) are left out and counted."""
    adapter = ChatReplyAdapter(exemplars=False, briefed=True)
    speakers, texts = [r.speaker for r in replies], [r.reply for r in replies]
    levels = scorer.score_batch(speakers, texts)
    fits = relevance.score_batch(speakers, speakers, texts) if relevance is not None else [None] * len(texts)
    examples = []
    for reply, level, fit in zip(replies, levels, fits):
        if not floors.passes(fit, level):
            continue
        primary, secondary = plan_of(level)
        inputs = {"dialogue": f"Speaker: {reply.speaker}", "emotion": reply.emotion, "strategy": primary,
                  "secondary_strategy": secondary, "exemplars": []}
        messages = adapter.format(signature, [], inputs)
        examples.append({"messages": [*messages, {"role": "assistant", "content": reply.reply}]})
    return HumanExamples(examples, len(texts) - len(examples))


def program_examples(traces: Sequence[tuple[dict, str]], signature) -> list[dict[str, Any]]:
    """Chat fine-tuning examples from the program's own replies: (reply stage inputs, reply) pairs that the
    metric passed, in the briefed layout."""
    adapter = ChatReplyAdapter(exemplars=False, briefed=True)
    return [{"messages": [*adapter.format(signature, [], {**inputs, "exemplars": []}),
                          {"role": "assistant", "content": reply}]} for inputs, reply in traces]


@dataclass(frozen=True)
class TunedWriter:
    """A trained writer: the LM model string that runs it (base and adapter), the adapter file, the training
    result (loss curve, tokens, seconds) and the count of examples from each source."""

    model: str
    adapter: Any
    result: Any
    counts: dict[str, int]


def train_writer(cfg: FinetuneConfig, examples: dict[str, list[dict[str, Any]]], *, model: str = "local",
                 progress: Callable[[Any], None] | None = None, output_dir=None) -> TunedWriter:
    """Train the writer's adapter on the ``examples`` of each source (the provider resumes a killed run of the
    same data and settings from its checkpoint, and reuses a finished one)."""
    from trace_dspy.lm.finetune.provider import finetune_local

    data = [example for source in sorted(examples) for example in examples[source]]
    if not data:
        raise ConfigError("no training examples: the data pool gave none for the mix " + cfg.mix)
    kwargs = {**cfg.train_kwargs(), "progress": progress, **({"output_dir": output_dir} if output_dir else {})}
    outcome = finetune_local(model, data, kwargs)
    return TunedWriter(outcome.model, outcome.adapter, outcome.result, {k: len(v) for k, v in examples.items()})
