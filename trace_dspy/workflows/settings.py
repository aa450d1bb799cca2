"""What a workflow runs with: the program, LM, data, metric and optimizer tables of a config file, plus flags."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from trace_dspy.core.config import ProgramConfig
from trace_dspy.lm.specs import LMConfig


@dataclass
class Settings:
    """Everything a command reads from ``--config`` plus flags."""

    program: ProgramConfig = field(default_factory=ProgramConfig)
    lm: LMConfig = field(default_factory=LMConfig)
    raw: dict[str, Any] = field(default_factory=dict)
    config_path: str | None = None
    # True when the user chose models (flags or an [lm] table): they then win
    # over the models recorded in a loaded artifact.
    lm_explicit: bool = False
    # --trust-artifact-lm: use an artifact's recorded endpoint and key variable.
    trust_artifact_lm: bool = False
    # --timeout: also applied to the LMs a loaded artifact records.
    timeout: float | None = None

    def data_source(self, flag: str | None) -> str | None:
        """--data wins over the [data] table's source."""
        return flag or (self.raw.get("data") or {}).get("source")

    def to_dict(self) -> dict[str, Any]:
        """Safe to record: holds no secrets."""
        return {"program": self.program.to_dict(), "lm": self.lm.to_dict(), "config_file": self.config_path}
