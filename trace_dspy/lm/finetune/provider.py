"""DSPy's fine-tuning provider for the embedded model: ``dspy.BootstrapFinetune`` -> a LoRA adapter for llama.cpp.

Every local LM (``trace_dspy.lm.specs.local_lm``) carries an :class:`EmbeddedProvider`, and its
``finetuning_model`` is the base model's string (``local`` or ``local:/path/model.gguf``). So
``lm.finetune(train_data, "chat", train_kwargs)`` (which ``dspy.BootstrapFinetune`` calls) runs
:meth:`EmbeddedProvider.finetune` in a thread:

1. the base model is loaded into transformers from its GGUF file, dequantised to float32
   (``lora.load_base_for_training``);
2. a LoRA adapter is trained on the chat examples (``lora.train_lora``), checkpointed under the output folder,
   so that the same request made again after a crash resumes;
3. the adapter is written in llama.cpp's LoRA GGUF format (``gguf_lora.write_lora_gguf``) and read back;
4. the model string ``local[:BASE]::lora=ADAPTER`` is returned. DSPy then calls ``lm.copy(model=...)``, which
   for a local LM builds an engine that runs base and adapter through llama.cpp (``Llama(lora_path=...)``),
   named with the adapter's digest so that no cached reply of the base model is served for it. The same string
   works anywhere a model is named: ``build_lm(LMSpec(model=...))``, ``--lm``, ``[lm] model = ...``.

``train_kwargs`` takes the :class:`~trace_dspy.lm.finetune.lora.LoraSettings` fields and ``output_dir`` (default:
the ``finetune`` folder of the package's cache), ``progress`` (a callable given each
:class:`~trace_dspy.lm.finetune.lora.TrainingProgress`) and ``float16`` (a half-size adapter file). The adapter's
file name is a digest of the data, the settings and the base model, so a request repeated as it was finds
its own checkpoint and files.

A run in the main thread (``compile --optimizer finetune``) takes the first Ctrl-C as "stop after this step":
the step is finished and saved, and :class:`TrainingInterrupted` (a KeyboardInterrupt) says where the run
resumes; a second Ctrl-C stops at once. A job started by ``lm.finetune`` stops the same way on ``job.cancel()``.
"""

from __future__ import annotations

import hashlib
import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dspy.clients.provider import Provider, TrainingJob
from dspy.clients.utils_finetune import TrainingStatus

from trace_dspy.core import env
from trace_dspy.core.config import ConfigError
from trace_dspy.lm.finetune.lora_checkpoint import FinetuneError, TrainingStopped
from trace_dspy.lm.local_settings import is_local_model, local_model_string, parse_local_model

# train_kwargs that are not LoRA settings.
RUN_KEYS = ("output_dir", "progress", "float16")
# dspy.BootstrapFinetune with multitask=False starts one job per predictor at once; they train in turn.
_TRAINING = threading.Lock()


@dataclass
class FinetuneOutcome:
    """What a fine-tune produced: the model string to run it, the adapter file and the training result."""

    model: str
    adapter: Path
    result: Any  # lora.LoraResult


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C stopped a training run after a step that was saved; the message says which and where it resumes."""


@contextmanager
def ctrl_c_stops() -> Iterator[threading.Event]:
    """While training in the main thread with Python's Ctrl-C handler in place: the first Ctrl-C sets the
    event (the run stops after its step) and puts the handler back, so a second one interrupts at once.
    Elsewhere (another thread, SIGINT ignored or handled by someone else) the event is never set."""
    asked = threading.Event()
    if threading.current_thread() is not threading.main_thread() \
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield asked
        return

    def first(signum, frame) -> None:
        asked.set()
        signal.signal(signal.SIGINT, signal.default_int_handler)

    signal.signal(signal.SIGINT, first)
    try:
        yield asked
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)


class LocalTrainingJob(TrainingJob):
    """A fine-tuning job of the embedded model; ``progress`` is its last step's TrainingProgress.

    ``cancel()`` asks the run to stop after its current step: that step's checkpoint is written, and the job's
    result is a TrainingStopped (status ``cancelled``); the same job started again resumes from it."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.progress: Any = None
        self.stop_asked = threading.Event()

    def cancel(self) -> bool:
        """Ask a job that has not finished to stop after its current step; False when it already has."""
        if self.done():
            return False
        self.stop_asked.set()
        return True

    def status(self) -> TrainingStatus:
        if not self.done():
            return TrainingStatus.running if self.progress is not None else TrainingStatus.pending
        result = self.result()
        if isinstance(result, TrainingStopped):
            return TrainingStatus.cancelled
        return TrainingStatus.failed if isinstance(result, Exception) else TrainingStatus.succeeded


def base_identity(path: Path) -> str:
    """The base model file as a checkpoint knows it: its resolved path, size and modification time."""
    held = path.stat()
    return f"{path.resolve()}|{held.st_size}|{held.st_mtime_ns}"


