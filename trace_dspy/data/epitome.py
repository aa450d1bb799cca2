"""EPITOME: human ratings of empathy in (seeker post, reply) pairs.

Sharma, Miner, Atkins and Althoff, "A Computational Approach to Understanding
Empathy Expressed in Text-Based Mental Health Support", EMNLP 2020 (data under
the BSD 3-Clause licence). Each reply is rated 0 (none), 1 (weak) or 2 (strong)
on three communication mechanisms, the same three that TRACE's strategy stage
plans: Emotional Reactions (ER), Interpretations (IP) and Explorations (EX).

The data are never copied into this repository. The folder comes from
``--epitome PATH`` or the environment variable ``TRACE_DSPY_EPITOME`` and holds
the Reddit CSVs (one per mechanism, the same pairs in each):
``emotional-reactions-reddit.csv``, ``interpretations-reddit.csv`` and
``explorations-reddit.csv`` with the columns ``sp_id, rp_id, seeker_post,
response_post, level, rationales``.

Splits are by seeker post (``sp_id``): no post is on both sides.
"""

from __future__ import annotations

import csv
import os
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from trace_dspy.core import env
from trace_dspy.core.files import FileCheckError, MiB, TextLines, fingerprint_files
from trace_dspy.core.labels import STRATEGIES

ENV_VAR = env.EPITOME
# EPITOME's mechanisms are TRACE's strategies, in the same order.
MECHANISMS = STRATEGIES
FILES = {
    "ER": "emotional-reactions-reddit.csv",
    "IP": "interpretations-reddit.csv",
    "EX": "explorations-reddit.csv",
}
_COLUMNS = ("sp_id", "rp_id", "seeker_post", "response_post", "level", "rationales")
DEV_FRACTION = 0.25
# The published files are about 1 MB each; a CSV line (a field may span several) stays far below a MiB.
MAX_FILE_BYTES = 64 * MiB
MAX_LINE_BYTES = 1 * MiB


class EpitomeError(ValueError):
    """The EPITOME folder is missing or malformed; the message names the file and line."""


@dataclass(frozen=True)
class RatedPair:
    sp_id: str
    rp_id: str
    seeker: str
    reply: str
    levels: tuple[int, int, int]  # ER, IP, EX

    def level(self, mechanism: str) -> int:
        return self.levels[MECHANISMS.index(mechanism)]


@dataclass(frozen=True)
class Epitome:
    pairs: tuple[RatedPair, ...]
    folder: Path
    fingerprint: str


def resolve_folder(path: str | os.PathLike | None = None) -> Path:
    raw = path if path is not None else env.value(env.EPITOME)
    if not raw:
        raise EpitomeError(f"no EPITOME folder given: pass --epitome PATH or set {ENV_VAR} to the folder that "
                           f"holds {', '.join(FILES.values())}")
    folder = Path(raw).expanduser()
    if not folder.is_dir():
        raise EpitomeError(f"EPITOME folder {folder} does not exist")
    missing = [name for name in FILES.values() if not (folder / name).is_file()]
    if missing:
        raise EpitomeError(f"EPITOME folder {folder} lacks {', '.join(missing)}")
    return folder


def fingerprint(folder: Path) -> str:
    try:
        return fingerprint_files([folder / FILES[mech] for mech in MECHANISMS], max_bytes=MAX_FILE_BYTES)
    except FileCheckError as exc:
        raise EpitomeError(str(exc)) from None


def _read(path: Path) -> dict[tuple[str, str, int], tuple[str, str, int]]:
    """Rows keyed by (sp_id, rp_id, occurrence): the published files rate a few pairs twice. The file must be a
    regular file of at most ``MAX_FILE_BYTES``, UTF-8, its lines at most ``MAX_LINE_BYTES``."""
    out: dict[tuple[str, str, int], tuple[str, str, int]] = {}
    seen: dict[tuple[str, str], int] = {}
    try:
        with TextLines(path, max_bytes=MAX_FILE_BYTES, max_line_bytes=MAX_LINE_BYTES, universal=True) as lines:
            reader = csv.DictReader(lines.text())  # file-audit: parses lines that TextLines read (checked, bounded)
            absent = [c for c in _COLUMNS if c not in (reader.fieldnames or [])]
            if absent:
                raise EpitomeError(f"{path}: missing column(s) {', '.join(absent)}")
            for row in reader:
                where = f"{path}:{reader.line_num}"
                level = (row.get("level") or "").strip()
                if level not in ("0", "1", "2"):
                    raise EpitomeError(f"{where}: level must be 0, 1 or 2, got {level!r}")
                pair = ((row["sp_id"] or "").strip(), (row["rp_id"] or "").strip())
                if not all(pair):
                    raise EpitomeError(f"{where}: empty sp_id or rp_id")
                seen[pair] = seen.get(pair, 0) + 1
                out[(*pair, seen[pair])] = (row["seeker_post"] or "", row["response_post"] or "", int(level))
    except FileCheckError as exc:  # not a regular file, too large, a line too long or not UTF-8
        raise EpitomeError(str(exc)) from None
    except csv.Error as exc:
        raise EpitomeError(f"{path}: malformed CSV: {exc}") from None
    if not out:
        raise EpitomeError(f"{path}: no rows")
    return out


def load_epitome(path: str | os.PathLike | None = None) -> Epitome:
    """All rated pairs, joined across the three files (which must hold the same pairs)."""
    folder = resolve_folder(path)
    tables = {mech: _read(folder / FILES[mech]) for mech in MECHANISMS}
    keys = list(tables["ER"])
    for mech in ("IP", "EX"):
        if set(tables[mech]) != set(keys):
            extra = sorted(set(tables[mech]) ^ set(keys))[:3]
            raise EpitomeError(f"{folder / FILES[mech]} rates other pairs than {FILES['ER']} "
                               f"(for example {', '.join(f'{k[0]}/{k[1]}' for k in extra)})")
    pairs = []
    for key in keys:
        seeker, reply, _ = tables["ER"][key]
        pairs.append(RatedPair(key[0], key[1], seeker, reply, tuple(tables[m][key][2] for m in MECHANISMS)))
    return Epitome(tuple(pairs), folder, fingerprint(folder))


def split_by_post(pairs: Sequence[RatedPair], *, dev_fraction: float = DEV_FRACTION,
                  seed: int = 0) -> tuple[list[RatedPair], list[RatedPair]]:
    """(train, dev), seeded, grouped by seeker post so that no post is on both sides."""
    if not 0 < dev_fraction < 1:
        raise ValueError("dev_fraction must be between 0 and 1")
    posts = sorted({p.sp_id for p in pairs})
    random.Random(seed).shuffle(posts)
    dev_posts = set(posts[:max(1, round(len(posts) * dev_fraction))])
    train = [p for p in pairs if p.sp_id not in dev_posts]
    dev = [p for p in pairs if p.sp_id in dev_posts]
    return train, dev
