"""Train a LoRA adapter (peft) on a causal LM, on the CPU, from chat-formatted examples.

The examples are DSPy's chat fine-tuning data: ``{"messages": [{"role": ..., "content": ...}, ...]}``, the last
message the assistant's reply. Each is rendered with the tokenizer's own chat template; the loss is taken only
on the tokens of that last reply (its end-of-turn marker included), so the adapter learns to answer, not to
repeat prompts. A sequence longer than ``max_length`` keeps its end (the reply) and loses the start of its
prompt; one whose reply alone does not fit is refused.

Runs are reproducible: the adapter starts from ``seed``, each epoch visits the examples in an order drawn from
``seed``, and torch's random state (dropout) is part of every checkpoint, so a run stopped and started again on
the same folder (``trace_dspy.lm.finetune.lora_checkpoint``) ends with the weights an uninterrupted run has.
Progress goes to a callback after every step (and after the checkpoint of that step is written), so a command
can draw a bar, and a callback that raises stops the run there.

The learning rate is constant (AdamW, no weight decay, gradients clipped to norm 1). torch, peft and
transformers are imported inside the functions: importing this module imports none of them.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from trace_dspy.core.config import ConfigError
from trace_dspy.lm.finetune.gguf_lora import HF_TO_LLAMA
from trace_dspy.lm.finetune.lora_checkpoint import (FinetuneError, TrainingStopped, TrainState, load_checkpoint,
                                                    save_checkpoint)
from trace_dspy.lm.model_files import LocalModelError

TARGETS = tuple(m.split(".")[-1] for m in HF_TO_LLAMA)
MISSING_EXTRA = ("fine-tuning needs the 'finetune' and 'embed' extras: pip install -e \".[finetune,embed]\" "
                 "(peft, gguf, accelerate, transformers and torch)")
# (lowest, highest) of each numeric setting.
_BOUNDS: dict[str, tuple[float, float]] = {
    "rank": (1, 1024), "alpha": (1e-6, 1e6), "dropout": (0.0, 0.9), "learning_rate": (1e-9, 1.0),
    "epochs": (1, 1000), "batch_size": (1, 4096), "max_length": (8, 131_072), "seed": (0, 2**31 - 1),
    "checkpoint_every": (1, 10**9)}


@dataclass(frozen=True)
class LoraSettings:
    """How to train an adapter. ``checkpoint_every`` (steps) is the only one that does not change the result."""

    rank: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")
    learning_rate: float = 2e-4
    epochs: int = 1
    batch_size: int = 8
    max_length: int = 256
    seed: int = 0
    checkpoint_every: int = 50

    def __post_init__(self) -> None:
        for name, (low, high) in _BOUNDS.items():
            value = getattr(self, name)
            integral = isinstance(low, int) and isinstance(high, int)
            ok = isinstance(value, int if integral else (int, float)) and not isinstance(value, bool)
            if not ok or not low <= value <= high:
                kind = "an integer" if integral else "a number"
                raise ConfigError(f"LoRA {name}: expected {kind} from {low:g} to {high:g}, found {value!r:.40}")
        targets = self.target_modules
        if isinstance(targets, str) or not targets or any(t not in TARGETS for t in targets) \
                or len(set(targets)) != len(targets):
            raise ConfigError(f"LoRA target_modules: expected distinct names from {', '.join(TARGETS)}, "
                              f"found {targets!r:.80}")
        object.__setattr__(self, "target_modules", tuple(targets))

    @classmethod
    def from_kwargs(cls, kwargs: dict[str, Any]) -> LoraSettings:
        """Settings from keyword arguments (``train_kwargs``); an unknown key is refused by name."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise ConfigError(f"unknown LoRA setting(s) {', '.join(map(repr, unknown))[:200]}; "
                              f"the settings are {', '.join(sorted(known))}")
        return cls(**kwargs)

    def identity(self) -> dict[str, Any]:
        """The settings that change the trained weights (all but ``checkpoint_every``)."""
        out = asdict(self)
        out.pop("checkpoint_every")
        out["target_modules"] = list(self.target_modules)
        return out


@dataclass(frozen=True)
class TrainingProgress:
    """One step done: for a progress bar and a log."""

    step: int
    total: int
    loss: float
    tokens_per_second: float
    tokens: int
    seconds: float


@dataclass
class LoraResult:
    """A finished run: the loss of each step, tokens read, seconds of training (all runs of a resumed one),
    steps, the seed, the step it resumed from, how many examples lost the start of their prompt, and the
    adapter (transformers module name -> (lora_A (rank, in), lora_B (out, rank)) as float32 numpy arrays)."""

    losses: list[float]
    tokens: int
    seconds: float
    steps: int
    seed: int
    resumed_from: int
    truncated: int
    settings: LoraSettings
    weights: dict[str, tuple[Any, Any]] = field(repr=False, default_factory=dict)

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


Progress = Callable[[TrainingProgress], None]


