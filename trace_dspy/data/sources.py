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

import csv
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

from trace_dspy.core.dialogue import LISTENER, SPEAKER, Turn, render_dialogue
from trace_dspy.core.labels import EMOTIONS
from trace_dspy.core.safety import JSONLimitError, load_json

log = logging.getLogger(__name__)

ENV_VAR = "TRACE_DSPY_DATA"
HUB_PREFIX = "hf:"
VIEWS = ("trace", "cem", "longest")
SEED_BANNER = (
    "NOTE: no data configured (--data or TRACE_DSPY_DATA), so the built-in SEED SET of 96 "
    "hand-written dialogues is in use. Scores on it are for smoke tests only; point at "
    "EmpatheticDialogues for real numbers."
)
# Share of conversations held out as the test part of a single JSONL file.
FILE_TEST_FRACTION = 0.25
_CSV_COLUMNS = ("dialogue_id", "turns", "text", "dialogue_emotion")
_OFFLINE_HINT = (
    "To work offline, point --data (or the environment variable TRACE_DSPY_DATA) at local files: "
    "a directory with the preprocessed EmpatheticDialogues valid.csv and test.csv, "
    "a directory with valid.jsonl and test.jsonl, or one JSONL file (format in docs/guide/config.md, 'Data')."
)


class DataError(ValueError):
    """A data source is missing or malformed; the message names file and line."""


