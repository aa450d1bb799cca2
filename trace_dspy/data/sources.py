"""The data the program learns from and is evaluated on.

Sources, in the order they are looked for:

1. ``--data PATH`` on a command line (or ``data=`` in Python);
2. the environment variable ``TRACE_DSPY_DATA``;
3. the seed set shipped inside the package (96 short dialogues we wrote), with a
   loud warning, so that every command works on a fresh offline machine.

A source is one of:

- a directory holding the preprocessed EmpatheticDialogues CSVs
  (``valid.csv`` and ``test.csv``; see the README that comes with them);
- a directory holding ``valid.jsonl`` and ``test.jsonl`` in the project's JSONL
  format;
- a single JSONL file: its conversations are partitioned, seeded, into a pool
  (train and dev) and a test part;
- ``hf:<hub id>``: a Hugging Face hub dataset loaded through ``datasets``
  (online only), either in the original EmpatheticDialogues layout or with the
  project's JSONL columns.

The JSONL format: one object per line with ``turns`` (list of strings, speaker
first, alternating, ending on the speaker), ``emotion`` (one of the 32 labels)
and ``reply`` (the listener's gold reply); optional ``id``,
``conversation_id`` and ``situation``.

Splits are always by conversation, never by sample: the pool becomes train and
dev, the test part is only ever used for evaluation.
"""

from __future__ import annotations

import hashlib
import logging
import os
import random
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import dspy

from trace_dspy.core import env
from trace_dspy.core.files import FileCheckError, fingerprint_files
from trace_dspy.core.labels import EMOTIONS
from trace_dspy.core.safety import MAX_LINE_BYTES, JSONLimitError, load_json
from trace_dspy.data.ed_csv import read_ed_csv
from trace_dspy.data.samples import MAX_DATA_BYTES, DataError, Sample, open_lines

log = logging.getLogger(__name__)

ENV_VAR = env.DATA
HUB_PREFIX = "hf:"
VIEWS = ("trace", "cem", "longest")
SEED_BANNER = (
    f"NOTE: no data configured (--data or {env.DATA}), so the built-in SEED SET of 96 "
    "hand-written dialogues is in use. Scores on it are for smoke tests only; point at "
    "EmpatheticDialogues for real numbers."
)
# Share of conversations held out as the test part of a single JSONL file.
FILE_TEST_FRACTION = 0.25
# Share of the pool's conversations on the dev side (split_pool).
DEV_FRACTION = 0.2
_OFFLINE_HINT = (
    f"To work offline, point --data (or the environment variable {env.DATA}) at local files: "
    "a directory with the preprocessed EmpatheticDialogues valid.csv and test.csv, "
    "a directory with valid.jsonl and test.jsonl, or one JSONL file (format in docs/guide/config.md, 'Data')."
)


@dataclass
class DataSource:
    """Where the data comes from, with its pool (train+dev) and test samples."""

    kind: str  # "ed-csv", "jsonl-dir", "jsonl-file", "hub", "seed"
    location: str
    pool: list[Sample] = field(repr=False)
    test: list[Sample] = field(repr=False)
    fingerprint: str = ""

    @property
    def is_seed(self) -> bool:
        return self.kind == "seed"

    def describe(self) -> dict:
        return {"kind": self.kind, "location": self.location, "fingerprint": self.fingerprint,
                "pool_samples": len(self.pool), "test_samples": len(self.test)}


# ---------------------------------------------------------------- resolving


