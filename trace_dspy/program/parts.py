"""A program's fitted parts: what a compile fits besides prompts and demos, saved with the artifact.

Each kind of part is one ``FittedPart`` subclass, listed once in ``PARTS``:

- ``retrieval``: the exemplar index (``index/``) the plan and reply stages retrieve from;
- ``emotion_prior``: the emotion classifier (``emotion_prior.npz``) that offers the emotion stage candidates;
- ``reply_openers``: the scaffolded reply's fitted openers (kept in the manifest);
- ``reply_plans``: the further reply plans a reply is written for (kept in the manifest);
- ``first_plan``: the plan a constrained LM's reply race starts from in place of a planner call, where the
  compile found that call did not pay (kept in the manifest);
- ``writer_adapter``: the fine-tuned writer, a LoRA adapter (``writer_adapter.gguf``) the reply stage runs with
  on the embedded model (``trace_dspy.program.adapter_part``).

A part's name is its manifest table (its record: how it was fitted, and the
value itself for parts small enough to keep there) and its ``TraceProgram``
attribute. ``FittedParts`` bundles one value per kind (None or empty: not
fitted) with the records, and saves, loads and describes them all. Adding a
kind of part is one new subclass and one entry in ``PARTS``; the program code
that uses it, and the compile step that fits it, are the feature itself.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

Record = dict[str, Any]


class PartError(ValueError):
    """A saved part is missing or damaged. ``PartError(message)`` or ``PartError(file, field, reason)``."""

    def __init__(self, file_or_message: Any, field: str | None = None, reason: str | None = None):
        self.file = str(file_or_message) if reason is not None else None
        self.field, self.reason = field, reason
        super().__init__(f"{file_or_message}: {field}: {reason}" if reason is not None else str(file_or_message))


class FittedPart:
    """One kind of fitted part. Subclasses set ``name`` and ``label`` and override what they need.

    ``check`` normalizes a value (ValueError when it is not one); ``record`` is
    what the manifest keeps; ``save`` writes the part's files into an artifact
    folder; ``load`` reads it back (``PartError``); ``describe`` is one line for
    ``inspect``, from the manifest alone.
    """

    name: ClassVar[str]
    label: ClassVar[str]
    empty: ClassVar[Any] = None

    @classmethod
    def check(cls, value: Any) -> Any:
        return cls.empty if value is None else value

    @classmethod
    def record(cls, value: Any, fit: Record | None, config) -> Record | None:
        return fit

    @classmethod
    def save(cls, value: Any, folder: Path) -> None:
        """Write the part's files into ``folder`` (nothing for parts kept in the manifest)."""

    @classmethod
    def load(cls, folder: Path, record: Record, config) -> Any:
        raise NotImplementedError

    @classmethod
    def describe(cls, record: Record, program: Mapping[str, Any]) -> str:
        raise NotImplementedError