def examples_digest(examples: list[dict[str, Any]]) -> str:
    """A SHA-256 of the training data, for a checkpoint's identity."""
    text = json.dumps(examples, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def chat_messages(examples: Any) -> list[list[dict[str, str]]]:
    """The message lists of chat fine-tuning data, each checked: a list of {"role", "content"} dicts with
    string values, at least one prompt message, the last one the assistant's non-empty reply."""
    if not isinstance(examples, list) or not examples:
        raise FinetuneError("no training examples: expected a non-empty list of {\"messages\": [...]}")
    out = []
    for index, example in enumerate(examples):
        messages = example.get("messages") if isinstance(example, dict) else None
        ok = isinstance(messages, list) and len(messages) >= 2 and all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in messages)
        if not ok:
            raise FinetuneError(f"training example {index}: expected {{\"messages\": [{{\"role\": ..., "
                                f"\"content\": ...}}, ...]}} with a prompt and a reply")
        if messages[-1]["role"] != "assistant" or not messages[-1]["content"].strip():
            raise FinetuneError(f"training example {index}: the last message must be the assistant's reply")
        out.append([{"role": m["role"], "content": m["content"]} for m in messages])
    return out


def encode_chat(tokenizer: Any, messages: list[dict[str, str]], max_length: int,
                index: int = 0) -> tuple[list[int], list[int], bool]:
    """(token ids, labels, whether the prompt was cut) of one conversation; labels are -100 except on the
    last reply's tokens."""
    prompt = tokenizer.apply_chat_template(messages[:-1], tokenize=False, add_generation_prompt=True)
    full = tokenizer.apply_chat_template(messages, tokenize=False)
    if not full.startswith(prompt):
        raise FinetuneError("the tokenizer's chat template does not render the prompt as the start of the "
                            "conversation, so the reply's tokens cannot be told apart")
    head = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    reply = tokenizer(full[len(prompt):], add_special_tokens=False)["input_ids"]
    if len(reply) >= max_length:
        raise FinetuneError(f"training example {index}: its reply alone is {len(reply)} tokens; max_length "
                            f"is {max_length}")
    ids, labels = head + reply, [-100] * len(head) + reply
    cut = len(ids) > max_length
    return ids[-max_length:], labels[-max_length:], cut


def batch_plan(count: int, settings: LoraSettings) -> list[list[int]]:
    """The examples of every step: each epoch in an order drawn from the seed, cut into batches."""
    plan = []
    for epoch in range(settings.epochs):
        order = list(range(count))
        random.Random(settings.seed * 1_000_003 + epoch).shuffle(order)
        plan += [order[i:i + settings.batch_size] for i in range(0, count, settings.batch_size)]
    return plan


def _collate(rows: list[tuple[list[int], list[int], bool]], indices: list[int], pad_id: int) -> dict[str, Any]:
    import torch

    width = max(len(rows[i][0]) for i in indices)
    ids, mask, labels = [], [], []
    for i in indices:
        row_ids, row_labels, _ = rows[i]
        pad = width - len(row_ids)
        ids.append(row_ids + [pad_id] * pad)
        mask.append([1] * len(row_ids) + [0] * pad)
        labels.append(row_labels + [-100] * pad)
    return {"input_ids": torch.tensor(ids), "attention_mask": torch.tensor(mask), "labels": torch.tensor(labels)}


def _model_identity(model: Any, base: str) -> str:
    config = model.config.to_json_string(use_diff=False) if hasattr(model, "config") else type(model).__name__
    return hashlib.sha256(f"{base}\n{config}".encode()).hexdigest()


def _with_lora(model: Any, settings: LoraSettings) -> tuple[Any, list[tuple[str, Any]]]:
    """``model`` with fresh LoRA layers (drawn from the seed), and its trainable (name, tensor) pairs."""
    import torch
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(settings.seed)
    config = LoraConfig(r=settings.rank, lora_alpha=settings.alpha, lora_dropout=settings.dropout,
                        target_modules=list(settings.target_modules), bias="none", task_type="CAUSAL_LM")
    peft_model = get_peft_model(model, config)
    return peft_model, [(n, p) for n, p in peft_model.named_parameters() if p.requires_grad]


def lora_weights(params: list[tuple[str, Any]]) -> dict[str, tuple[Any, Any]]:
    """The adapter as transformers module name -> (lora_A, lora_B) float32 numpy arrays."""
    halves: dict[str, dict[str, Any]] = {}
    for name, param in params:
        for half in ("A", "B"):
            mark = f".lora_{half}."
            if mark in name:
                module = name.split(mark)[0].removeprefix("base_model.model.")
                halves.setdefault(module, {})[half] = param.detach().float().numpy().copy()
    return {m: (h["A"], h["B"]) for m, h in halves.items() if set(h) == {"A", "B"}}


