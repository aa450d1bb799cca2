"""``compile --optimizer finetune``, the workflow's side: its checks before any work, the training's progress
bar, and what the compile's MLflow run records of the training.

The writer is trained by ``trace_dspy.program.writers.finetune_writer`` (the compact writer's package does the
work; this module never imports it). The compile then evaluates dev before and after as for every optimizer,
and saves the artifact with the ``writer_adapter`` part and its record.

MLflow (through ``trace_dspy.store.tracking``): the loss of every step as the metric ``finetune/loss``, the
steps, tokens, seconds and final loss as metrics, the data (mix, limit, seed, counts by source), the base model
and the LoRA settings as ``finetune.*`` params, and the adapter's SHA-256 as the param
``finetune.adapter_sha256`` and the tag ``trace_dspy.writer_adapter_sha256``.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import Any

from trace_dspy.core.config import ConfigError
from trace_dspy.core.console import Progress, progress
from trace_dspy.optimize.optimizers import CompiledProgram, FitRecords

# What training imports (the 'finetune' and 'embed' extras).
TRAINING_MODULES = ("torch", "transformers", "peft", "gguf")
SHA_TAG = "trace_dspy.writer_adapter_sha256"
_METRIC_KEYS = ("steps", "tokens", "seconds", "final_loss", "truncated")


def preflight(cfg) -> None:
    """For ``--optimizer finetune``: the extras that training needs are installed and the reply stage runs on
    the embedded model (ConfigError otherwise, before the data is read); nothing for other optimizers."""
    if cfg.optimizer.name != "finetune":
        return
    from trace_dspy.core.extras import install_hint

    missing = [name for name in TRAINING_MODULES if importlib.util.find_spec(name) is None]
    if missing:
        raise ConfigError(f"compile --optimizer finetune needs the 'finetune' and 'embed' extras "
                          f"({', '.join(missing)} not installed): {install_hint('finetune,embed')}")
    spec = cfg.settings.lm.for_stage("generate_response")
    if not spec.is_local:
        raise ConfigError(f"compile --optimizer finetune trains a LoRA adapter for the embedded model; the reply "
                          f"stage runs on {spec.model!r:.80} (use --lm local or local:PATH)")


class TrainingBar:
    """The training's progress bar (steps, with the last loss and tokens per second), opened at the first step
    it hears of: a resumed run's bar starts where its checkpoint left off."""

    def __init__(self) -> None:
        self.phase: Progress | None = None

    def __call__(self, step: Any) -> None:
        if self.phase is None:
            self.phase = progress(desc="finetune", total=step.total, unit="steps").__enter__()
        self.phase.update(step.step - self.phase.n)
        self.phase.note(f"loss {step.loss:.3f}, {step.tokens_per_second:,.0f} tokens/s")

    def __enter__(self) -> TrainingBar:
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if self.phase is not None:
            self.phase.__exit__(exc_type, exc, tb)
        return False


def finetune_compile(cfg, prep, run, log: Callable[[str], None]) -> CompiledProgram:
    """Train the writer for the compile ``cfg`` on its prepared data ``prep`` (``_Prepared``), log the training
    to ``run`` (None: no MLflow), and return the tuned program with the record of its training."""
    from trace_dspy.program.writers import finetune_writer

    with TrainingBar() as bar:
        fit = finetune_writer(cfg.optimizer, prep.program, prep.source, prep.pool_train, prep.metric, log, bar)
    if run is not None:
        log_training(fit.record, fit.losses, fit.program.parts["writer_adapter"].sha256, log)
    return CompiledProgram(fit.program, FitRecords(writer_adapter=fit.record))


def log_training(record: dict[str, Any], losses: list[float], sha256: str, log: Callable[[str], None]) -> None:
    """The training, in the active MLflow run (see the module docstring); a store that fails is a warning:
    the compile goes on to save its artifact."""
    from trace_dspy.store import tracking

    params = {k: v for k, v in record.items() if k not in _METRIC_KEYS and k != "resumed_from"}
    metrics = {f"finetune/{k}": float(record[k]) for k in _METRIC_KEYS if isinstance(record.get(k), (int, float))}
    try:
        tracking.log_metric_steps("finetune/loss", losses)
        tracking.log_metrics(metrics)
        tracking.log_params({"finetune": {**params, "adapter_sha256": sha256}})
        tracking.set_tags({SHA_TAG: sha256})
    except Exception as exc:  # noqa: BLE001 - the adapter is trained and the artifact still gets saved
        log(f"WARNING: the fine-tune's training was not logged to MLflow ({tracking.error_line(exc)})")


__all__ = ["SHA_TAG", "TRAINING_MODULES", "TrainingBar", "finetune_compile", "log_training", "preflight"]