def _num(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "-" if value is None else str(value)
    return f"{value:.3f}" if abs(value) < 10 else f"{value:.1f}"


class RetrievalIndex(FittedPart):
    """The exemplar index over the training pool (``trace_dspy.data.retrieval.ExemplarIndex``)."""

    name, label, folder = "retrieval", "exemplars", "index"

    @classmethod
    def record(cls, value, fit, config) -> Record:
        return {**config.retrieval.to_dict(), "index": value.fingerprint if value is not None else None,
                "pool_items": len(value.items) if value is not None else 0}

    @classmethod
    def save(cls, value, folder: Path) -> None:
        if value is not None:
            value.save(folder / cls.folder)

    @classmethod
    def load(cls, folder: Path, record: Record, config):
        index = record.get("index")
        if index is not None and not isinstance(index, (str, bool)):
            raise PartError(folder / "manifest.json", "retrieval.index", f"expected text, found {type(index).__name__}")
        if not config.retrieval.enabled:
            return None
        if not (folder / cls.folder).is_dir():
            if index:
                raise PartError(f"{folder}: the retrieval index ({cls.folder}/) is missing")
            return None
        from trace_dspy.core.config import ConfigError
        from trace_dspy.data.retrieval import ExemplarIndex

        try:
            return ExemplarIndex.load(folder / cls.folder, root=folder)
        except ConfigError as exc:
            raise PartError(str(exc)) from None

    @classmethod
    def describe(cls, record, program) -> str:
        if not (program.get("retrieval") or {}).get("enabled", record.get("enabled")):
            return "off"
        if not record.get("index"):
            return "none saved"
        return f"{record.get('pool_items')} training items, top {record.get('k')} ({record['index']})"


class EmotionPriorPart(FittedPart):
    """The emotion classifier (``trace_dspy.program.emotion_prior.EmotionPrior``)."""

    name, label = "emotion_prior", "emotion"

    @classmethod
    def save(cls, value, folder: Path) -> None:
        from trace_dspy.program.emotion_prior import FILE_NAME

        if value is not None:
            value.save(folder / FILE_NAME)

    @classmethod
    def load(cls, folder: Path, record: Record, config):
        from trace_dspy.program.emotion_prior import FILE_NAME, EmotionPrior, PriorError

        recorded = record.get("file")
        if recorded is not None and not isinstance(recorded, (str, bool)):
            raise PartError(folder / "manifest.json", "emotion_prior.file",
                            f"expected text, found {type(recorded).__name__}")
        path = folder / FILE_NAME
        if not os.path.lexists(path):
            if recorded:
                raise PartError(f"{folder}: the emotion prior ({FILE_NAME}) is missing")
            return None
        try:
            return EmotionPrior.load(path, root=folder)
        except PriorError as exc:
            raise PartError(str(exc)) from None

    @classmethod
    def describe(cls, record, program) -> str:
        """How the artifact decides the emotion, with the fitted prior's dev accuracy."""
        k = program.get("prior_k", 0)
        if not k:
            return "LM alone (no emotion prior)"
        if not record.get("file"):
            return f"LM alone (prior_k {k}, but {record.get('reason', 'none was fitted')})"
        how = ("the prior decides under the compact writer, top 5 + LM under the standard one" if k == "auto"
               else f"prior top {k} + LM")
        return (f"{how}; prior dev accuracy {_num(record.get('dev_accuracy'))} "
                f"(group {_num(record.get('dev_group_accuracy'))}, top-3 {_num(record.get('dev_top3'))}) "
                f"on {record.get('dev_samples')} dev items, fitted on {record.get('train_samples')}")


class ManifestPart(FittedPart):
    """A part small enough to keep its value in its manifest record, under ``field``."""

    field: ClassVar[str]

    @classmethod
    def record(cls, value, fit, config) -> Record:
        return fit or {cls.field: None if cls.empty is None else list(cls.empty)}

    @classmethod
    def load(cls, folder: Path, record: Record, config):
        try:
            return cls.check(record.get(cls.field))
        except ValueError as exc:
            raise PartError(folder / "manifest.json", f"{cls.name}.{cls.field}", str(exc)) from None


class ReplyOpeners(ManifestPart):
    """The scaffolded reply's openers (valence -> mechanism -> openers, best first); None: the stock ones."""

    name, label, field = "reply_openers", "openers", "openers"

    @classmethod
    def check(cls, value):
        from trace_dspy.core.labels import check_openers

        return check_openers(value) if value else None

    @classmethod
    def describe(cls, record, program) -> str:
        """The first opener per valence and mechanism, when the compile fitted them."""
        openers = record.get("openers")
        if not openers:
            return "stock (not fitted)"
        first = "; ".join(f"{valence}: " + ", ".join(f"{kind} {options[0]!r}" for kind, options in table.items())
                          for valence, table in openers.items() if valence != "any")
        return f"fitted on {record.get('items')} training dialogues; first {first}"


class ReplyPlans(ManifestPart):
    """Further (primary, secondary) plans a reply is written for; (): the LM's plan only."""

    name, label, empty, field = "reply_plans", "plans", (), "plans"

    @classmethod
    def check(cls, value):
        from trace_dspy.core.labels import check_plans

        return check_plans(value or ())

    @classmethod
    def describe(cls, record, program) -> str:
        """The further plans, when the compile chose any, with the training scores they were chosen by."""
        if record.get("items") is None:
            return "the LM's plan only (not fitted)"
        chosen = ", ".join(record.get("plans") or []) or "none"
        if record.get("first_plan"):
            return (f"{record['first_plan']} (no planner call under the compact writer) + {chosen}; with the LM's "
                    f"plan first, training score {_num(record.get('baseline'))} -> {_num(record.get('score'))} "
                    f"on {record.get('items')} dialogues")
        return (f"the LM's plan + {chosen}: training score {_num(record.get('baseline'))} -> "
                f"{_num(record.get('score'))} on {record.get('items')} dialogues")


class FirstPlan(ManifestPart):
    """The (primary, secondary) plan a constrained LM's reply race starts from in place of a planner call (the
    further plans follow); None: the planner is asked."""

    name, label, field = "first_plan", "planner", "plan"

    @classmethod
    def check(cls, value):
        from trace_dspy.core.labels import check_plans

        if value is None:
            return None
        plans = check_plans([value])
        if len(plans) != 1:
            raise ValueError(f"plan {value!r} is not one (primary, secondary) pair")
        return plans[0]

    @classmethod
    def describe(cls, record, program) -> str:
        """Whether the planner is asked, with the training scores of the races with and without its plan."""
        if record.get("items") is None:
            return "asked (not fitted)"
        scores = (f"training score {_num(record.get('score_without'))} without its plan, "
                  f"{_num(record.get('score_with_planner'))} with it, on {record.get('items')} dialogues")
        if not record.get("plan"):
            return f"asked ({scores})"
        if program.get("planner", "auto") != "auto":
            return f"asked (planner = {program.get('planner')}; {scores})"
        return (f"not asked by the compact writer, the race starts from {record['plan']} ({scores}); asked by the "
                "standard writer")


class WriterAdapterPart(FittedPart):
    """The fine-tuned writer's LoRA adapter (``trace_dspy.program.adapter_part.WriterAdapter``); None: the reply
    stage runs on its LM as it is."""

    name, label = "writer_adapter", "writer adapter"

    @classmethod
    def check(cls, value):
        from trace_dspy.program.adapter_part import as_adapter

        return as_adapter(value)

    @classmethod
    def record(cls, value, fit, config) -> Record | None:
        from trace_dspy.program.adapter_part import adapter_record

        return adapter_record(value, fit)

    @classmethod
    def save(cls, value, folder: Path) -> None:
        if value is not None:
            value.save(folder)

    @classmethod
    def load(cls, folder: Path, record: Record, config):
        from trace_dspy.program.adapter_part import AdapterPartError, load_adapter

        try:
            return load_adapter(folder, record)
        except AdapterPartError as exc:
            raise PartError(*exc.args) from None

    @classmethod
    def describe(cls, record, program) -> str:
        from trace_dspy.program.adapter_part import describe_adapter

        return describe_adapter(record, program)


# The registry: every kind of fitted part, in the order they are loaded and shown.
PARTS: tuple[type[FittedPart], ...] = (RetrievalIndex, EmotionPriorPart, ReplyOpeners, ReplyPlans, FirstPlan,
                                       WriterAdapterPart)


def part_names() -> tuple[str, ...]:
    """The registered parts' names (their manifest tables)."""
    return tuple(p.name for p in PARTS)


class FittedParts:
    """One value per kind of fitted part, with the records a compile made; immutable.

    Args:
        values: part name -> value (left out: not fitted). Each value is checked by its part.
        records: part name -> how it was fitted (``Manifest.parts``), when known.

    Example:
        >>> parts = FittedParts({"reply_plans": ["EX+EX"]})
        >>> program = TraceProgram(config, parts=parts)
        >>> records = parts.save(folder, config)        # files in folder; records for the manifest
        >>> FittedParts.load(folder, records, config)["reply_plans"]
        (('EX', 'EX'),)
    """

    __slots__ = ("_records", "_values")

    def __init__(self, values: Mapping[str, Any] | None = None, records: Mapping[str, Record | None] | None = None):
        unknown = (set(values or {}) | set(records or {})) - set(part_names())
        if unknown:
            raise ValueError(f"unknown fitted part(s): {', '.join(sorted(unknown))}; known: {', '.join(part_names())}")
        given = dict(values or {})
        self._values = {p.name: p.check(given.get(p.name)) for p in PARTS}
        self._records = dict(records or {})

    def __getitem__(self, name: str) -> Any:
        return self._values[name]

    def __repr__(self) -> str:
        fitted = [n for n in part_names() if self._values[n] not in (None, ())]
        return f"FittedParts({', '.join(fitted) or 'none fitted'})"

    def replace(self, **values: Any) -> FittedParts:
        """A copy with some values replaced (their records dropped: they describe the old values)."""
        return FittedParts({**self._values, **values}, {k: v for k, v in self._records.items() if k not in values})

    def with_records(self, **records: Record | None) -> FittedParts:
        """A copy with some fit records replaced (None: keep the one held)."""
        given = {k: v for k, v in records.items() if v is not None}
        return FittedParts(self._values, {**self._records, **given})

    def records(self, config) -> dict[str, Record | None]:
        """Each part's manifest record under the program ``config``; a part whose record is None (a kind that
        keeps no table when not fitted) has none."""
        records = {p.name: p.record(self._values[p.name], self._records.get(p.name), config) for p in PARTS}
        return {name: record for name, record in records.items() if record is not None}

    def save(self, folder: str | os.PathLike, config) -> dict[str, Record | None]:
        """Write every part's files into ``folder``; returns the records for the manifest."""
        for part in PARTS:
            part.save(self._values[part.name], Path(folder))
        return self.records(config)

    @classmethod
    def load(cls, folder: str | os.PathLike, records: Mapping[str, Record | None], config) -> FittedParts:
        """Read every part of an artifact ``folder`` with its manifest ``records``; ``PartError`` on damage."""
        folder = Path(folder)
        values = {p.name: p.load(folder, records.get(p.name) or {}, config) for p in PARTS}
        return cls(values, {k: v for k, v in records.items() if k in values})

    @staticmethod
    def describe(records: Mapping[str, Record | None], program: Mapping[str, Any]) -> dict[str, str]:
        """One line per part (its ``label``), from manifest ``records`` and the program config (as recorded)."""
        return {p.label: p.describe(records.get(p.name) or {}, program) for p in PARTS}