def resolve_source(data: str | os.PathLike | None = None, *, seed: int = 0, announce_seed: bool = True) -> DataSource:
    """Load the data source named by ``data``, ``$TRACE_DSPY_DATA`` or the seed set.

    Falling back to the seed set is announced loudly unless ``announce_seed`` is
    False (e.g. when it only supplies retrieval exemplars for a single reply).
    """
    spec = os.fspath(data) if data is not None else env.value(env.DATA)
    if spec is None:
        (log.warning if announce_seed else log.info)(SEED_BANNER)
        return _load_single_jsonl_source(_seed_path(), kind="seed", seed=seed)
    if spec.startswith(HUB_PREFIX):
        return _load_hub(spec[len(HUB_PREFIX):], seed=seed)
    path = Path(spec).expanduser()
    if not path.exists():
        where = "--data" if data is not None else ENV_VAR
        raise DataError(
            f"data path from {where} does not exist: {path}. "
            f"Give a directory with valid.csv and test.csv, a JSONL file, or hf:<hub id>."
        )
    if path.is_dir():
        if (path / "valid.csv").exists() or (path / "test.csv").exists():
            pool, test = _need(path, "valid.csv"), _need(path, "test.csv")
            return DataSource("ed-csv", str(path), read_ed_csv(pool), read_ed_csv(test),
                              _fingerprint([pool, test]))
        if (path / "valid.jsonl").exists() or (path / "test.jsonl").exists():
            pool, test = _need(path, "valid.jsonl"), _need(path, "test.jsonl")
            return DataSource("jsonl-dir", str(path), read_jsonl(pool), read_jsonl(test),
                              _fingerprint([pool, test]))
        raise DataError(f"{path}: no valid.csv/test.csv or valid.jsonl/test.jsonl in this directory")
    if path.suffix in (".jsonl", ".json"):
        return _load_single_jsonl_source(path, kind="jsonl-file", seed=seed)
    if path.suffix == ".csv":
        raise DataError(
            f"{path}: give the directory that holds valid.csv and test.csv, not a single CSV file"
        )
    raise DataError(f"{path}: unsupported data file; use a directory of CSVs or a .jsonl file")


def _need(directory: Path, name: str) -> Path:
    path = directory / name
    if not path.is_file():
        raise DataError(f"{directory}: {name} is missing (a data directory needs both splits)")
    return path


def _seed_path() -> Path:
    return Path(str(resources.files("trace_dspy.data") / "seed" / "seed_dialogues.jsonl"))


def _load_single_jsonl_source(path: Path, *, kind: str, seed: int) -> DataSource:
    samples = read_jsonl(path)
    pool, test = partition_by_conversation(samples, FILE_TEST_FRACTION, seed=seed)
    return DataSource(kind, str(path), pool, test, _fingerprint([path]))


def _fingerprint(paths: Iterable[Path]) -> str:
    """sha256 of each file's name and bytes, in order; the files are checked and bounded as they are read."""
    try:
        return fingerprint_files(paths, max_bytes=MAX_DATA_BYTES)
    except FileCheckError as exc:
        raise DataError(str(exc)) from None


# ---------------------------------------------------------------- readers


def read_jsonl(path: str | os.PathLike) -> list[Sample]:
    """Read the project's JSONL format; errors name the file and the line.

    The file is read through :func:`~trace_dspy.data.samples.open_lines`: a regular file of at most
    ``MAX_DATA_BYTES``, lines of at most ``MAX_LINE_BYTES`` (``load_json``'s limit), UTF-8.
    """
    path = Path(path)
    samples = []
    seen: set[str] = set()
    with open_lines(path, max_line_bytes=MAX_LINE_BYTES, universal=False) as lines:
        for n, line in _numbered(lines):
            if not line.strip():
                continue
            try:
                obj = load_json(line, f"{path}:{n}")
            except JSONLimitError as exc:
                raise DataError(str(exc)) from None
            sample = sample_from_record(obj, where=f"{path}:{n}", default_id=f"{path.stem}:{n}")
            if sample.sample_id in seen:
                raise DataError(f"{path}:{n}: duplicate id {sample.sample_id!r}")
            seen.add(sample.sample_id)
            samples.append(sample)
    if not samples:
        raise DataError(f"{path}: no records")
    return samples


def _numbered(lines):
    """The (number, text) of ``lines``; a line too long or not UTF-8 is a DataError naming it."""
    try:
        yield from lines
    except FileCheckError as exc:
        raise DataError(str(exc)) from None


