"""The emotion prior's variants, fitted as ``compile`` fits one, scored on dev and test.

Each variant is fitted on the training side of the pool (seed-split by conversation, as ``compile`` does)
and, where it says so, on the situations; C and the other settings are fixed per variant, and the
temperature is calibrated on dev as always. Dev is the pool's dev side (longest view, the items that chose
the shipped settings); test is the ED test split in the TRACE view (every item) and the CEM view (every
sample). The shipped prior is scored on the same items. Test numbers are reported, never used to choose.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np

from trace_dspy.core.tables import markdown_table


@dataclass(frozen=True)
class Variant:
    name: str
    situations: bool = True
    c: float = 1.0
    embed_weight: float = 0.5
    ngrams: int = 2
    min_df: int = 3


VARIANTS = (
    Variant("dialogues only", situations=False),
    Variant("+ situations, C = 0.5", c=0.5),
    Variant("+ situations, C = 1 (shipped settings)"),
    Variant("+ situations, C = 2", c=2.0),
    Variant("+ situations, C = 3", c=3.0),
    Variant("+ situations, embedding weight 1", embed_weight=1.0),
    Variant("+ situations, embedding weight 0.35", embed_weight=0.35),
    Variant("+ situations, words only (no word pairs)", ngrams=1),
    Variant("+ situations, terms in at least 2 texts", min_df=2),
)


def _scores(prior, texts, gold, encode) -> dict[str, float]:
    from trace_dspy.program.emotion_prior import accuracy

    logits = prior.logits(texts, encode)
    out = {k: round(v, 4) for k, v in accuracy(prior, texts, gold, encode, p=_softmax(logits)).items()}
    index = {label: i for i, label in enumerate(prior.labels)}
    known = [i for i, g in enumerate(gold) if g in index]
    if known:
        y = np.array([index[gold[i]] for i in known])
        for key, scale in (("nll", 1.0), ("nll_uncalibrated", prior.temperature)):
            z = logits[known] * scale
            z = z - z.max(axis=1, keepdims=True)
            out[key] = round(float(np.mean(np.log(np.exp(z).sum(axis=1)) - z[np.arange(len(y)), y])), 4)
    return out


def _softmax(logits: np.ndarray) -> np.ndarray:
    z = np.exp(logits - logits.max(axis=1, keepdims=True))
    return z / z.sum(axis=1, keepdims=True)


def measure_prior_variants(source, situations, *, seed: int = 0, variants=VARIANTS,
                           encode: Callable | None = None, on_variant=None) -> dict[str, Any]:
    """Dev, TRACE-view test and CEM-view test scores of each variant and of the shipped prior."""
    from trace_dspy.data.sources import partition_by_conversation, select_view
    from trace_dspy.program.emotion_prior import (
        SPEC,
        TrainingSet,
        default_encoder,
        fit_prior,
        prior_text,
        shipped_prior,
    )

    encode = encode or default_encoder()
    train, dev = partition_by_conversation(source.pool, 0.2, seed=seed)
    sets = {"dev": select_view(dev, "longest"), "test": select_view(source.test, "trace"),
            "cem": select_view(source.test, "cem")}
    texts = {k: [prior_text(s.dialogue) for s in v] for k, v in sets.items()}
    gold = {k: [s.emotion for s in v] for k, v in sets.items()}
    train_texts, train_labels = [prior_text(s.dialogue) for s in train], [s.emotion for s in train]
    rows = []
    for variant in variants:
        if variant.situations and situations is None:
            continue
        started = time.perf_counter()
        prior = fit_prior(TrainingSet.of(train_texts, train_labels, situations if variant.situations else None),
                          texts["dev"], gold["dev"], encode, c_grid=(variant.c,), min_df=variant.min_df,
                          spec=replace(SPEC, embed_weight=variant.embed_weight, ngrams=variant.ngrams))
        rows.append({**asdict(variant), "vocabulary": len(prior.vocab), "temperature": prior.temperature,
                     "fit_seconds": round(time.perf_counter() - started, 1),
                     **{k: _scores(prior, texts[k], gold[k], encode) for k in sets}})
        if on_variant:
            on_variant(rows[-1])
    shipped = shipped_prior()
    result: dict[str, Any] = {"seed": seed, "items": {k: len(v) for k, v in sets.items()},
                              "train_dialogues": len(train), "situations": situations.describe() if situations
                              else None, "variants": rows}
    if shipped is not None:
        result["shipped"] = {"prior": shipped.describe(), **{k: _scores(shipped, texts[k], gold[k], encode)
                                                             for k in sets}}
    return result


def prior_variants_markdown(result: dict[str, Any]) -> str:
    from trace_dspy.bench.emotion import PUBLISHED_EMOTION

    items = result["items"]
    head = ["variant", f"dev ({items['dev']})", f"test TRACE view ({items['test']})",
            f"test CEM view ({items['cem']})", "test top-3", "fit s"]

    def cells(name, r, seconds):
        return [name, f"{r['dev']['accuracy']:.3f} / {r['dev']['group_accuracy']:.3f}",
                f"{r['test']['accuracy']:.3f} / {r['test']['group_accuracy']:.3f}",
                f"{r['cem']['accuracy']:.3f} / {r['cem']['group_accuracy']:.3f}", f"{r['test']['top3']:.3f}", seconds]

    rows = [cells(r["name"], r, f"{r['fit_seconds']:.0f}") for r in result["variants"]]
    if "shipped" in result:
        rows.append(cells("**shipped prior**", result["shipped"], "-"))
    rows += [[f"{name} (published)", "-", "-", f"{acc:.3f} / -", "-", "-"] for name, acc in PUBLISHED_EMOTION.items()]
    lines = ["32-class / 6-group accuracy.", "", markdown_table(head, rows)]
    if "shipped" in result:
        t = result["shipped"]["test"]
        lines += ["", (f"Calibration of the shipped prior on the TRACE-view test items: mean negative "
                       f"log-likelihood {t['nll']:.3f} with its temperature "
                       f"({result['shipped']['prior'].get('temperature')}), {t['nll_uncalibrated']:.3f} without.")]
    return "\n".join(lines)


__all__ = ["VARIANTS", "Variant", "measure_prior_variants", "prior_variants_markdown"]