def _split_kwargs(train_kwargs: dict[str, Any] | None) -> tuple[Any, dict[str, Any]]:
    """(LoraSettings, the run's other keywords) of ``train_kwargs``."""
    from trace_dspy.lm.finetune.lora import LoraSettings

    if not isinstance(train_kwargs or {}, dict):
        raise ConfigError(f"train_kwargs: expected a dict, found {type(train_kwargs).__name__}")
    kwargs = dict(train_kwargs or {})
    run = {k: kwargs.pop(k) for k in RUN_KEYS if k in kwargs}
    try:
        settings = LoraSettings.from_kwargs(kwargs)
    except TypeError as exc:
        raise ConfigError(f"LoRA settings: {exc}") from None
    if run.get("progress") is not None and not callable(run["progress"]):
        raise ConfigError("train_kwargs progress: expected a callable that takes a TrainingProgress")
    if not isinstance(run.get("float16", False), bool):
        raise ConfigError(f"train_kwargs float16: expected true or false, found {run['float16']!r:.40}")
    if run.get("output_dir") is not None and not isinstance(run["output_dir"], (str, os.PathLike)):
        raise ConfigError(f"train_kwargs output_dir: expected a folder path, found {run['output_dir']!r:.40}")
    return settings, run


def _base_path(model: str) -> tuple[str | None, Path]:
    """(the base as the model string names it, its file) of the model to fine-tune; an adapter it names is
    not trained on (the new adapter replaces it)."""
    from trace_dspy.lm.model_files import LocalModelError, default_model_path

    if not is_local_model(model):
        raise FinetuneError(f"the embedded-model provider fine-tunes local models (local, local:PATH), "
                            f"not {model!r:.80}")
    base, _ = parse_local_model(model)
    path = Path(base) if base is not None else default_model_path()
    if not path.is_file():
        raise LocalModelError(f"model file not found: {path}")
    return base, path


def run_id(examples: list[dict[str, Any]], settings: Any, base: str) -> str:
    """The digest that names a run's adapter and checkpoint folder (data, settings, base model)."""
    from trace_dspy.lm.finetune.lora import examples_digest

    text = f"{examples_digest(examples)}\n{sorted(settings.identity().items())}\n{base}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def finetune_local(model: str, train_data: list[dict[str, Any]], train_kwargs: dict[str, Any] | None = None,
                   *, job: LocalTrainingJob | None = None) -> FinetuneOutcome:
    """Train a LoRA adapter for the local ``model`` on chat ``train_data`` and write it for llama.cpp."""
    from trace_dspy.lm.finetune import lora
    from trace_dspy.lm.finetune.gguf_lora import read_lora_gguf, write_lora_gguf

    settings, run = _split_kwargs(train_kwargs)
    named, path = _base_path(model)
    lora.chat_messages(train_data)  # refuse bad data before the model is loaded
    identity = base_identity(path)
    folder = Path(run.get("output_dir") or env.cache_dir("finetune"))
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise FinetuneError(f"{folder}: cannot write the adapter there ({exc.strerror or exc})") from None
    name = f"lora-{run_id(train_data, settings, identity)}"
    user_progress = run.get("progress")

    def progress(step: Any) -> None:
        if job is not None:
            job.progress = step
        if user_progress is not None:
            user_progress(step)

    with _TRAINING:  # one run at a time: each takes every core and a model of its own
        base_model, tokenizer = lora.load_base_for_training(path)
        config = base_model.config
        if getattr(config, "model_type", None) != "llama":
            raise FinetuneError(f"{path}: LoRA adapters for llama.cpp are written for Llama-architecture models; "
                                f"this one is {getattr(config, 'model_type', '?')}")
        with ctrl_c_stops() as ctrl_c:
            try:
                result = lora.train_lora(
                    base_model, tokenizer, train_data, settings, checkpoint_dir=folder / f"{name}.ckpt",
                    progress=progress, base=identity,
                    stop=lambda: ctrl_c.is_set() or (job is not None and job.stop_asked.is_set()))
            except TrainingStopped as stopped:
                if ctrl_c.is_set():
                    raise TrainingInterrupted(str(stopped)) from None
                raise
    adapter = write_lora_gguf(folder / f"{name}.gguf", result.weights, alpha=settings.alpha,
                              n_head=config.num_attention_heads, n_kv_head=config.num_key_value_heads,
                              float16=bool(run.get("float16")))
    read_lora_gguf(adapter)  # what was written reads back
    return FinetuneOutcome(local_model_string(named, str(adapter.resolve())), adapter.resolve(), result)


class EmbeddedProvider(Provider):
    """Fine-tunes the embedded model (a local GGUF Llama) with LoRA; see the module docstring."""

    def __init__(self) -> None:
        super().__init__()
        self.finetunable = True
        self.TrainingJob = LocalTrainingJob

    def __repr__(self) -> str:
        return "EmbeddedProvider()"

    @staticmethod
    def is_provider_model(model: str) -> bool:
        return is_local_model(model)

    @staticmethod
    def finetune(job: TrainingJob, model: str, train_data: list[dict[str, Any]], train_data_format: Any,
                 train_kwargs: dict[str, Any] | None = None) -> str:
        """Train and write the adapter; the model string that runs base and adapter (see the module docstring)."""
        fmt = getattr(train_data_format, "value", train_data_format)
        if fmt not in (None, "chat"):
            raise FinetuneError(f"the embedded model is fine-tuned on chat data, not {fmt!r:.40}")
        local_job = job if isinstance(job, LocalTrainingJob) else None
        return finetune_local(model, train_data, train_kwargs, job=local_job).model