def _run_steps(peft_model: Any, optimizer: Any, params: list[tuple[str, Any]], batches: list[dict[str, Any]],
               state: TrainState, save: Callable[[TrainState], None], every: int, progress: Progress | None,
               stop: Callable[[], bool] | None = None) -> bool:
    """Train from ``state.step`` to the end of ``batches``, checkpointing every ``every`` steps and at the end;
    where ``stop()`` turns true after a step, that step is saved and True returned (stopped early)."""
    import torch

    peft_model.train()
    total = len(batches)
    for step in range(state.step, total):
        started = time.perf_counter()
        batch = batches[step]
        loss = peft_model(**batch).loss
        if not torch.isfinite(loss):
            raise FinetuneError(f"the loss became {loss.item()} at step {step + 1}; lower the learning rate")
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_([p for _, p in params], 1.0)
        optimizer.step()
        seconds = time.perf_counter() - started
        tokens = int(batch["attention_mask"].sum())
        state.step, state.tokens, state.seconds = step + 1, state.tokens + tokens, state.seconds + seconds
        state.losses.append(float(loss.item()))
        saved = state.step % every == 0 or state.step == total
        if saved:
            save(state)
        if progress is not None:
            progress(TrainingProgress(state.step, total, state.losses[-1], tokens / max(seconds, 1e-9),
                                      state.tokens, state.seconds))
        if stop is not None and state.step < total and stop():
            if not saved:
                save(state)
            return True
    return False


def train_lora(model: Any, tokenizer: Any, examples: list[dict[str, Any]], settings: LoraSettings | None = None,
               *, checkpoint_dir: str | os.PathLike | None = None, progress: Progress | None = None,
               base: str = "", stop: Callable[[], bool] | None = None) -> LoraResult:
    """Train a LoRA adapter on ``model`` (a transformers causal LM; peft adds the adapter's layers to it in
    place, so afterwards it runs with the adapter) from chat ``examples``.

    With ``checkpoint_dir``, the run is saved there every ``settings.checkpoint_every`` steps and at the end,
    and a checkpoint already there of the same data, settings and model (``base`` names the model file) is
    resumed; one of another run is refused (FinetuneError). ``stop`` is asked after every step: true saves
    the checkpoint and raises TrainingStopped."""
    import torch

    settings = settings or LoraSettings()
    conversations = chat_messages(examples)
    rows = [encode_chat(tokenizer, m, settings.max_length, i) for i, m in enumerate(conversations)]
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    batches = [_collate(rows, indices, int(pad_id or 0)) for indices in batch_plan(len(rows), settings)]
    identity = {"data": examples_digest(examples), "settings": settings.identity(),
                "model": _model_identity(model, base)}
    peft_model, params = _with_lora(model, settings)
    optimizer = torch.optim.AdamW([p for _, p in params], lr=settings.learning_rate, weight_decay=0.0)
    state = TrainState()
    if checkpoint_dir is not None:
        state = load_checkpoint(checkpoint_dir, identity, params, optimizer) or state
    resumed_from = state.step

    def save(current: TrainState) -> None:
        if checkpoint_dir is not None:
            save_checkpoint(checkpoint_dir, identity, current, len(batches), params, optimizer)

    if _run_steps(peft_model, optimizer, params, batches, state, save, settings.checkpoint_every, progress, stop):
        raise TrainingStopped(state.step, len(batches), os.fspath(checkpoint_dir) if checkpoint_dir else None)
    peft_model.eval()
    return LoraResult(losses=list(state.losses), tokens=state.tokens, seconds=state.seconds, steps=state.step,
                      seed=settings.seed, resumed_from=resumed_from, truncated=sum(r[2] for r in rows),
                      settings=settings, weights=lora_weights(params))


def load_base_for_training(model_path: str | os.PathLike) -> tuple[Any, Any]:
    """(model, tokenizer) of a GGUF model file in transformers, its weights dequantised to float32 and its
    tokenizer carrying the model's own chat template (about 20 s for SmolLM2-135M)."""
    from trace_dspy.lm.finetune.gguf_lora import MAX_MODEL_BYTES, require_file

    path = Path(model_path)
    require_file(path, MAX_MODEL_BYTES, "model file")
    try:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.utils import logging as hf_logging
    except ImportError:
        raise LocalModelError(MISSING_EXTRA) from None
    with _quiet_loading(hf_logging):
        try:
            # file-audit: transformers reads the checked GGUF file (and nothing else) from its folder
            tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
            model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
        except ImportError:
            raise LocalModelError(MISSING_EXTRA) from None
    return model, tokenizer


@contextlib.contextmanager
def _quiet_loading(hf_logging: Any):
    """No progress bars on the terminal while transformers loads a model: its own, and the GGUF converter's
    (a plain tqdm that transformers' switch does not reach), so that a command's own bar is not broken."""
    import transformers.modeling_gguf_pytorch_utils as converter

    shown, bar = hf_logging.is_progress_bar_enabled(), getattr(converter, "tqdm", None)
    hf_logging.disable_progress_bar()
    if bar is not None:
        converter.tqdm = functools.partial(bar, disable=True)
    try:
        yield
    finally:
        if bar is not None:
            converter.tqdm = bar
        if shown:
            hf_logging.enable_progress_bar()
