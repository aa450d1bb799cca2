"""What a compiled artifact holds, and what changed between two artifacts, as data (the command prints it)."""

from __future__ import annotations

import difflib
import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trace_dspy.optimize.metric import HEADLINE_KEYS
from trace_dspy.program.parts import FittedParts
from trace_dspy.store.artifacts import locate, read_manifest, read_program_state
from trace_dspy.store.manifest import Manifest

# The scores shown by default, in this order; --json has all of them.
SCORE_KEYS = HEADLINE_KEYS


# Manifest fields that always differ between versions, or are shown elsewhere.
_NOT_DIFFED = {"version", "created", "scores", "predictors"}


@dataclass
class Artifact:
    ref: str
    path: Path
    manifest: Manifest
    state: dict[str, Any]

    @property
    def label(self) -> str:
        return self.manifest.label

    def stages(self) -> dict[str, dict[str, Any]]:
        """name -> instructions, demos, field descriptions, in pipeline order when known."""
        out = {}
        for name in _pipeline_order(k for k in self.state if k != "metadata"):
            entry = self.state.get(name) or {}
            signature = entry.get("signature") or {}
            out[name] = {
                "instructions": str(signature.get("instructions", "")),
                "demos": entry.get("demos") or [],
                "fields": signature.get("fields") or [],
            }
        return out


def _pipeline_order(names) -> list[str]:
    from trace_dspy.core.config import STAGES

    order = {s: i for i, s in enumerate(STAGES)}
    return sorted(names, key=lambda n: (order.get(n, len(order)), n))


def open_artifact(ref: str, *, root: str | None = None, tracking_uri: str | None = None,
                  allow_unverified: bool = False) -> Artifact:
    """Find an artifact by any load reference and read its two JSON files."""
    folder = locate(ref, root=root, tracking_uri=tracking_uri, allow_unverified=allow_unverified)
    manifest = read_manifest(folder)
    state = read_program_state(folder)
    return Artifact(ref, folder, manifest, state)


def summary(art: Artifact) -> dict[str, Any]:
    """Everything ``inspect REF`` shows, as plain data."""
    m = art.manifest
    config = m.config
    data = dict(m.data)
    ids = {k: len(data.pop(k) or []) for k in ("train_ids", "dev_ids") if k in data}
    return {
        "ref": art.ref,
        "path": str(art.path),
        "name": m.name,
        "version": m.version,
        "created": m.created,
        "optimizer": m.optimizer or config.get("optimizer"),
        "metric": m.metric or None,
        "scores": m.scores,
        "data": {**data, **{k.replace("_ids", ""): n for k, n in ids.items()}},
        "config": {k: config.get(k) for k in ("program", "lm", "data", "run") if k in config},
        "retrieval": m.parts.get("retrieval"),
        "emotion_prior": m.parts.get("emotion_prior"),
        "reply_openers": {k: v for k, v in m.part("reply_openers").items() if k != "scores"} or None,
        "reply_plans": {k: v for k, v in m.part("reply_plans").items() if k != "options"} or None,
        "parts": FittedParts.describe(m.parts, config.get("program") or {}),
        "champion": m.champion,
        "dspy": m.packages.get("dspy"),
        "packages": m.packages,
        "git_commit": m.git_commit,
        "mlflow": m.mlflow,
        "command": m.command,
        "stages": {name: {"instructions": s["instructions"], "demos": len(s["demos"])}
                   for name, s in art.stages().items()},
    }


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict) and value:
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: value}


def _demo_key(demo: dict[str, Any]) -> str:
    return json.dumps(demo, sort_keys=True, ensure_ascii=False)


def diff(a: Artifact, b: Artifact) -> dict[str, Any]:
    """What changed from ``a`` to ``b``: stages, manifest fields, dev scores."""
    stages_a, stages_b = a.stages(), b.stages()
    stages: dict[str, Any] = {}
    for name in _pipeline_order(set(stages_a) | set(stages_b)):
        sa, sb = stages_a.get(name), stages_b.get(name)
        if sa is None or sb is None:
            stages[name] = {"only_in": b.label if sa is None else a.label}
            continue
        keys_a = Counter(_demo_key(d) for d in sa["demos"])
        keys_b = Counter(_demo_key(d) for d in sb["demos"])
        changed = sa["instructions"] != sb["instructions"]
        stages[name] = {
            "instructions_changed": changed,
            "instructions_diff": "\n".join(difflib.unified_diff(
                sa["instructions"].splitlines(), sb["instructions"].splitlines(),
                fromfile=f"{a.label}/{name}", tofile=f"{b.label}/{name}", lineterm="")) if changed else "",
            "demos": [len(sa["demos"]), len(sb["demos"])],
            "demos_new": sum((keys_b - keys_a).values()),
            "demos_dropped": sum((keys_a - keys_b).values()),
            "fields_changed": sa["fields"] != sb["fields"],
        }
    flat_a = _flatten({k: v for k, v in a.manifest.to_dict().items() if k not in _NOT_DIFFED})
    flat_b = _flatten({k: v for k, v in b.manifest.to_dict().items() if k not in _NOT_DIFFED})
    manifest = {k: [flat_a.get(k), flat_b.get(k)] for k in sorted(set(flat_a) | set(flat_b))
                if flat_a.get(k) != flat_b.get(k)}
    scores = {}
    for split in ("dev_before", "dev_after"):
        sa, sb = a.manifest.dev_score(split), b.manifest.dev_score(split)
        scores[split] = {k: [sa.get(k), sb.get(k)] for k in sorted(set(sa) | set(sb))
                         if isinstance(sa.get(k, sb.get(k)), (int, float))}
    data_a, data_b = a.manifest.data, b.manifest.data
    same_dev = (data_a.get("fingerprint") == data_b.get("fingerprint")
                and data_a.get("dev_ids") == data_b.get("dev_ids"))
    return {"from": summary_head(a), "to": summary_head(b), "stages": stages, "manifest": manifest,
            "scores": scores, "same_dev_set": same_dev}


def summary_head(art: Artifact) -> dict[str, Any]:
    return {"ref": art.ref, "path": str(art.path), "name": art.manifest.name,
            "version": art.manifest.version, "created": art.manifest.created}
