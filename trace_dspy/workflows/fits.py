"""Refits of the metric's learned heads (relevance on the ED pool, empathy on EPITOME) and of the emotion prior.

A head's refit writes its weights with the command, the data fingerprint and the dev table inside, plus two
checks that tests replay: the dev table of a refit on a seeded subset (``reproduce``) and the scores of
fixed probe pairs. With ``check`` nothing is written: the dev table is compared with the one recorded in the
weights already at the output path.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trace_dspy.core.console import heartbeat, say

RELEVANCE_REPRODUCE_LIMIT = 400
RELEVANCE_PROBES = (
    ("I failed my driving test again.", "Oh no, I'm so sorry. That must be frustrating. What went wrong?"),
    ("I failed my driving test again.", "Congratulations on the new puppy!"),
    ("My dog died yesterday.", "I'm so sorry about your dog. How long did you have him?"),
    ("My dog died yesterday.", "that is great . maybe you will get a raise too"),
)
EMPATHY_REPRODUCE_LIMIT = 300
# Fixed pairs whose scores are recorded with the weights: a change in how
# features are computed shows up as a difference here.
EMPATHY_PROBES = (
    ("I failed my driving test again.", "Oh no, I'm so sorry. That must be really frustrating. What happened?"),
    ("My dog died yesterday.", "I know how much a dog becomes family; losing him must leave a big hole."),
    ("I got the job!!", "Congratulations! How are you going to celebrate?"),
    ("My roommate keeps eating my food.", "The bus leaves at five."),
    ("I feel so alone since I moved here.", "You should join a club."),
)
EMBEDDING_MODEL = "all-MiniLM-L6-v2"
TONE_REPRODUCE_LIMIT = 400
# Replies whose P(pleasant) is recorded with the tone head's weights: the wrong-tone replies the writer gave
# (a friend moving abroad, a dog that died) beside ones with the right tone.
TONE_PROBES = (
    "That sounds like a dream come true.",
    "Oh no, I'm so sorry. That must be so hard.",
    "Howdy there! What's your dog's name?",
    "I'm so sorry about your dog. How long did you have him?",
    "Congratulations! How are you going to celebrate?",
    "That sounds like a nightmare. How are you feeling about your cat?",
)


class FitError(ValueError):
    """A refit cannot run (no data, no embedder, a bad setting) or cannot be checked."""


@dataclass
class Refit:
    """A finished refit: what it says (sizes and dev table), where the weights are (or would be), and, for a
    check, whether its dev table matches the recorded one."""

    text: str
    output: Path
    matches: bool | None = None


def _check_outputs(output: Path, json_path: Path | None, check: bool) -> None:
    """Where a refit writes (the weights, the JSON) or, for ``check``, the weights it compares with, checked
    before any data is read: a refit takes minutes, and a path found wrong after it loses them."""
    from trace_dspy.workflows.preflight import check_output_file

    if check:
        if not Path(output).is_file():
            raise FitError(f"--check compares with the weights at {output}, which is not a file")
        return
    check_output_file(output, "--output")
    check_output_file(json_path, "--json")


def _embedder(what: str):
    from trace_dspy.optimize.similarity import MISSING_EMBED, get_embedder

    embedder = get_embedder()
    if embedder is None:
        raise FitError(what + " " + MISSING_EMBED.split(";")[0])
    return embedder


def _check_or_save(head, table: dict, *, output: Path, limit: int | None, check: bool, load_error: type,
                   same: Callable, json_path: Path | None, command: str, extras: Callable[[], dict]) -> bool | None:
    """Compare with the weights at ``output`` (``check``; loading them may raise ``load_error``), or record
    ``command`` and, for a full refit, the ``extras`` (reproduce run, probes) in ``head.meta`` and save it;
    returns whether a check matched."""
    from trace_dspy.core.jsonl import atomic_write_json

    if check:
        try:
            shipped = type(head).load(output)
        except load_error as exc:
            raise FitError(str(exc)) from exc
        return recorded_table_matches(shipped.meta, limit, table, same)
    head.meta["command"] = command
    if limit is None:
        head.meta.update(extras())
    head.save(output)
    if json_path:
        atomic_write_json(json_path, dict(head.meta))
    return None


def _refit_head(name: str, announce: str, fit: Callable, describe: Callable, extras: Callable, *, output: Path,
                limit: int | None, check: bool, load_error: type, same: Callable, json_path: Path | None,
                command: str) -> Refit:
    """A head's refit after its data and embedder are in hand: say what is fitted, ``fit()`` (a result with
    ``head`` and ``table``), then check or save it (``_check_or_save``, with ``extras(result)`` recorded on a
    full refit), each phase under a heartbeat; ``describe(result)`` is the text the command prints."""
    say(announce)
    with heartbeat(name) as phase:
        phase.note("embedding and fitting")
        result = fit()
    with heartbeat(name) as phase:
        phase.note("checking" if check else "the reproduce run and saving")
        matches = _check_or_save(result.head, result.table, output=output, limit=limit, check=check,
                                 load_error=load_error, same=same, json_path=json_path, command=command,
                                 extras=lambda: extras(result))
    return Refit(describe(result), output, matches)


def recorded_table_matches(shipped_meta: dict[str, Any], limit: int | None, table: dict, same) -> bool:
    """Whether a refit's dev table equals the one recorded in the shipped head.

    A full refit is compared with the head's ``dev_table``; one with ``limit`` with the recorded
    ``reproduce`` run of that limit (FitError for another limit).
    """
    reproduce = shipped_meta.get("reproduce") or {}
    if limit is None:
        expected = shipped_meta.get("dev_table")
    elif limit == reproduce.get("limit"):
        expected = reproduce.get("dev_table")
    else:
        raise FitError(f"--check compares a full refit, or one with --limit {reproduce.get('limit')}")
    return bool(same(expected or {}, table))


def pool_rows(source, limit: int | None, seed: int) -> list[tuple[str, str, str, str]]:
    """(conversation key, speaker's words, last turn, gold reply) per pool sample; with ``limit``, whole
    seeded conversations until about ``limit`` rows."""
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


def relevance_table_text(table: dict[str, float]) -> str:
    return "\n".join([
        "held-out AUC, real reply vs another conversation's reply:",
        f"  learned head  {table['auc_head']:.3f}",
        f"  cosine        {table['auc_cosine']:.3f}",
        f"mean P(fits): real {table['mean_p_real']:.3f}, mismatched {table['mean_p_mismatched']:.3f}",
    ])


def tone_table_text(table: dict[str, float]) -> str:
    return "\n".join([
        f"held-out AUC, P(pleasant) of pleasant vs unpleasant replies: {table['auc']:.3f}",
        f"held-out AUC, tone agreement of a reply vs a swapped-tone reply: {table['auc_swap']:.3f}",
        f"mean agreement: own {table['mean_agreement_own']:.3f}, swapped {table['mean_agreement_swapped']:.3f}; "
        f"on the right side of 0.5: {table['right_side_rate']:.3f}",
    ])


def same_relevance_table(a: dict, b: dict, tol: float = 1e-4) -> bool:
    try:
        return set(a) == set(b) and all(abs(a[k] - v) <= tol for k, v in b.items())
    except (KeyError, TypeError):
        return False


def same_empathy_table(a: dict, b: dict, tol: float = 1e-4) -> bool:
    try:
        return all(abs(a[m][k] - v) <= tol for m, row in b.items() for k, v in row.items())
    except (KeyError, TypeError):
        return False


def _ed_pool(data: str | None, seed: int, limit: int | None, what: str):
    """The ED source and the embedder a head's refit needs (FitError when either is missing or --limit is
    too small)."""
    from trace_dspy.data.sources import DataError, resolve_source

    if limit is not None and limit < 100:
        raise FitError("--limit must be at least 100 rows")
    try:
        source = resolve_source(data, seed=seed)
    except DataError as exc:
        raise FitError(str(exc)) from exc
    if source.is_seed:
        raise FitError(f"fitting {what} needs the ED data (--data or $TRACE_DSPY_DATA), not the seed set")
    return source, _embedder(f"fitting {what}")


def _refit_ed_head(name: str, unit: str, source, rows: list, fit: Callable, table_text: Callable,
                   extras: Callable, *, limit: int | None, **refit: Any) -> Refit:
    """A head's refit on ``rows`` (counted in ``unit``) of the ED ``source``'s pool: ``fit(rows, meta)``, the
    meta recording the embedder, the data and ``limit``; its text gives the split sizes (and the epochs early
    stopping chose, for a head that records them), then ``table_text`` of the dev table. The rest as
    :func:`_refit_head`."""
    meta = {"embedding_model": EMBEDDING_MODEL, "data_fingerprint": source.fingerprint, "limit": limit}

    def describe(result) -> str:
        m = result.head.meta
        epochs = f"; {m['epochs']} epochs" if "epochs" in m else ""
        return (f"train {m['train_rows']} {unit}, held out {m['held_out_rows']} {unit} / "
                f"{m['held_out_conversations']} conversations{epochs}\n" + table_text(result.table))

    return _refit_head(
        name, f"ED pool {source.location}: {len(rows)} {unit} ({source.fingerprint}); embedding and fitting ...",
        lambda: fit(rows, meta), describe, extras, limit=limit, **refit)


def refit_relevance(data: str | None, *, seed: int = 0, limit: int | None = None, output: Path | None = None,
                    check: bool = False, json_path: Path | None = None, command: str = "") -> Refit:
    """Refit the relevance head on the ED pool of ``data`` (see :mod:`trace_dspy.optimize.relevance`)."""
    from trace_dspy.optimize.relevance import (
        WEIGHTS_FILE,
        RelevanceError,
        RelevanceScorer,
        fit_pool,
    )

    _check_outputs(output or WEIGHTS_FILE, json_path, check)
    source, embedder = _ed_pool(data, seed, limit, "the relevance head")

    def extras(result) -> dict:
        small = fit_pool(pool_rows(source, RELEVANCE_REPRODUCE_LIMIT, seed), embedder.encode, seed=seed)
        scorer = RelevanceScorer(result.head, encode=embedder.encode)
        probes = RELEVANCE_PROBES
        scores = scorer.score_batch([p for p, _ in probes], [p for p, _ in probes], [r for _, r in probes])
        return {"reproduce": {"limit": RELEVANCE_REPRODUCE_LIMIT, "dev_table": small.table},
                "probes": [{"speaker": p, "reply": r, "p": s} for (p, r), s in zip(probes, scores)]}

    return _refit_ed_head(
        "relevance head", "rows", source, pool_rows(source, limit, seed),
        lambda rows, meta: fit_pool(rows, embedder.encode, seed=seed, meta=meta), relevance_table_text, extras,
        output=output or WEIGHTS_FILE, limit=limit, check=check, load_error=RelevanceError,
        same=same_relevance_table, json_path=json_path, command=command)


def refit_empathy(epitome: str | None, *, seed: int = 0, dev_fraction: float = 0.25, limit: int | None = None,
                  l2: float | None = None, output: Path | None = None, check: bool = False,
                  json_path: Path | None = None, command: str = "") -> Refit:
    """Refit the learned empathy scorer on EPITOME (see :mod:`trace_dspy.optimize.empathy_fit`)."""
    from trace_dspy.data.epitome import EpitomeError, load_epitome
    from trace_dspy.optimize.empathy import (
        WEIGHTS_FILE,
        EmpathyScorer,
        ScorerError,
    )
    from trace_dspy.optimize.empathy_fit import fit_epitome, format_fit_table

    _check_outputs(output or WEIGHTS_FILE, json_path, check)
    if limit is not None and limit < 40:
        raise FitError("--limit must be at least 40 pairs")
    try:
        data = load_epitome(epitome)
    except EpitomeError as exc:
        raise FitError(str(exc)) from exc
    embedder = _embedder("fitting the scorer")

    def describe(result) -> str:
        meta = result.head.meta
        return (f"train {meta['train_pairs']} pairs / {meta['train_posts']} posts, dev {meta['dev_pairs']} pairs / "
                f"{meta['dev_posts']} posts; L2 {meta['l2']}\n" + format_fit_table(result.table))

    def extras(result) -> dict:
        small = fit_epitome(data, embedder.encode, seed=seed, dev_fraction=dev_fraction,
                            limit=EMPATHY_REPRODUCE_LIMIT, l2=l2)
        probes = EMPATHY_PROBES
        levels = EmpathyScorer(result.head, encode=embedder.encode).levels([p for p, _ in probes],
                                                                           [r for _, r in probes])
        return {"reproduce": {"limit": EMPATHY_REPRODUCE_LIMIT, "dev_table": small.table},
                "probes": [{"seeker": p, "reply": r, "levels": [float(v) for v in row]}
                           for (p, r), row in zip(probes, levels)]}

    return _refit_head(
        "empathy scorer",
        f"EPITOME {data.folder}: {len(data.pairs)} pairs ({data.fingerprint}); embedding and fitting ...",
        lambda: fit_epitome(data, embedder.encode, seed=seed, dev_fraction=dev_fraction, limit=limit, l2=l2,
                            meta={"embedding_model": EMBEDDING_MODEL}),
        describe, extras, output=output or WEIGHTS_FILE, limit=limit, check=check, load_error=ScorerError,
        same=same_empathy_table, json_path=json_path, command=command)


def refit_prior(data: str, *, situations: str | None, seed: int = 0, output: Path, refit_on_dev: bool = False
                ) -> dict[str, Any]:
    """Fit the emotion prior on the training side of ``data``'s pool and the situations file, and save it to
    ``output``; returns what to show (the output, its size and the prior's description).

    Raises DataError or PriorError for bad inputs, PreflightError (before any work) for an ``output`` in a
    folder that is missing or cannot be written, and OSError when writing it fails all the same.
    """
    from trace_dspy.data.situations import resolve_situations
    from trace_dspy.data.sources import resolve_source
    from trace_dspy.program.emotion_prior import fit_from_source

    from trace_dspy.workflows.preflight import check_output_file

    check_output_file(output, "--output")  # before the fit, which takes minutes
    resolved = resolve_situations(situations)
    source = resolve_source(data, seed=seed)
    with heartbeat("emotion prior") as phase:
        phase.note("embedding the pool and fitting")
        prior = fit_from_source(source, situations=resolved, seed=seed, refit_on_dev=refit_on_dev)
    prior.save(output)
    return {"output": str(output), "size_bytes": output.stat().st_size, **prior.describe()}


def refit_tone(data: str | None, *, seed: int = 0, limit: int | None = None, output: Path | None = None,
               check: bool = False, json_path: Path | None = None, command: str = "") -> Refit:
    """Refit the tone head on the ED pool of ``data`` (see :mod:`trace_dspy.optimize.tone`)."""
    from trace_dspy.optimize.tone import WEIGHTS_FILE, ToneError, ToneScorer, fit_tone, tone_rows

    _check_outputs(output or WEIGHTS_FILE, json_path, check)
    source, embedder = _ed_pool(data, seed, limit, "the tone head")

    def rows_of(n: int | None):
        keys = {r[0] for r in pool_rows(source, n, seed)}  # the same seeded conversations as the other heads
        return [r for r in tone_rows(source.pool) if r[0] in keys]

    def extras(result) -> dict:
        small = fit_tone(rows_of(TONE_REPRODUCE_LIMIT), embedder.encode, seed=seed)
        scores = ToneScorer(result.head, encode=embedder.encode).pleasant_batch(list(TONE_PROBES))
        return {"reproduce": {"limit": TONE_REPRODUCE_LIMIT, "dev_table": small.table},
                "probes": [{"reply": r, "p_pleasant": p} for r, p in zip(TONE_PROBES, scores)]}

    return _refit_ed_head(
        "tone head", "replies", source, rows_of(limit),
        lambda rows, meta: fit_tone(rows, embedder.encode, seed=seed, meta=meta), tone_table_text, extras,
        output=output or WEIGHTS_FILE, limit=limit, check=check, load_error=ToneError, same=same_relevance_table,
        json_path=json_path, command=command)
