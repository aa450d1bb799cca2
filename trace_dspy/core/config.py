"""Configuration objects.

``ProgramConfig`` decides the program's structure: which stages run and which
of them reason step by step. It is plain data: it round-trips through a dict
(for manifests and MLflow params) and through the ``[program]`` table of a
TOML config file. ``DataConfig`` and ``TracingConfig`` are the ``[data]`` and
``[tracing]`` tables; trace_dspy.workflows.settings gathers every table.
"""

from __future__ import annotations

import tomllib
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from trace_dspy.core.stages import (  # the stage registry
    OPTIONAL_STAGES,
    STAGES,
)

ADAPTER_CHOICES: tuple[str, ...] = ("auto", "chat", "compact", "json")
REPLY_FORMATS: tuple[str, ...] = ("auto", "fields", "chat", "scaffold", "briefed")
# What a chat-layout reply keeps after its first sentence (ProgramConfig.reply_second).
REPLY_SECONDS: tuple[str, ...] = ("any", "question")
PLANNER_CHOICES: tuple[str, ...] = ("auto", "lm")
# How the program writes (trace_dspy.program.writers): TRACE as published, or the small-model writer.
WRITER_CHOICES: tuple[str, ...] = ("auto", "compact", "standard")
# A config file is a few tables of settings; one far larger is not a config file.
MAX_CONFIG_BYTES = 1024 * 1024
MAX_PRIOR_K = 8
MAX_BEST_OF = 8
MAX_OPENER_VARIETY = 8  # trace_dspy.compact.openers.MAX_OPENERS: a fitted table holds at most this many
# The tables a config file may hold: [program] (with its retrieval), [data] and [tracing] are read here, [lm] by
# trace_dspy.lm.specs, [metric] by trace_dspy.optimize.metric and [optimizer] by trace_dspy.optimize.optimizers.
TABLES = ("program", "lm", "data", "metric", "optimizer", "tracing")


class ConfigError(ValueError):
    """A configuration value is invalid; the message says which and why."""


@dataclass(frozen=True)
class RetrievalConfig:
    """Exemplar retrieval for the planner and writer (used by :mod:`trace_dspy.data.retrieval`)."""

    enabled: bool = True
    k: int = 2
    filter_by_group: bool = True
    # "dialogue": index the conversation text; "situation" uses the situation when the data has one.
    text: str = "dialogue"

    def __post_init__(self) -> None:
        if not 1 <= self.k <= 8:
            raise ConfigError("retrieval k must be between 1 and 8")
        if self.text not in ("dialogue", "situation"):
            raise ConfigError("retrieval text must be 'dialogue' or 'situation'")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> RetrievalConfig:
        return from_table(cls, data, "retrieval")


@dataclass(frozen=True)
class DataConfig:
    """The ``[data]`` table: the data source and how many examples each split of a compile takes.

    ``--data`` wins over ``source``, which wins over ``$TRACE_DSPY_DATA`` (see trace_dspy.data.sources);
    ``--train``, ``--dev`` and ``--val`` win over the sizes.
    """

    source: str | None = None
    train: int = 16
    dev: int = 16
    # Selection examples for optimizers that score candidates, drawn from the training side apart from train.
    val: int = 8

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> DataConfig:
        unknown = set(data or {}) - {f.name for f in fields(cls)}
        if unknown:
            raise ConfigError(f"[data] unknown keys: {', '.join(sorted(unknown))}; use source, train, dev, val")
        return cls(**(data or {}))


@dataclass(frozen=True)
class TracingConfig:
    """The ``[tracing]`` table: ``enabled = true`` records each answer as an MLflow trace, as ``--trace`` does."""

    enabled: bool = False

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> TracingConfig:
        data = data or {}
        if set(data) - {"enabled"} or not isinstance(data.get("enabled", False), bool):
            raise ConfigError("[tracing] takes one key, enabled = true or false")
        return cls(**data)


