"""The metric validity study behind ``python -m trace_dspy.metric_validity``: human ratings (EPITOME), the
scorer as a classifier, and real against wrong replies on EmpatheticDialogues (see
:mod:`trace_dspy.bench.validity` for the parts)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trace_dspy.bench.validity import (
    NEGATIVES,
    OLD_FREE,
    OLD_NAME,
    auc_table,
    ed_part,
    epitome_part,
    free_weights,
    search_weights,
)
from trace_dspy.core.console import say
from trace_dspy.core.tables import markdown_table
from trace_dspy.optimize.metric import EmpathyMetric, MetricConfig
from trace_dspy.program.writers import compact_guards


class StudyError(ValueError):
    """The study cannot run: no learned scorer, no EPITOME, or no EmpatheticDialogues."""


def run_validity(*, epitome: str | None, data: str | None, limit: int = 500, seed: int = 0, search: bool = False,
                 reply_guards: bool = False, output: Path | None = None, command: str = "") -> str:
    """Run the study; returns its markdown and, with ``output``, writes the results there as JSON."""
    from trace_dspy.core.jsonl import atomic_write_json
    from trace_dspy.optimize.empathy_fit import PUBLISHED

    config = MetricConfig()
    metric = EmpathyMetric(config, guards=compact_guards() if reply_guards else None)
    if metric.scorer is None:
        raise StudyError("the validity study needs the learned scorer, which needs the 'embed' extra")
    meta = metric.scorer.meta
    dev = _epitome_dev(epitome, meta)
    examples, constant = _ed_items(data, limit=limit, seed=seed)
    weights = {**free_weights(config), "strategy_fit": config.strategy_fit}  # reference-free
    default_weights = config.weights()
    ep = epitome_part(metric, dev, weights)
    ed = ed_part(metric, examples, constant)
    ed_table = auc_table(ed, ["empathy", "ER", "IP", "EX", "relevance", "cosine", "rules", "composite"], weights)
    # The default composite also holds reference-based parts (similarity to the gold reply, emotion),
    # which are 1.0 on the positive by construction here; listed so that nobody mistakes it for evidence.
    ed_table["composite (default, with reference parts)"] = auc_table(ed, ["composite"], default_weights)["composite"]
    ed_table[OLD_NAME] = auc_table(ed, ["old"], OLD_FREE)["old"]
    found = search_weights(ed, ep["rows"], [sum(p.levels) for p in dev]) if search else None
    if output:
        atomic_write_json(output, {
            "command": command, "ed_items": len(examples), "constant_reply": constant,
            "reference_free_weights": weights, "default_weights": default_weights,
            "metric_config": config.to_dict(), "scorer_fingerprint": meta.get("data_fingerprint"),
            "epitome": {k: v for k, v in ep.items() if k != "rows"}, "classifier": meta["dev_table"],
            "published": PUBLISHED, "ed_auc": ed_table, "search": found,
        })
    return _markdown(ep, meta, len(examples), ed_table, found)


def _epitome_dev(epitome: str | None, meta: dict[str, Any]) -> list:
    """The EPITOME pairs held out from the scorer's fit (its recorded seed and split)."""
    from trace_dspy.data.epitome import EpitomeError, load_epitome, split_by_post

    try:
        data = load_epitome(epitome)
    except EpitomeError as exc:
        raise StudyError(str(exc)) from exc
    if data.fingerprint != meta.get("data_fingerprint"):
        say(f"NOTE: EPITOME files {data.fingerprint} differ from the scorer's {meta.get('data_fingerprint')}; "
            "the held-out split may overlap its training posts")
    return split_by_post(data.pairs, dev_fraction=meta.get("dev_fraction", 0.25), seed=meta.get("seed", 0))[1]


def _ed_items(data: str | None, *, limit: int, seed: int) -> tuple[list, str]:
    """The seeded ED test items and the constant reply (the gold reply of the first pool conversation)."""
    from trace_dspy.data.sources import (
        DataError,
        load_splits,
        load_test,
        resolve_source,
    )

    try:
        source = resolve_source(data, seed=seed, announce_seed=False)
    except DataError as exc:
        raise StudyError(str(exc)) from exc
    if source.is_seed:
        raise StudyError("the validity study needs EmpatheticDialogues (--data or TRACE_DSPY_DATA), not the seed set")
    examples = load_test(source, view="trace", limit=limit, seed=seed)
    return examples, load_splits(source, seed=seed).train[0].response


def _markdown(ep: dict, meta: dict, items: int, ed_table: dict, search: list | None) -> str:
    from trace_dspy.optimize.empathy_fit import PUBLISHED

    lines = [f"## EPITOME held-out posts ({ep['pairs']} pairs, {ep['posts']} posts): Spearman with human levels\n",
             markdown_table(["component", "ER", "IP", "EX", "sum"], [
                 [name, *(f"{row[c]:.3f}" if c in row else "-" for c in ("ER", "IP", "EX", "sum"))]
                 for name, row in ep["spearman"].items()]),
             "\n## The scorer as a classifier (EPITOME held-out posts)\n",
             markdown_table(
                 ["mechanism", "accuracy", "macro-F1", "majority acc", "majority macro-F1", "published acc",
                  "published macro-F1"],
                 [[mech, *(f"{meta['dev_table'][mech][k]:.3f}" for k in ("accuracy", "macro_f1", "majority_accuracy",
                                                                          "majority_macro_f1")),
                   f"{PUBLISHED[mech]['accuracy']:.2f}", f"{PUBLISHED[mech]['macro_f1']:.2f}"]
                  for mech in ("ER", "IP", "EX")]),
             f"\n## EmpatheticDialogues test ({items} items): AUC of gold against each negative\n",
             markdown_table(["component", *NEGATIVES, "mean on gold"], [
                 [name, *(f"{row[k]:.3f}" if row[k] is not None else "-" for k in (*NEGATIVES, "mean_gold"))]
                 for name, row in ed_table.items()])]
    if search:
        lines.append("\n## Weight search (top 5: mixes with AUC >= 0.90 on every negative first, by EPITOME sum "
                     "Spearman)\n")
        lines += [f"- {r['weights']}, relevance_floor {r['relevance_floor']}: worst AUC {r['worst_auc']:.3f}, "
                  f"EPITOME sum rho {r['epitome_sum_spearman']:.3f}" for r in search[:5]]
    return "\n".join(lines)
