"""The artifact manifest as one type: ``Manifest``, its schema version, its checks and its migrations.

``manifest.json`` is written from ``Manifest.to_dict()`` and read back by
``Manifest.from_dict()``, which checks every field's JSON type and brings an
older manifest up to date with the migrations below. Nothing else in the
package reads the manifest's JSON.

Schema versions. A change an older reader would misread bumps
``SCHEMA_VERSION`` and adds a step to ``MIGRATIONS`` (the step for version N
turns a version-N manifest into a version-N+1 one). Fields added without such a
change (all of them so far) keep the schema version, so that older installs
still read newer artifacts, and ``MIGRATIONS[SCHEMA_VERSION]`` completes a
manifest written before a field existed with the value that reproduces how that
artifact was compiled and evaluated.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from trace_dspy.core.config import ConfigError, ProgramConfig
from trace_dspy.store.errors import ArtifactError

SCHEMA_VERSION = 1
REQUIRED_KEYS = ("schema_version", "name", "version", "created", "config", "predictors")

# Manifest fields and the JSON types they must have (None = may be null).
FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "schema_version": (int,), "name": (str,), "version": (int,), "created": (str,), "config": (dict,),
    "predictors": (list,), "git_commit": (str, type(None)), "packages": (dict,), "optimizer": (dict,),
    "metric": (dict,), "scores": (dict,), "data": (dict,), "mlflow": (dict,), "command": (str,),
    "champion": (dict, type(None)),
}
# A fitted part's record (trace_dspy.program.parts) is a top-level table named after the part.
PART_TYPES = (dict, type(None))

# Program settings an older schema-1 manifest may lack, with the value it was compiled with: its reply stage
# kept the field layout, its emotion stage had no candidates field, it wrote one reply, and its chat writer did
# not see the retrieved exemplars.
_V1_PROGRAM_DEFAULTS = {"reply_format": "fields", "prior_k": 0, "best_of": 1, "reply_exemplars": False}


def _complete_v1(raw: dict[str, Any]) -> dict[str, Any]:
    """A schema-1 manifest with the program settings added since it was written (see ``_V1_PROGRAM_DEFAULTS``)."""
    config = dict(raw["config"])
    if isinstance(config.get("program"), dict):
        config["program"] = {**_V1_PROGRAM_DEFAULTS, **config["program"]}
    return {**raw, "config": config}


# Schema version -> the step that brings a manifest of that version up to date (see the module docstring).
MIGRATIONS: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {1: _complete_v1}


def check_type(path: Path | str, field_: str, value: Any, types: tuple[type, ...]) -> None:
    """Raise ``ArtifactError(path, field_, ...)`` unless ``value`` has one of the JSON ``types``."""
    if isinstance(value, bool) and bool not in types or not isinstance(value, types):
        names = " or ".join("null" if t is type(None) else {"dict": "object", "list": "list", "str": "text",
                                                              "int": "integer"}.get(t.__name__, t.__name__)
                            for t in types)
        raise ArtifactError(path, field_, f"expected {names}, found {type(value).__name__}")


def migrate(raw: dict[str, Any], path: Path | str = "manifest.json") -> dict[str, Any]:
    """``raw`` brought up to ``SCHEMA_VERSION`` by ``MIGRATIONS``; a newer or unknown version is refused."""
    version = raw["schema_version"]
    if version not in MIGRATIONS:
        raise ArtifactError(f"{path}: schema version {version} is not supported (this trace-dspy reads "
                            f"{', '.join(map(str, sorted(MIGRATIONS)))})")
    while version <= SCHEMA_VERSION:
        raw = MIGRATIONS[version](raw)
        version += 1
        if version <= SCHEMA_VERSION:
            raw = {**raw, "schema_version": version}
    return raw


def _check(raw: dict[str, Any], path: Path | str, part_keys: tuple[str, ...]) -> None:
    missing = [k for k in REQUIRED_KEYS if k not in raw]
    if missing:
        raise ArtifactError(f"{path}: missing {', '.join(missing)}")
    for key, types in FIELD_TYPES.items():
        if key in raw:
            check_type(path, key, raw[key], types)
    for key in part_keys:
        if key in raw:
            check_type(path, key, raw[key], PART_TYPES)
    for i, name in enumerate(raw["predictors"]):
        check_type(path, f"predictors[{i}]", name, (str,))
    for key in ("program", "lm"):
        if raw["config"].get(key) is not None:
            check_type(path, f"config.{key}", raw["config"][key], (dict,))
    for key, value in (raw.get("packages") or {}).items():
        check_type(path, f"packages.{key}", value, (str,))


@dataclass(frozen=True)
class Manifest:
    """What is needed to rebuild and trust a compiled program (``manifest.json``).

    Args:
        name, version: the artifact's name and version number (0 until written).
        created: when the version was written (ISO 8601, UTC).
        config: the compile's config as recorded (``program``, ``lm``, ``metric``, ``optimizer``, ``data``,
            ``run``); never a key.
        predictors: the program's predictor names, as saved in ``program.json``.
        optimizer, metric, scores, data, mlflow, command: the optimizer and its settings, the metric, the dev
            scores (``dev_before``, ``dev_after``), the data fingerprint and ids, the MLflow run, the command.
        parts: each fitted part's record (``trace_dspy.program.parts``), by part name.
        champion: how the program compared with the registry's champion on the same dev items, when it did.
        extra: fields this version does not know, kept as read.

    Example:
        >>> m = Manifest.from_dict(json.loads(path.read_text()), path)
        >>> m.label, m.program_config().prior_k
    """

    name: str
    config: dict[str, Any]
    predictors: tuple[str, ...] = ()
    version: int = 0
    created: str = ""
    schema_version: int = SCHEMA_VERSION
    git_commit: str | None = None
    packages: dict[str, str] = field(default_factory=dict)
    optimizer: dict[str, Any] = field(default_factory=dict)
    metric: dict[str, Any] = field(default_factory=dict)
    scores: dict[str, Any] = field(default_factory=dict)
    data: dict[str, Any] = field(default_factory=dict)
    mlflow: dict[str, Any] = field(default_factory=dict)
    command: str = ""
    parts: dict[str, dict[str, Any] | None] = field(default_factory=dict)
    champion: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    path: Path | None = field(default=None, compare=False)

    @classmethod
    def from_dict(cls, raw: dict[str, Any], path: Path | str = "manifest.json") -> Manifest:
        """Check ``raw`` field by field (``ArtifactError`` naming the file and field), migrate it, type it."""
        from trace_dspy.program.parts import part_names

        names = part_names()
        _check(raw, path, names)
        raw = migrate(raw, path)
        known = {f.name for f in fields(cls)} - {"parts", "extra", "path"}
        values = {k: v for k, v in raw.items() if k in known}
        values["predictors"] = tuple(values["predictors"])
        return cls(**values, parts={k: raw[k] for k in names if k in raw},
                   extra={k: v for k, v in raw.items() if k not in known and k not in names},
                   path=Path(path))

    def to_dict(self) -> dict[str, Any]:
        """The JSON object written as ``manifest.json`` (parts as top-level tables, as older readers expect)."""
        out: dict[str, Any] = {"schema_version": self.schema_version, "name": self.name, "version": self.version,
                               "created": self.created, "git_commit": self.git_commit, "packages": self.packages,
                               "predictors": list(self.predictors)}
        for key in ("config", "optimizer", "metric", "scores", "data", "mlflow", "command"):
            out[key] = getattr(self, key)
        out.update(self.parts)
        if self.champion is not None:
            out["champion"] = self.champion
        return {**out, **self.extra}

    @property
    def label(self) -> str:
        """``NAME@vN``."""
        return f"{self.name}@v{self.version}"

    @property
    def where(self) -> str:
        return str(self.path or "manifest.json")

    def part(self, name: str) -> dict[str, Any]:
        """The record of the fitted part ``name`` (empty when this artifact has none)."""
        return self.parts.get(name) or {}

    def dev_score(self, split: str) -> dict[str, Any]:
        """The dev summary ``dev_before`` or ``dev_after`` (empty when not recorded)."""
        return (self.scores or {}).get(split) or {}

    def program_config(self) -> ProgramConfig:
        """The program's config as compiled; ``ArtifactError`` when it is invalid."""
        try:
            return ProgramConfig.from_dict(dict(self.config.get("program") or {}))
        except (ConfigError, AttributeError, TypeError) as exc:
            raise ArtifactError(f"{self.where}: invalid config: {exc}") from None

    def lm_config(self):
        """The recorded LM config (``LMConfig``), every setting's type and bounds checked."""
        from trace_dspy.lm.specs import LMConfig

        try:
            return LMConfig.from_dict(self.config.get("lm"))
        except (ConfigError, AttributeError, TypeError) as exc:
            raise ArtifactError(self.where, "config.lm", f"invalid config: {exc}") from None
