"""Checkpoints of a LoRA training run: one ``checkpoint.npz`` in the run's folder, replaced whole each time.

It holds the adapter's weights, AdamW's two moment estimates, torch's random state (dropout) and a JSON header:
the step reached, the loss curve so far, the tokens and seconds spent, and the run's identity (a digest of the
training data, the settings that change the result and the base model). A run started again with the same
folder resumes from it only when that identity is its own; any other checkpoint is refused with a message
that says what differs, so that a run is never continued on other data or settings.

The file goes through ``trace_dspy.core.files`` (numpy arrays and a JSON header, no pickle), written beside
its final name and renamed, so a run killed while writing leaves the previous checkpoint as it was.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trace_dspy.core.files import MiB, ArrayLimits, load_header_npz, write_header_npz

CHECKPOINT_FILE = "checkpoint.npz"
FORMAT = "trace-dspy LoRA checkpoint"
VERSION = 1
_ARRAYS = ("weights", "exp_avg", "exp_avg_sq", "rng")
_LIMITS = ArrayLimits(file_bytes=4096 * MiB, member_bytes=2048 * MiB, total_bytes=8192 * MiB, members=8)
# What each part of a run's identity is called when a checkpoint's differs.
_WHAT = {"data": "other training data", "settings": "other settings", "model": "another base model"}


class FinetuneError(ValueError):
    """Training data, a checkpoint or a request that fine-tuning cannot use; the message says which and why."""


class TrainingStopped(RuntimeError):
    """A training run was asked to stop (``LocalTrainingJob.cancel``) and did, after saving its checkpoint:
    the same run started again resumes at ``step``."""

    def __init__(self, step: int, total: int, where: str | None):
        kept = f"; its checkpoint in {where} resumes it" if where else " (no checkpoint folder: nothing is kept)"
        super().__init__(f"training stopped at step {step} of {total}{kept}")
        self.step, self.total = step, total


@dataclass
class TrainState:
    """Where a run is: steps done, the loss of each, tokens read and seconds spent training."""

    step: int = 0
    losses: list[float] = field(default_factory=list)
    tokens: int = 0
    seconds: float = 0.0


def checkpoint_path(folder: str | os.PathLike) -> Path:
    return Path(folder) / CHECKPOINT_FILE


def save_checkpoint(folder: str | os.PathLike, identity: dict[str, Any], state: TrainState, total: int,
                    params: list[tuple[str, Any]], optimizer: Any) -> Path:
    """Write the run's state (``params``: (name, trainable tensor) in optimizer order) to ``folder``."""
    import numpy as np
    import torch

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    moments = optimizer.state_dict()["state"]

    def flat(key: str | None) -> Any:
        parts = []
        for index, (_, param) in enumerate(params):
            value = param.detach() if key is None else moments.get(index, {}).get(key, torch.zeros_like(param))
            parts.append(value.reshape(-1).to(torch.float32).numpy())
        return np.concatenate(parts) if parts else np.zeros(0, np.float32)

    header = {"format": FORMAT, "version": VERSION, "identity": identity, "step": state.step, "total": total,
              "losses": state.losses, "tokens": state.tokens, "seconds": state.seconds,
              "names": [n for n, _ in params], "shapes": [list(p.shape) for _, p in params]}
    arrays = {"weights": flat(None), "exp_avg": flat("exp_avg"), "exp_avg_sq": flat("exp_avg_sq"),
              "rng": torch.get_rng_state().numpy()}
    return write_header_npz(checkpoint_path(folder), header, arrays)


def _differences(found: Any, expected: dict[str, Any]) -> list[str]:
    if not isinstance(found, dict):
        return ["an unknown run"]
    return [_WHAT.get(k, k) for k in expected if found.get(k) != expected[k]]


def _check_header(path: Path, header: dict[str, Any], identity: dict[str, Any],
                  params: list[tuple[str, Any]]) -> None:
    if header.get("format") != FORMAT or header.get("version") != VERSION:
        raise FinetuneError(f"{path}: not a LoRA checkpoint of this version ({header.get('format')!r:.40}, "
                            f"version {header.get('version')!r:.10})")
    differs = _differences(header.get("identity"), identity)
    if differs:
        raise FinetuneError(f"{path}: this checkpoint was made for {' and '.join(differs)}; remove "
                            f"{path.parent} or give the run another checkpoint folder to start over")
    if header.get("names") != [n for n, _ in params] or header.get("shapes") != [list(p.shape) for _, p in params]:
        raise FinetuneError(f"{path}: damaged LoRA checkpoint: its tensors are not the adapter's")
    step = header.get("step")
    if not isinstance(step, int) or isinstance(step, bool) or step < 0 or not isinstance(header.get("losses"), list):
        raise FinetuneError(f"{path}: damaged LoRA checkpoint: no valid step count or loss curve")


def load_checkpoint(folder: str | os.PathLike, identity: dict[str, Any], params: list[tuple[str, Any]],
                    optimizer: Any) -> TrainState | None:
    """Restore the run saved in ``folder`` into ``params``, ``optimizer`` and torch's random state; None when
    the folder holds no checkpoint. A checkpoint of another run, or a damaged one, is a FinetuneError."""
    import torch

    path = checkpoint_path(folder)
    if not path.exists():
        return None
    header, arrays = load_header_npz(path, _ARRAYS, limits=_LIMITS, error=FinetuneError, what="LoRA checkpoint",
                                     finite=True)
    _check_header(path, header, identity, params)
    sizes = [p.numel() for _, p in params]
    if any(arrays[k].size != sum(sizes) for k in _ARRAYS[:3]):
        raise FinetuneError(f"{path}: damaged LoRA checkpoint: its arrays do not hold the adapter's "
                            f"{sum(sizes)} values")
    pieces = {k: torch.from_numpy(arrays[k].astype("float32")).split(sizes) for k in _ARRAYS[:3]}
    with torch.no_grad():
        for index, (_, param) in enumerate(params):
            param.copy_(pieces["weights"][index].reshape(param.shape))
    step = int(header["step"])
    if step:
        state = {i: {"step": torch.tensor(float(step)), "exp_avg": pieces["exp_avg"][i].reshape(p.shape).clone(),
                     "exp_avg_sq": pieces["exp_avg_sq"][i].reshape(p.shape).clone()}
                 for i, (_, p) in enumerate(params)}
        optimizer.load_state_dict({"state": state, "param_groups": optimizer.state_dict()["param_groups"]})
    try:
        torch.set_rng_state(torch.from_numpy(arrays["rng"].astype("uint8")))
    except (RuntimeError, ValueError):
        raise FinetuneError(f"{path}: damaged LoRA checkpoint: its random state is not torch's") from None
    return TrainState(step=step, losses=[float(x) for x in header["losses"]][:step],
                      tokens=int(header.get("tokens") or 0), seconds=float(header.get("seconds") or 0.0))