def sample_from_record(obj, *, where: str, default_id: str) -> Sample:
    """Validate one JSONL-format record and build a Sample."""
    if not isinstance(obj, dict):
        raise DataError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    for key in ("turns", "emotion", "reply"):
        if key not in obj:
            raise DataError(f"{where}: missing key {key!r}")
    turns = obj["turns"]
    if not isinstance(turns, list) or not turns or not all(isinstance(t, str) and t.strip() for t in turns):
        raise DataError(f"{where}: 'turns' must be a non-empty list of non-empty strings")
    if len(turns) % 2 == 0:
        raise DataError(f"{where}: 'turns' has {len(turns)} turns; it must end on the speaker (an odd count)")
    if obj["emotion"] not in EMOTIONS:
        raise DataError(f"{where}: unknown emotion {obj['emotion']!r}; use one of the 32 EmpatheticDialogues labels")
    if not isinstance(obj["reply"], str) or not obj["reply"].strip():
        raise DataError(f"{where}: 'reply' must be a non-empty string")
    sid = str(obj.get("id") or default_id)
    situation = obj.get("situation")
    return Sample(
        sample_id=sid,
        conversation_id=str(obj.get("conversation_id") or sid),
        turns=tuple(" ".join(t.split()) for t in turns),
        emotion=obj["emotion"],
        response=" ".join(obj["reply"].split()),
        situation=situation if isinstance(situation, str) else None,
    )


def _load_hub(hub_id: str, *, seed: int) -> DataSource:
    if not hub_id:
        raise DataError("hf: needs a dataset id, e.g. hf:owner/name")
    try:
        import datasets
    except ImportError as exc:  # pragma: no cover - datasets is a core dependency
        raise DataError(f"loading hf:{hub_id} needs the 'datasets' package: {exc}") from None
    try:
        dsd = datasets.load_dataset(hub_id)
    except Exception as exc:  # the hub raises many types; all mean "not available"
        raise DataError(f"could not load hub dataset {hub_id!r}: {type(exc).__name__}: {exc}. {_OFFLINE_HINT}") from None
    splits = set(dsd)
    pool_name = "train" if "train" in splits else "validation" if "validation" in splits else None
    if pool_name is None or "test" not in splits:
        raise DataError(f"hub dataset {hub_id!r} has splits {sorted(splits)}; need a test split and train or validation")
    pool = _hub_samples(dsd[pool_name], f"hf:{hub_id}/{pool_name}")
    test = _hub_samples(dsd["test"], f"hf:{hub_id}/test")
    fp = getattr(dsd[pool_name], "_fingerprint", "") + getattr(dsd["test"], "_fingerprint", "")
    return DataSource("hub", f"hf:{hub_id}", pool, test, "hub:" + hashlib.sha256(fp.encode()).hexdigest()[:16])


def _hub_samples(rows, where: str) -> list[Sample]:
    columns = set(rows.column_names)
    if {"turns", "emotion", "reply"} <= columns:
        return [sample_from_record(dict(r), where=f"{where}[{i}]", default_id=f"{where}:{i}") for i, r in enumerate(rows)]
    if {"conv_id", "utterance_idx", "context", "utterance"} <= columns:
        return _ed_original_samples(rows, where)
    raise DataError(f"{where}: unknown columns {sorted(columns)}; expected turns/emotion/reply or the original ED layout")


def _ed_original_samples(rows, where: str) -> list[Sample]:
    """The original EmpatheticDialogues layout: one row per utterance."""
    convs: dict[str, list[tuple[int, str, str, str]]] = defaultdict(list)
    for r in rows:
        text = str(r["utterance"]).replace("_comma_", ",").strip()
        convs[str(r["conv_id"])].append((int(r["utterance_idx"]), text, str(r["context"]), str(r.get("prompt", ""))))
    samples = []
    for conv_id, utts in convs.items():
        utts.sort()
        emotion = utts[0][2]
        if emotion not in EMOTIONS:
            raise DataError(f"{where}: conversation {conv_id} has unknown emotion {emotion!r}")
        texts = [u[1] for u in utts]
        for end in range(2, len(texts) + 1, 2):  # every prefix that ends on a listener turn
            samples.append(Sample(f"{conv_id}:{end}", conv_id, tuple(texts[: end - 1]), emotion,
                                  texts[end - 1], utts[0][3].replace("_comma_", ",") or None))
    return samples


