"""The emotion bench: accuracy of the majority label, the fitted prior and the emotion stage, and the prior's cost."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from trace_dspy.bench.records import ms_stats
from trace_dspy.core.tables import markdown_table

# Published 32-class emotion accuracy on ED test (the anchors of the emotion table).
PUBLISHED_EMOTION = {"CEM (Sabour et al., 2022)": 0.391, "CASE (Zhou et al., 2023)": 0.402,
                     "TRACE with GPT-4o, reported I-ACC": 0.4428}


def measure_emotion(source, lm, *, limit: int = 300, ks: Sequence[int] = (0, 2, 3), seed: int = 0,
                    cost_items: int = 100, on_item=None, prior_kind: str = "fitted",
                    situations=None) -> dict[str, Any]:
    """Emotion accuracy on the TRACE-view test set: the majority label, the fitted prior alone
    on every item, and the stage (``recognize_emotion`` on ``lm``) with the prior's top ``k``
    on ``limit`` seeded items (k = 0: the LM alone); plus the prior's milliseconds per dialogue.

    ``prior_kind``: ``fitted`` fits one on the source's training side (what ``compile`` on that
    source does); ``shipped`` uses the prior packaged with trace-dspy (what programs compiled on
    the seed set use); ``situations`` (a ``data.situations.Situations``) join a fitted prior's training set."""
    import random

    from trace_dspy.core.labels import ekman_group
    from trace_dspy.data.sources import partition_by_conversation, select_view
    from trace_dspy.program.emotion_prior import accuracy, default_encoder

    prior = _prior_of_kind(prior_kind, source, situations=situations, seed=seed)
    encode = default_encoder()
    test = select_view(source.test, "trace")
    picked = sorted(random.Random(seed).sample(range(len(test)), min(limit, len(test))))
    items = [test[i] for i in picked]
    # Cost first, while the test texts are not yet in the embedder's cache: one dialogue per call.
    cold = [t for t in test if t not in items][:cost_items]
    cost = measure_prior_cost(prior, cold, encode)
    texts, gold = [prior.text_of(s.dialogue) for s in test], [s.emotion for s in test]
    train = partition_by_conversation(source.pool, 0.2, seed=seed)[0]
    majority = max(sorted({s.emotion for s in train}), key=[s.emotion for s in train].count)
    group_majority = max(sorted({ekman_group(s.emotion) for s in train}),
                         key=[ekman_group(s.emotion) for s in train].count)
    return {
        "test_items": len(test), "stage_items": len(items), "seed": seed, "prior_kind": prior_kind,
        "prior": prior.describe(),
        "majority": {"label": majority, "accuracy": sum(g == majority for g in gold) / len(gold),
                     "group": group_majority,
                     "group_accuracy": sum(ekman_group(g) == group_majority for g in gold) / len(gold)},
        "prior_all": {**accuracy(prior, texts, gold, encode), "n": len(test)},
        "prior_on_stage_items": accuracy(prior, [prior.text_of(s.dialogue) for s in items],
                                         [s.emotion for s in items], encode),
        **cost, "published": PUBLISHED_EMOTION,
        "stage": [_stage_accuracy(items, lm, prior, k, encode, on_item) for k in ks]}


def _prior_of_kind(prior_kind: str, source, *, situations, seed: int):
    from trace_dspy.program.emotion_prior import PriorError, cached_prior, shipped_prior

    if prior_kind == "shipped":
        prior = shipped_prior()
        if prior is None:
            raise PriorError("this installation has no shipped prior")
        return prior
    if prior_kind == "fitted":
        return cached_prior(source, situations=situations, seed=seed)
    raise ValueError(f"prior_kind must be 'fitted' or 'shipped', not {prior_kind!r}")