@dataclass(frozen=True)
class ProgramConfig:
    """Structure of a :class:`~trace_dspy.TraceProgram`.

    reasoning: stages that write a step-by-step ``reasoning`` field before their
        answer. None by default: on the embedded 135M model it doubles the time per
        dialogue without helping. TRACE's own agents reason in the identifier and
        the planner: ``reasoning = ["recognize_emotion", "plan_strategy"]``.
    disabled: optional stages switched off for ablations; downstream stages then
        lose the inputs that stage would have produced.
    retrieval: exemplar retrieval (see trace_dspy.data.retrieval.RetrievalConfig): on by
        default with k=2, used whenever the program has an index.
    commonsense: run ``infer_commonsense`` (ATOMIC-style xIntent/xNeed/xWant/xEffect/
        xReact) before the cause stage and feed it to ``analyze_cause``.
    reflection: run ``reflect`` after the reply: it audits every stage, names the
        earliest faulty one, which is redone with the audit's note together with
        everything after it, at most ``reflection_rounds`` times.
    writer: how the program writes (trace_dspy.program.writers). ``standard``:
        TRACE as published, four stages through DSPy's adapters, one reply and
        an optional Best-of-N by the metric. ``compact``: the small-model writer
        (trace_dspy.compact): the compact prompt layout, the scaffolded reply,
        several candidates chosen by a guarded reward, the plan race and the
        prior's single label. ``auto`` (the default): compact where the reply
        stage runs on the embedded model or ``reply_format`` asks for chat or
        scaffold, standard otherwise. The settings marked "(compact writer)"
        are read only by it; ``auto`` values resolve per writer.
    adapter: how prompts are laid out: ``chat`` (DSPy's ChatAdapter), ``compact``
        (fewer layout tokens, for grammar-constrained small models), ``json``, or
        ``auto``: compact under the compact writer, DSPy's own otherwise.
    reply_format (compact writer): how the reply stage is asked: ``fields`` (the adapter's field
        layout, like every stage), ``chat`` (the conversation as chat turns, the
        plan in words, the reply as the plain answer; see
        trace_dspy.compact.reply_adapter.ChatReplyAdapter), ``scaffold`` (the chat turns,
        and one sentence per planned mechanism, each begun with an opener the
        model goes on from: "That sounds" for ER, "You must be feeling" for IP,
        "How are you feeling" for EX; see ``scaffold_openers``; a compile with
        ``--opener-items`` ranks each mechanism's openers by the metric and the
        artifact keeps its own, see trace_dspy.compact.opener_fit), or ``auto``:
        scaffold under the compact writer, where it was measured against chat
        (docs/results/replies.md, "Scaffolded replies"); ``briefed`` (the chat
        turns, the recognized emotion and the plan in the system line: the
        layout a fine-tuned writer learns, trace_dspy.compact.finetune). The
        standard writer always asks in the field layout. Artifacts saved before the option existed load as
        ``fields``, the layout they were compiled with.
    prior_k: how many candidate labels the fitted emotion prior (see
        trace_dspy.program.emotion_prior) offers ``recognize_emotion``, with their
        probabilities; a grammar-constrained engine may only choose among them.
        0 turns the prior off. ``auto`` (the default): 1 under the compact writer
        (measured on the embedded model, where the prior's first label beat the
        LM's choice), 5 under the standard writer. With one candidate on a
        constrained engine the stage takes it without an LM call. Artifacts saved
        before the prior existed load with 0.
    best_of: how many reply candidates the reply stage may write: the first as
        the LM is configured (greedy by default), the others by ``dspy.BestOfN``
        at temperature 1.0 (min-p 0.3 on the embedded engine: ``[lm.local]
        sample_min_p``); the one with the highest reference-free metric score
        (learned empathy, strategy fit, relevance and rules; no LM call) is kept.
        Candidates stop as soon as one reaches ``best_of_threshold``. 1 = one reply.
        ``auto``: 4 under the compact writer (measured on the embedded model,
        docs/results/replies.md), 1 under the standard writer. Artifacts
        saved before the option existed load with 1.
    opener_variety (compact writer): where the program keeps a history of the openings of its
        recent replies (``respond`` and ``chat``), how many of the
        acknowledgement's (ER) best openers a scaffolded reply's first candidate
        is drawn from (3: all the stock ones): the one recent replies used
        least, ties broken by a stable hash of the speaker's last turn. Without
        a history (evaluations, compiles) the best one. 1: always the best. A
        tone band's acknowledgements (``trace_dspy.compact.openers.BAND_OPENERS``)
        are all drawn from, with or without a history, whatever this says.
        Artifacts saved before the option existed load with the default.
    variety_penalty (compact writer): where the program keeps a history of the openings of its
        recent replies (``respond`` and ``chat`` do; evaluations and compiles
        do not), the reply race and Best-of-N sampling lower each candidate by
        this much times the share of recent replies that opened with the same
        two words before they choose; the recorded rewards are unchanged. 0
        turns it off.
    tone_floor (compact writer): the reply reward's tone guard. The metric's tone head
        (trace_dspy.optimize.tone) gives the chance that a candidate's tone is
        on the side of the situation, as pleasant as the emotion prior finds it
        (``TraceProgram.situation_pleasant``); below this floor the candidate's
        reward is scaled by agreement / floor, so a reply that cheers at bad
        news loses to one that does not. 0 turns it off. It needs the embed
        extra (without it the guard is off, with a warning). Artifacts saved
        before the option existed load with the default.
    planner (compact writer): how the plan stage decides. ``auto`` (the default): where the
        artifact holds a fitted ``first_plan`` (a compile found that, on the
        grammar-constrained embedded model, racing fitted plans without the
        planner's plan scored as well; see trace_dspy.compact.plan_fit) and the LM
        is such a model, the planner is not called and the reply race starts
        from that plan. Everywhere else the LM plans. ``lm``: the LM always
        plans. Artifacts without a first plan behave the same under both.
    reply_exemplars (compact writer): in the chat and scaffold layouts, show the writer the retrieved
        exemplars (the nearest conversations of the pool, filtered by the
        emotion's group) as earlier chat turns, so that a small model answers
        in their tone (docs/results/replies.md, "Nearest exemplars for the writer").
        The copy guard scores a candidate that pastes one 0. Artifacts saved
        before the option existed load with false.
    reply_second (compact writer, chat and briefed layouts): what a reply keeps after its first
        sentence. ``any`` (the default): a second sentence whatever it says; ``question``: only
        one that asks. A small fine-tuned writer's second statements ("I hope you did not fail."
        to an A on a final) are where it most often invents what happened; read blind, its
        replies cut this way were sent more often, though the metric scores them lower
        (docs/results/finetuning.md).
    """

    reasoning: tuple[str, ...] = ()
    disabled: tuple[str, ...] = ()
    writer: str = "auto"
    adapter: str = "auto"
    reply_format: str = "auto"
    prior_k: int | str = "auto"
    best_of: int | str = "auto"
    best_of_threshold: float = 0.6
    tone_floor: float = 0.5
    opener_variety: int = 3
    variety_penalty: float = 0.2
    planner: str = "auto"
    reply_exemplars: bool = True
    reply_second: str = "any"
    retrieval: RetrievalConfig | dict[str, Any] | None = None  # a dict or None is turned into a RetrievalConfig
    commonsense: bool = False
    reflection: bool = False
    reflection_rounds: int = 2
    extra: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "reasoning", _stage_tuple("reasoning", self.reasoning, STAGES))
        object.__setattr__(self, "disabled", _stage_tuple("disabled", self.disabled, OPTIONAL_STAGES))
        if not isinstance(self.retrieval, RetrievalConfig):
            object.__setattr__(self, "retrieval", RetrievalConfig.from_dict(self.retrieval))
        if self.writer not in WRITER_CHOICES:
            raise ConfigError(f"writer must be one of {', '.join(WRITER_CHOICES)}, not {self.writer!r}")
        if self.writer == "standard" and self.reply_format in ("chat", "scaffold", "briefed"):
            raise ConfigError(f"reply_format {self.reply_format!r} is the compact writer's layout; the standard "
                              "writer asks for the reply in DSPy's fields (set writer to compact or auto, or "
                              "reply_format to fields)")
        if self.adapter not in ADAPTER_CHOICES:
            raise ConfigError(f"adapter must be one of {', '.join(ADAPTER_CHOICES)}, not {self.adapter!r}")
        if self.reply_format not in REPLY_FORMATS:
            raise ConfigError(f"reply_format must be one of {', '.join(REPLY_FORMATS)}, not {self.reply_format!r}")
        if self.reply_second not in REPLY_SECONDS:
            raise ConfigError(f"reply_second must be one of {', '.join(REPLY_SECONDS)}, not {self.reply_second!r:.40}")
        if self.prior_k != "auto" and (isinstance(self.prior_k, bool) or not isinstance(self.prior_k, int)
                                       or not 0 <= self.prior_k <= MAX_PRIOR_K):
            raise ConfigError(f"prior_k must be 'auto' or an integer from 0 (prior off) to {MAX_PRIOR_K}, "
                              f"not {self.prior_k!r}")
        if self.best_of != "auto" and (isinstance(self.best_of, bool) or not isinstance(self.best_of, int)
                                       or not 1 <= self.best_of <= MAX_BEST_OF):
            raise ConfigError(f"best_of must be 'auto' or an integer from 1 to {MAX_BEST_OF}, not {self.best_of!r}")
        if isinstance(self.best_of_threshold, bool) or not isinstance(self.best_of_threshold, (int, float)) \
                or not 0 <= self.best_of_threshold <= 1:
            raise ConfigError(f"best_of_threshold must be a number in [0, 1], not {self.best_of_threshold!r}")
        if isinstance(self.opener_variety, bool) or not isinstance(self.opener_variety, int) \
                or not 1 <= self.opener_variety <= MAX_OPENER_VARIETY:
            raise ConfigError(f"opener_variety must be an integer from 1 to {MAX_OPENER_VARIETY}, "
                              f"not {self.opener_variety!r}")
        if isinstance(self.variety_penalty, bool) or not isinstance(self.variety_penalty, (int, float)) \
                or not 0 <= self.variety_penalty <= 1:
            raise ConfigError(f"variety_penalty must be a number in [0, 1], not {self.variety_penalty!r}")
        if isinstance(self.tone_floor, bool) or not isinstance(self.tone_floor, (int, float)) \
                or not 0 <= self.tone_floor <= 1:
            raise ConfigError(f"tone_floor must be a number in [0, 1], not {self.tone_floor!r}")
        if self.planner not in PLANNER_CHOICES:
            raise ConfigError(f"planner must be one of {', '.join(PLANNER_CHOICES)}, not {self.planner!r}")
        if not isinstance(self.reply_exemplars, bool):
            raise ConfigError(f"reply_exemplars must be true or false, not {self.reply_exemplars!r}")
        if not isinstance(self.reflection_rounds, int) or not 1 <= self.reflection_rounds <= 5:
            raise ConfigError("reflection_rounds must be an integer from 1 to 5")
        if self.extra:
            raise ConfigError(f"unknown [program] keys: {', '.join(sorted(self.extra))}")

    def enabled(self, stage: str) -> bool:
        if stage == "infer_commonsense":
            return self.commonsense
        if stage == "reflect":
            return self.reflection
        return stage not in self.disabled

    def pipeline(self) -> tuple[str, ...]:
        """The stages that run, in order (reflect last)."""
        return tuple(s for s in STAGES if self.enabled(s))

    def reasons(self, stage: str) -> bool:
        return stage in self.reasoning

    def to_dict(self) -> dict[str, Any]:
        return {"reasoning": list(self.reasoning), "disabled": list(self.disabled), "writer": self.writer,
                "adapter": self.adapter,
                "reply_format": self.reply_format, "prior_k": self.prior_k, "best_of": self.best_of,
                "best_of_threshold": self.best_of_threshold, "tone_floor": self.tone_floor,
                "opener_variety": self.opener_variety, "variety_penalty": self.variety_penalty,
                "planner": self.planner,
                "reply_exemplars": self.reply_exemplars, "reply_second": self.reply_second,
                "retrieval": self.retrieval.to_dict(), "commonsense": self.commonsense,
                "reflection": self.reflection, "reflection_rounds": self.reflection_rounds}

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> ProgramConfig:
        data = dict(data or {})
        known = {f.name for f in fields(cls)} - {"extra"}
        extra = {k: data.pop(k) for k in list(data) if k not in known}
        return cls(**data, extra=extra)