@dataclass(frozen=True)
class Sample:
    """One item: the conversation so far (ending on the speaker) and the gold reply."""

    sample_id: str
    conversation_id: str
    turns: tuple[str, ...]  # speaker first, alternating, ending on the speaker
    emotion: str
    response: str
    situation: str | None = None
    # Samples with the same split_key always land on the same side of a split.
    # It is coarser than conversation_id where the source has near-duplicates.
    split_key: str = ""

    def __post_init__(self) -> None:
        if not self.split_key:
            object.__setattr__(self, "split_key", self.conversation_id)

    @property
    def dialogue(self) -> str:
        n = len(self.turns)
        return render_dialogue(
            [Turn(SPEAKER if (n - 1 - i) % 2 == 0 else LISTENER, t) for i, t in enumerate(self.turns)]
        )

    def to_example(self) -> dspy.Example:
        """A ``dspy.Example`` with ``dialogue`` as its input and the labels beside it."""
        return dspy.Example(
            dialogue=self.dialogue,
            emotion=self.emotion,
            response=self.response,
            situation=self.situation,
            conversation_id=self.conversation_id,
            sample_id=self.sample_id,
        ).with_inputs("dialogue")


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
    spec = os.fspath(data) if data is not None else os.environ.get(ENV_VAR) or None
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
    digest = hashlib.sha256()
    for p in paths:
        digest.update(p.name.encode())
        with open(p, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
    return "sha256:" + digest.hexdigest()[:16]


# ---------------------------------------------------------------- readers


def read_ed_csv(path: str | os.PathLike) -> list[Sample]:
    """Read a preprocessed EmpatheticDialogues CSV into samples.

    Rows with the same ``dialogue_id`` form one sample; its last turn (a
    listener turn) is the gold reply. Samples are grouped into conversations by
    their shared first turn.
    """
    path = Path(path)
    rows: dict[str, list[tuple[int, str, str, int]]] = defaultdict(list)
    order: list[str] = []
    try:
        fh = open(path, newline="", encoding="utf-8")
    except OSError as exc:
        raise DataError(f"{path}: cannot open: {exc.strerror}") from None
    with fh:
        reader = csv.reader(fh)
        try:
            header = next(reader)
        except StopIteration:
            raise DataError(f"{path}: file is empty") from None
        except (csv.Error, UnicodeDecodeError) as exc:
            raise DataError(f"{path}:1: cannot read header: {exc}") from None
        missing = [c for c in _CSV_COLUMNS if c not in header]
        if missing:
            raise DataError(f"{path}:1: header lacks column(s) {', '.join(missing)}; got {header}")
        col = {name: header.index(name) for name in _CSV_COLUMNS}
        while True:
            try:
                row = next(reader)
            except StopIteration:
                break
            except (csv.Error, UnicodeDecodeError) as exc:
                raise DataError(f"{path}:{reader.line_num}: malformed CSV: {exc}") from None
            line = reader.line_num
            if not row:
                continue
            if len(row) != len(header):
                raise DataError(f"{path}:{line}: expected {len(header)} fields, found {len(row)}")
            did, text, emotion = row[col["dialogue_id"]], row[col["text"]], row[col["dialogue_emotion"]]
            try:
                turn = int(row[col["turns"]])
            except ValueError:
                raise DataError(f"{path}:{line}: turns must be an integer, got {row[col['turns']]!r}") from None
            if not text.strip():
                raise DataError(f"{path}:{line}: empty text")
            if did not in rows:
                order.append(did)
            rows[did].append((turn, text.strip(), emotion, line))

    samples = []
    disagreeing: list[tuple[int, str, str]] = []
    for did in order:
        turns = sorted(rows[did])
        first_line = turns[0][3]
        numbers = [t[0] for t in turns]
        if numbers != list(range(1, len(turns) + 1)):
            raise DataError(f"{path}:{first_line}: sample {did} has turns {numbers}; expected 1..{len(turns)}")
        if len(turns) % 2:
            raise DataError(
                f"{path}:{turns[-1][3]}: sample {did} ends on a speaker turn; its last turn must be the listener's reply"
            )
        # The conversation's label is the one on its first turn. The published
        # test.csv has one later row whose label is glued to an utterance tag
        # ('surprisedacknowledging'); such disagreeing later rows are reported,
        # not fatal, because the first row already carries the label.
        emotion = turns[0][2]
        if emotion not in EMOTIONS:
            raise DataError(f"{path}:{first_line}: unknown dialogue_emotion {emotion!r}")
        disagreeing += [(t[3], t[2], emotion) for t in turns[1:] if t[2] != emotion]
        texts = tuple(t[1] for t in turns)
        samples.append((did, texts, emotion))
    if disagreeing:
        _warn_once(path, disagreeing)
    return _ed_conversations(samples, path.stem)


_WARNED: set[tuple[str, int, int]] = set()


def _warn_once(path: Path, disagreeing: list[tuple[int, str, str]]) -> None:
    """One warning per file and process (a file is read again for each split): a count and the first row."""
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    if key in _WARNED:
        return
    _WARNED.add(key)
    line, label, first = disagreeing[0]
    more = f" ({len(disagreeing)} rows; the first shown)" if len(disagreeing) > 1 else ""
    log.warning("%s:%d: dialogue_emotion %r differs from the sample's first row (%r); the first row's label is "
                "used%s", path, line, label, first, more)


def _ed_conversations(samples: list[tuple[str, tuple[str, ...], str]], stem: str) -> list[Sample]:
    """Recover conversations from prefix samples.

    Each sample is a prefix of a conversation ending on a listener turn. A
    conversation is a chain of samples each of which is a prefix of the
    longest one; the chains are found among samples that share a first turn.
    The first turn is also the split key, so near-duplicate conversations (the
    corpus has some with the same opening) never straddle a split.
    """
    by_first: dict[str, list[int]] = defaultdict(list)
    for i, (_, texts, _) in enumerate(samples):
        by_first[texts[0]].append(i)
    conv_of: dict[int, str] = {}
    for members in by_first.values():
        heads: list[int] = []
        for i in sorted(members, key=lambda i: -len(samples[i][1])):
            texts = samples[i][1]
            head = next((h for h in heads if len(samples[h][1]) > len(texts)
                         and samples[h][1][: len(texts)] == texts), None)
            if head is None:
                heads.append(i)
                head = i
            conv_of[i] = f"{stem}:{samples[head][0]}"
    out = []
    for i, (did, texts, emotion) in enumerate(samples):
        out.append(Sample(
            sample_id=f"{stem}:{did}",
            conversation_id=conv_of[i],
            turns=texts[:-1],
            emotion=emotion,
            response=texts[-1],
            split_key=f"{stem}:" + hashlib.sha1(texts[0].encode()).hexdigest()[:12],
        ))
    return out


def read_jsonl(path: str | os.PathLike) -> list[Sample]:
    """Read the project's JSONL format; errors name the file and the line."""
    path = Path(path)
    samples = []
    seen: set[str] = set()
    try:
        fh = open(path, "rb")
    except OSError as exc:
        raise DataError(f"{path}: cannot open: {exc.strerror}") from None
    with fh:
        for n, raw in enumerate(fh, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise DataError(f"{path}:{n}: not valid UTF-8 ({exc.reason} at byte {exc.start})") from None
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
    dev_fraction: float = 0.2,
    view: str = "longest",
    train_size: int | None = None,
    dev_size: int | None = None,
) -> Splits:
    """Train and dev examples from the pool, split by conversation (seeded).

    ``train_size`` / ``dev_size`` take a seeded sample of each side.
    """
    source = data if isinstance(data, DataSource) else resolve_source(data, seed=seed)
    train, dev = partition_by_conversation(source.pool, dev_fraction, seed=seed)
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