def _stage_accuracy(items: Sequence, lm, prior, k: int, encode, on_item) -> dict[str, Any]:
    """``recognize_emotion`` on ``lm`` over ``items``, given the prior's top ``k`` (k = 0: the LM alone)."""
    from trace_dspy.core.config import ProgramConfig
    from trace_dspy.core.labels import ekman_group
    from trace_dspy.program.emotion_prior import format_candidates
    from trace_dspy.program.pipeline import TraceProgram

    program = TraceProgram(ProgramConfig(prior_k=k), emotion_prior=prior if k else None)
    program.set_stage_lms({"recognize_emotion": lm})
    right = group_right = outside = 0
    start = time.perf_counter()
    for n, sample in enumerate(items, 1):
        state = {"dialogue": sample.dialogue}
        allowed = prior.candidates(sample.dialogue, k, encode) if k else []
        if k:
            state["emotion_candidates"] = format_candidates(allowed)
        label = program._call("recognize_emotion", state).emotion
        right += label == sample.emotion
        group_right += ekman_group(label) == ekman_group(sample.emotion)
        outside += bool(allowed) and label not in {c for c, _ in allowed}
        if on_item:
            on_item(k, n, len(items))
    return {"k": k, "accuracy": right / len(items), "group_accuracy": group_right / len(items),
            "outside_candidates": outside, "seconds_per_item": (time.perf_counter() - start) / len(items)}


def measure_prior_cost(prior, samples: Sequence, encode) -> dict[str, Any]:
    """The prior's milliseconds per dialogue, each embedding computed afresh, two ways:

    - ``prior_ms_per_dialogue``: the prior on its own (its embedding plus the linear model);
    - ``prior_added_ms_per_dialogue``: what it adds to a program whose reply reward scores a reply
      (Best-of-N, the default): the time of prior + reward minus the reward alone on the same
      dialogue and reply (the sample's gold reply), with the embedder's cache emptied before each.
      A prior of feature version 2 embeds the speaker's words as the reward spells them, so the
      reward finds that embedding cached.
    """
    from trace_dspy.core.dialogue import speaker_text
    from trace_dspy.optimize.empathy import EmpathyScorer
    from trace_dspy.optimize.similarity import get_embedder

    embedder = get_embedder()
    scorer = EmpathyScorer(encode=encode)
    alone, added = [], []

    def forget():
        if embedder is not None:
            embedder._cache.clear()

    for sample in samples:
        speaker, reply = speaker_text(sample.dialogue), sample.response
        forget()
        start = time.perf_counter()
        prior.candidates(sample.dialogue, 3, encode)
        t_prior = time.perf_counter() - start
        start = time.perf_counter()
        scorer.score(speaker, reply)
        t_reward_after_prior = time.perf_counter() - start
        forget()
        start = time.perf_counter()
        scorer.score(speaker, reply)
        t_reward = time.perf_counter() - start
        alone.append(t_prior)
        added.append(t_prior + t_reward_after_prior - t_reward)
    forget()
    return {"prior_ms_per_dialogue": ms_stats(alone), "prior_added_ms_per_dialogue": ms_stats(added),
            "prior_feature_version": prior.feature_version}


def emotion_markdown(result: dict[str, Any]) -> str:
    n, m = result["stage_items"], result["test_items"]
    rows = [("majority label (" + result["majority"]["label"] + ")", m, result["majority"]["accuracy"],
             result["majority"]["group_accuracy"])]
    rows.append(("fitted prior alone, top-1", m, result["prior_all"]["accuracy"], result["prior_all"]["group_accuracy"]))
    rows.append(("fitted prior alone, top-1", n, result["prior_on_stage_items"]["accuracy"],
                 result["prior_on_stage_items"]["group_accuracy"]))
    for row in result["stage"]:
        name = "LM alone (prior off)" if row["k"] == 0 else f"prior top-{row['k']} + LM"
        rows.append((name, n, row["accuracy"], row["group_accuracy"]))
    lines = [markdown_table(["system", "items", "32-class accuracy", "6-group accuracy"],
                            [*([a, b, f"{c:.3f}", f"{d:.3f}"] for a, b, c, d in rows),
                             *([f"{name} (published)", "5,255", f"{acc:.3f}", "-"]
                               for name, acc in result["published"].items())])]
    cost = result["prior_ms_per_dialogue"]
    lines += ["", f"Prior cost on its own: {cost['mean_ms']:.1f} ms per dialogue (median {cost['median_ms']:.1f}, "
              f"p95 {cost['p95_ms']:.1f}, {cost['calls']} calls), one dialogue per call, embeddings not cached."]
    added = result.get("prior_added_ms_per_dialogue")
    if added:
        lines += [f"Prior cost added to a program whose reply reward runs: {added['mean_ms']:.1f} ms per dialogue "
                  f"(median {added['median_ms']:.1f}, p95 {added['p95_ms']:.1f})."]
    return "\n".join(lines)
