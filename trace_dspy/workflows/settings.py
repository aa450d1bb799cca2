"""What a workflow runs with: the tables of a config file, typed, plus flags.

Precedence everywhere: a command-line flag wins over the environment variable that stands for it, which wins
over the config file, which wins over the default declared on the table's dataclass.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from trace_dspy.core.config import DataConfig, ProgramConfig, TracingConfig, check_tables
from trace_dspy.lm.specs import LMConfig


@dataclass
class Settings:
    """Everything a command reads from ``--config`` plus flags.

    ``program``, ``lm``, ``data`` and ``tracing`` are parsed when the settings are made; ``[metric]`` and
    ``[optimizer]`` are parsed by :meth:`metric` and :meth:`optimizer` when a command needs them, so that a
    command without a metric is not stopped by that table.
    """

    program: ProgramConfig = field(default_factory=ProgramConfig)
    lm: LMConfig = field(default_factory=LMConfig)
    raw: dict[str, Any] = field(default_factory=dict)
    config_path: str | None = None
    # True when the user chose models (flags or an [lm] table): they then win
    # over the models recorded in a loaded artifact.
    lm_explicit: bool = False
    # --trust-artifact-lm: use an artifact's recorded endpoint and key variable.
    trust_artifact_lm: bool = False
    # --allow-unverified-model: load a models:/ or runs:/ reference whose files have no digest record.
    allow_unverified_model: bool = False
    # --timeout: also applied to the LMs a loaded artifact records.
    timeout: float | None = None
    # --writer: also applied to a loaded artifact, whose recorded [program] writer it replaces.
    writer: str | None = None
    data: DataConfig = field(init=False)
    tracing: TracingConfig = field(init=False)

    def __post_init__(self) -> None:
        self.data, self.tracing = check_tables(self.raw, self.config_path)

    def data_source(self, flag: str | None) -> str | None:
        """--data wins over the [data] table's source."""
        return flag or self.data.source

    def metric(self):
        """The ``[metric]`` table as a :class:`~trace_dspy.optimize.metric.MetricConfig`."""
        from trace_dspy.optimize.metric import MetricConfig

        return MetricConfig.from_dict(self.raw.get("metric"))

    def optimizer(self, **flags: Any):
        """The ``[optimizer]`` table as an :class:`~trace_dspy.optimize.optimizers.OptimizerConfig`, with
        ``flags`` (those not None) over it."""
        from trace_dspy.optimize.optimizers import OptimizerConfig

        table = dict(self.raw.get("optimizer") or {})
        table.update({k: v for k, v in flags.items() if v is not None})
        return OptimizerConfig.from_dict(table)

    def to_dict(self) -> dict[str, Any]:
        """Safe to record: holds no secrets."""
        return {"program": self.program.to_dict(), "lm": self.lm.to_dict(), "config_file": self.config_path}
