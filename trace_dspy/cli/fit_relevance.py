"""Refit the metric's learned relevance head on the EmpatheticDialogues pool.

    python -m trace_dspy.fit_relevance --data ../shared/data/empathetic_dialogues

Every pool sample gives one (speaker's words, last turn, gold reply) row. A
seeded tenth of the conversations is held out: it picks the epoch count and
fits the calibration, and the dev table reports the AUC of a real reply
against another conversation's reply for the head and for plain cosine.
The weights go to ``--output`` (default: the packaged
trace_dspy/optimize/relevance_head.npz) with the data fingerprint, the dev
table, the dev table of a refit on a seeded subset (``--limit 400``, which
tests replay) and the scores of fixed probe triples. ``--check`` refits
without writing and compares with the weights at ``--output``.
The ED test split is never read.
"""

from __future__ import annotations

import argparse
import random
import shlex
import sys
from pathlib import Path

from trace_dspy.cli.common import check_refit, fail, setup_logging

REPRODUCE_LIMIT = 400
PROBES = (
    ("I failed my driving test again.", "Oh no, I'm so sorry. That must be frustrating. What went wrong?"),
    ("I failed my driving test again.", "Congratulations on the new puppy!"),
    ("My dog died yesterday.", "I'm so sorry about your dog. How long did you have him?"),
    ("My dog died yesterday.", "that is great . maybe you will get a raise too"),
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m trace_dspy.fit_relevance",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", help="ED folder with valid.csv and test.csv (default: $TRACE_DSPY_DATA)")
    parser.add_argument("--seed", type=int, default=0, help="seed for the held-out split and the fit (default 0)")
    parser.add_argument("--limit", type=int, help="fit on a seeded sample of about this many pool rows")
    parser.add_argument("--output", type=Path, help="where to write the weights (default: the packaged file)")
    parser.add_argument("--json", type=Path, help="also write the dev table and settings as JSON")
    parser.add_argument("--check", action="store_true",
                        help="refit without writing; exit 1 unless the dev table matches the weights at --output")
    return parser


def pool_rows(source, limit: int | None, seed: int) -> list[tuple[str, str, str, str]]:
    from trace_dspy.core.dialogue import speaker_turns

    rows = []
    for sample in source.pool:
        turns = speaker_turns(sample.dialogue)
        if turns and sample.response.strip():
            rows.append((sample.split_key, " ".join(turns), turns[-1], sample.response))
    if limit is not None and limit < len(rows):
        keys = sorted({r[0] for r in rows})
        random.Random(seed).shuffle(keys)
        chosen, count = set(), 0
        per_key: dict[str, int] = {}
        for r in rows:
            per_key[r[0]] = per_key.get(r[0], 0) + 1
        for key in keys:
            if count >= limit:
                break
            chosen.add(key)
            count += per_key[key]
        rows = [r for r in rows if r[0] in chosen]
    return rows


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    setup_logging()
    from trace_dspy.core.jsonl import atomic_write_json
    from trace_dspy.data.sources import DataError, resolve_source
    from trace_dspy.optimize.relevance import (
        WEIGHTS_FILE,
        RelevanceError,
        RelevanceHead,
        RelevanceScorer,
        fit_pool,
    )
    from trace_dspy.optimize.similarity import MISSING_EMBED, get_embedder

    if args.limit is not None and args.limit < 100:
        return fail("--limit must be at least 100 rows")
    try:
        source = resolve_source(args.data, seed=args.seed)
    except DataError as exc:
        return fail(str(exc))
    if source.is_seed:
        return fail("fitting the relevance head needs the ED data (--data or $TRACE_DSPY_DATA), not the seed set")
    embedder = get_embedder()
    if embedder is None:
        return fail("fitting the relevance head " + MISSING_EMBED.split(";")[0])
    output = args.output or WEIGHTS_FILE
    rows = pool_rows(source, args.limit, args.seed)
    command = "python -m trace_dspy.fit_relevance " + shlex.join(a for a in argv if a != "--check")
    print(f"ED pool {source.location}: {len(rows)} rows ({source.fingerprint}); embedding and fitting ...",
          file=sys.stderr, flush=True)
    meta = {"embedding_model": "all-MiniLM-L6-v2", "data_fingerprint": source.fingerprint, "limit": args.limit}
    try:
        result = fit_pool(rows, embedder.encode, seed=args.seed, meta=meta)
    except ValueError as exc:
        return fail(str(exc))
    m = result.head.meta
    print(f"train {m['train_rows']} rows, held out {m['held_out_rows']} rows / {m['held_out_conversations']} "
          f"conversations; {m['epochs']} epochs")
    print(format_table(result.table))
    if args.check:
        try:
            shipped = RelevanceHead.load(output)
        except RelevanceError as exc:
            return fail(str(exc))
        return check_refit(shipped.meta, args.limit, result.table, same_table, output)
    m["command"] = command
    if args.limit is None:
        small = fit_pool(pool_rows(source, REPRODUCE_LIMIT, args.seed), embedder.encode, seed=args.seed)
        m["reproduce"] = {"limit": REPRODUCE_LIMIT, "dev_table": small.table}
        scorer = RelevanceScorer(result.head, encode=embedder.encode)
        scores = scorer.score_batch([p for p, _ in PROBES], [p for p, _ in PROBES], [r for _, r in PROBES])
        m["probes"] = [{"speaker": p, "reply": r, "p": s} for (p, r), s in zip(PROBES, scores)]
    result.head.save(output)
    if args.json:
        atomic_write_json(args.json, dict(m))
    print(f"weights: {output}")
    return 0


def format_table(table: dict[str, float]) -> str:
    return "\n".join([
        "held-out AUC, real reply vs another conversation's reply:",
        f"  learned head  {table['auc_head']:.3f}",
        f"  cosine        {table['auc_cosine']:.3f}",
        f"mean P(fits): real {table['mean_p_real']:.3f}, mismatched {table['mean_p_mismatched']:.3f}",
    ])


def same_table(a: dict, b: dict, tol: float = 1e-4) -> bool:
    try:
        return set(a) == set(b) and all(abs(a[k] - v) <= tol for k, v in b.items())
    except (KeyError, TypeError):
        return False


if __name__ == "__main__":
    sys.exit(main())