# ---------------------------------------------------------------- splits and views


def conversations(samples: Iterable[Sample]) -> dict[str, list[Sample]]:
    groups: dict[str, list[Sample]] = defaultdict(list)
    for s in samples:
        groups[s.conversation_id].append(s)
    return groups


def partition_by_conversation(
    samples: Sequence[Sample], fraction: float, *, seed: int
) -> tuple[list[Sample], list[Sample]]:
    """Split samples into (rest, held-out) with about ``fraction`` of the
    conversations (by split key) held out. Seeded and independent of order."""
    if not 0 < fraction < 1:
        raise ValueError(f"fraction must be between 0 and 1, got {fraction}")
    ids = sorted({s.split_key for s in samples})
    if len(ids) < 2:
        raise DataError(f"need at least 2 conversations to split, found {len(ids)}")
    random.Random(seed).shuffle(ids)
    n_out = min(len(ids) - 1, max(1, round(len(ids) * fraction)))
    held = set(ids[:n_out])
    return [s for s in samples if s.split_key not in held], [s for s in samples if s.split_key in held]


def split_pool(source: DataSource, *, seed: int = 0,
               dev_fraction: float = DEV_FRACTION) -> tuple[list[Sample], list[Sample]]:
    """The pool's (training side, dev side), split by conversation and seeded: the one split that compiles,
    the emotion prior and its choice all use, so that a prior is never fitted on a compile's dev items."""
    return partition_by_conversation(source.pool, dev_fraction, seed=seed)


def select_view(samples: Sequence[Sample], view: str) -> list[Sample]:
    """``cem``: every sample; ``longest``: the longest sample of each conversation;
    ``trace``: the longest sample of each conversation, without ``prepared``
    (the TRACE paper's evaluation set)."""
    if view == "cem":
        return list(samples)
    if view not in VIEWS:
        raise ValueError(f"unknown view {view!r}; choose from {', '.join(VIEWS)}")
    longest = [max(group, key=lambda s: len(s.turns)) for group in conversations(samples).values()]
    if view == "trace":
        longest = [s for s in longest if s.emotion != "prepared"]
    return longest


@dataclass
class Splits:
    train: list[dspy.Example]
    dev: list[dspy.Example]
    source: DataSource


def load_splits(
    data: str | os.PathLike | DataSource | None = None,
    *,
    seed: int = 0,
    dev_fraction: float = DEV_FRACTION,
    view: str = "longest",
    train_size: int | None = None,
    dev_size: int | None = None,
) -> Splits:
    """Train and dev examples from the pool, split by conversation (seeded).

    ``train_size`` / ``dev_size`` take a seeded sample of each side.
    """
    source = data if isinstance(data, DataSource) else resolve_source(data, seed=seed)
    train, dev = split_pool(source, seed=seed, dev_fraction=dev_fraction)
    train, dev = select_view(train, view), select_view(dev, view)
    rng = random.Random(seed)
    train = _take(train, train_size, rng)
    dev = _take(dev, dev_size, rng)
    return Splits([s.to_example() for s in train], [s.to_example() for s in dev], source)


def load_test(
    data: str | os.PathLike | DataSource | None = None,
    *,
    view: str = "trace",
    limit: int | None = None,
    seed: int = 0,
) -> list[dspy.Example]:
    """Test examples in the chosen view; ``limit`` takes a seeded sample."""
    source = data if isinstance(data, DataSource) else resolve_source(data, seed=seed)
    samples = select_view(source.test, view)
    return [s.to_example() for s in _take(samples, limit, random.Random(seed))]


def _take(items: list[Sample], n: int | None, rng: random.Random) -> list[Sample]:
    if n is None or n >= len(items):
        return list(items)
    if n < 0:
        raise ValueError(f"size must be non-negative, got {n}")
    picked = sorted(rng.sample(range(len(items)), n))
    return [items[i] for i in picked]