def _stage_tuple(name: str, value: Any, allowed: tuple[str, ...]) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    try:
        items = list(value)
    except TypeError:
        raise ConfigError(f"{name} must be a list of stage names") from None
    bad = [v for v in items if v not in allowed]
    if bad:
        raise ConfigError(f"{name}: {', '.join(map(repr, bad))} not allowed; choose from {', '.join(allowed)}")
    # Keep pipeline order and drop repeats so equal configs compare equal.
    return tuple(s for s in allowed if s in items)


def from_table(cls, data: dict[str, Any] | None, table: str):
    """Build a config dataclass from a TOML table, refusing unknown keys by name."""
    data = dict(data or {})
    unknown = set(data) - {f.name for f in fields(cls)}
    if unknown:
        raise ConfigError(f"[{table}] unknown keys: {', '.join(sorted(unknown))}")
    return cls(**data)


def check_tables(raw: dict[str, Any], path: str | Path | None = None) -> tuple[DataConfig, TracingConfig]:
    """Refuse unknown tables in a config file's ``raw`` tables; the ``[data]`` and ``[tracing]`` tables, typed."""
    unknown = set(raw) - set(TABLES)
    if unknown:
        raise ConfigError(f"{path}: unknown table(s) {', '.join(sorted(unknown))}")
    return DataConfig.from_dict(raw.get("data")), TracingConfig.from_dict(raw.get("tracing"))


def read_toml(path: str | Path) -> dict[str, Any]:
    """Read a TOML config file, with errors that name the file: a regular file of at most
    ``MAX_CONFIG_BYTES`` of UTF-8 (:func:`trace_dspy.core.files.read_text`; a FIFO is refused at once)."""
    from trace_dspy.core.files import FileCheckError, read_text

    path = Path(path)
    try:
        return tomllib.loads(read_text(path, max_bytes=MAX_CONFIG_BYTES))
    except FileCheckError as exc:
        if exc.missing:
            raise ConfigError(f"config file not found: {path}") from None
        raise ConfigError(str(exc)) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}") from None


def program_config_from_toml(path: str | Path) -> ProgramConfig:
    return ProgramConfig.from_dict(read_toml(path).get("program"))


__all__ = ["ConfigError", "DataConfig", "OPTIONAL_STAGES", "ProgramConfig", "RetrievalConfig", "STAGES", "TABLES",
           "TracingConfig", "check_tables", "program_config_from_toml", "read_toml"]
