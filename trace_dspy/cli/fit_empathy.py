"""Refit the learned empathy scorer on EPITOME and print its dev table.

    python -m trace_dspy.fit_empathy --epitome ../shared/data/epitome

The split is by seeker post (seeded); the L2 strength is chosen by grouped
cross-validation on the training posts; the dev table reports Spearman
correlation with the human levels, accuracy and macro-F1 per mechanism next
to the majority class and the published RoBERTa bi-encoder. The weights go to
``--output`` (default: the file the package ships and loads,
trace_dspy/optimize/empathy_head.npz), with the data fingerprint and the dev
table inside, plus two checks that tests replay: the dev table of a refit on
a seeded subset of about 300 pairs, and the levels of a few fixed probe pairs.
``--check`` refits without writing and compares with the weights at
``--output`` (with ``--limit 300``: with the recorded subset refit).
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from trace_dspy.cli.common import check_refit, fail, setup_logging

REPRODUCE_LIMIT = 300
# Fixed pairs whose scores are recorded with the weights: a change in how
# features are computed shows up as a difference here.
PROBES = (
    ("I failed my driving test again.", "Oh no, I'm so sorry. That must be really frustrating. What happened?"),
    ("My dog died yesterday.", "I know how much a dog becomes family; losing him must leave a big hole."),
    ("I got the job!!", "Congratulations! How are you going to celebrate?"),
    ("My roommate keeps eating my food.", "The bus leaves at five."),
    ("I feel so alone since I moved here.", "You should join a club."),
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m trace_dspy.fit_empathy", description=__doc__.split("\n\n")[0])
    parser.add_argument("--epitome", help="folder with the EPITOME Reddit CSVs (default: $TRACE_DSPY_EPITOME)")
    parser.add_argument("--seed", type=int, default=0, help="seed for the split by post (default 0)")
    parser.add_argument("--dev-fraction", type=float, default=0.25, help="share of posts held out (default 0.25)")
    parser.add_argument("--limit", type=int, help="fit on a seeded sample of posts holding about this many pairs")
    parser.add_argument("--l2", type=float, help="L2 strength (default: chosen by cross-validation)")
    parser.add_argument("--output", type=Path, help="where to write the weights (default: the packaged file)")
    parser.add_argument("--json", type=Path, help="also write the dev table and settings as JSON")
    parser.add_argument("--check", action="store_true",
                        help="refit without writing; exit 1 unless the dev table matches the weights at --output")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    setup_logging()
    from trace_dspy.core.jsonl import atomic_write_json
    from trace_dspy.data.epitome import EpitomeError, load_epitome
    from trace_dspy.optimize.empathy import WEIGHTS_FILE, Head, ScorerError
    from trace_dspy.optimize.empathy_fit import fit_epitome, format_fit_table
    from trace_dspy.optimize.similarity import MISSING_EMBED, get_embedder

    if args.limit is not None and args.limit < 40:
        return fail("--limit must be at least 40 pairs")
    try:
        data = load_epitome(args.epitome)
    except EpitomeError as exc:
        return fail(str(exc))
    embedder = get_embedder()
    if embedder is None:
        return fail("fitting the scorer " + MISSING_EMBED.split(";")[0])
    output = args.output or WEIGHTS_FILE
    command = "python -m trace_dspy.fit_empathy " + shlex.join(
        a for a in argv if a not in ("--check",))
    print(f"EPITOME {data.folder}: {len(data.pairs)} pairs ({data.fingerprint}); embedding and fitting ...",
          file=sys.stderr, flush=True)
    try:
        result = fit_epitome(data, embedder.encode, seed=args.seed, dev_fraction=args.dev_fraction,
                             limit=args.limit, l2=args.l2, meta={"embedding_model": "all-MiniLM-L6-v2"})
    except ValueError as exc:
        return fail(str(exc))
    meta = result.head.meta
    print(f"train {meta['train_pairs']} pairs / {meta['train_posts']} posts, dev {meta['dev_pairs']} pairs / "
          f"{meta['dev_posts']} posts; L2 {meta['l2']}")
    print(format_fit_table(result.table))
    if args.check:
        try:
            shipped = Head.load(output)
        except ScorerError as exc:
            return fail(str(exc))
        return check_refit(shipped.meta, args.limit, result.table, _same_table, output)
    result.head.meta["command"] = command
    if args.limit is None:
        from trace_dspy.optimize.empathy import EmpathyScorer

        small = fit_epitome(data, embedder.encode, seed=args.seed, dev_fraction=args.dev_fraction,
                            limit=REPRODUCE_LIMIT, l2=args.l2)
        result.head.meta["reproduce"] = {"limit": REPRODUCE_LIMIT, "dev_table": small.table}
        scorer = EmpathyScorer(result.head, encode=embedder.encode)
        levels = scorer.levels([p for p, _ in PROBES], [r for _, r in PROBES])
        result.head.meta["probes"] = [{"seeker": p, "reply": r, "levels": [float(v) for v in row]}
                                      for (p, r), row in zip(PROBES, levels)]
    result.head.save(output)
    if args.json:
        atomic_write_json(args.json, {**result.head.meta})
    print(f"weights: {output}")
    return 0


def _same_table(a: dict, b: dict, tol: float = 1e-4) -> bool:
    try:
        return all(abs(a[m][k] - v) <= tol for m, row in b.items() for k, v in row.items())
    except (KeyError, TypeError):
        return False


if __name__ == "__main__":
    sys.exit(main())
