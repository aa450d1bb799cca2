"""Pure scoring functions: plain values in, numbers out, no DSPy and no LM.

Replies are compared on word tokens (``optimize.tokens``); ``parrots`` runs a
caller's extra check where given (the compact writer's guards).
"""

from __future__ import annotations

import math
import os
import re
from collections import Counter
from collections.abc import Callable, Iterable, Sequence

from trace_dspy.core.labels import EMOTION_TO_GROUP
from trace_dspy.core.text import sentence_count as count_sentences
from trace_dspy.optimize.tokens import WORD_CHAR, content_words, tokenize

# ---------------------------------------------------------------- emotion


def _check_pair(gold: Sequence, predicted: Sequence) -> None:
    if len(gold) != len(predicted):
        raise ValueError(f"gold has {len(gold)} labels but predicted has {len(predicted)}")
    if not gold:
        raise ValueError("no items to score")


def emotion_accuracy(gold: Sequence[str], predicted: Sequence[str | None]) -> float:
    """Share of items whose predicted 32-class label equals the gold label.

    A missing prediction (None, e.g. a failed stage call) counts as wrong.
    """
    _check_pair(gold, predicted)
    return sum(g == p for g, p in zip(gold, predicted)) / len(gold)


def group_accuracy(gold: Sequence[str], predicted: Sequence[str | None]) -> float:
    """Accuracy over the 6 Ekman groups (see trace_dspy.core.labels.EMOTION_TO_GROUP)."""
    _check_pair(gold, predicted)
    hits = sum(p in EMOTION_TO_GROUP and EMOTION_TO_GROUP[p] == EMOTION_TO_GROUP[g] for g, p in zip(gold, predicted))
    return hits / len(gold)


def emotion_credit(gold: str, predicted: str | None, group_credit: float = 0.5) -> float:
    """1 for the right label, ``group_credit`` for the right Ekman group, else 0."""
    if predicted == gold:
        return 1.0
    if predicted in EMOTION_TO_GROUP and EMOTION_TO_GROUP[predicted] == EMOTION_TO_GROUP.get(gold):
        return group_credit
    return 0.0


def distribution(labels: Iterable[str | None]) -> dict[str, float]:
    """Share of each label (None counted as 'missing'), sorted by share."""
    counts = Counter("missing" if x is None else x for x in labels)
    total = sum(counts.values())
    if not total:
        return {}
    return {k: v / total for k, v in counts.most_common()}


# ---------------------------------------------------------------- reference-based


def bleu(references: Sequence[str], hypotheses: Sequence[str], n: int) -> float:
    """Corpus BLEU-n (uniform weights over 1..n), x100."""
    from nltk.translate.bleu_score import SmoothingFunction, corpus_bleu

    _check_pair(references, hypotheses)
    if not 1 <= n <= 4:
        raise ValueError("n must be 1..4")
    refs = [[tokenize(r)] for r in references]
    hyps = [tokenize(h) for h in hypotheses]
    weights = tuple([1.0 / n] * n)
    return 100 * corpus_bleu(refs, hyps, weights=weights, smoothing_function=SmoothingFunction().method1)


def sentence_bleu(reference: str, hypothesis: str, n: int = 2) -> float:
    """Smoothed sentence BLEU-n in [0, 1], for per-example scores."""
    from nltk.translate.bleu_score import SmoothingFunction
    from nltk.translate.bleu_score import sentence_bleu as _sentence_bleu

    hyp = tokenize(hypothesis)
    if not hyp:
        return 0.0
    return _sentence_bleu([tokenize(reference)], hyp, weights=tuple([1.0 / n] * n),
                          smoothing_function=SmoothingFunction().method1)


def _lcs_length(a: Sequence[str], b: Sequence[str]) -> int:
    if len(a) < len(b):
        a, b = b, a
    row = [0] * (len(b) + 1)
    for x in a:
        prev_diag = 0
        for j, y in enumerate(b, 1):
            keep = row[j]
            row[j] = prev_diag + 1 if x == y else max(row[j], row[j - 1])
            prev_diag = keep
    return row[-1]


def rouge_l(reference: str, hypothesis: str) -> float:
    """ROUGE-L F1 (beta = 1) on word tokens, in [0, 1]."""
    ref, hyp = tokenize(reference), tokenize(hypothesis)
    if not ref or not hyp:
        return 0.0
    lcs = _lcs_length(ref, hyp)
    if lcs == 0:
        return 0.0
    precision, recall = lcs / len(hyp), lcs / len(ref)
    return 2 * precision * recall / (precision + recall)


def token_f1(reference: str, hypothesis: str) -> float:
    """SQuAD-style bag-of-tokens F1, in [0, 1]."""
    ref, hyp = Counter(tokenize(reference)), Counter(tokenize(hypothesis))
    overlap = sum((ref & hyp).values())
    if overlap == 0:
        return 0.0
    precision, recall = overlap / sum(hyp.values()), overlap / sum(ref.values())
    return 2 * precision * recall / (precision + recall)


# ---------------------------------------------------------------- diversity


def _ngrams(tokens: Sequence, n: int) -> list[tuple]:
    return [tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1)]


def distinct_n(texts: Sequence[str], n: int) -> float:
    """Corpus-level Distinct-n x100: distinct n-grams over all n-grams (per reply)."""
    grams = [g for t in texts for g in _ngrams(tokenize(t), n)]
    return 100 * len(set(grams)) / len(grams) if grams else 0.0


def _cl100k():
    import tiktoken

    if "TIKTOKEN_CACHE_DIR" not in os.environ:
        # LiteLLM ships the cl100k_base file; point tiktoken at it so nothing is downloaded.
        import importlib.util

        spec = importlib.util.find_spec("litellm")
        if spec and spec.submodule_search_locations:
            folder = os.path.join(list(spec.submodule_search_locations)[0], "litellm_core_utils", "tokenizers")
            if os.path.isdir(folder):
                os.environ["TIKTOKEN_CACHE_DIR"] = folder
    return tiktoken.get_encoding("cl100k_base")


def expectation_adjusted_distinct(token_ids: Sequence[int], n: int, vocab_size: int) -> float:
    """EAD-n (Liu et al., 2022): distinct n-grams divided by the number of distinct
    n-grams expected from ``len(ngrams)`` uniform draws over ``vocab_size`` types."""
    grams = _ngrams(token_ids, n)
    if not grams:
        return 0.0
    expected = vocab_size * (1 - ((vocab_size - 1) / vocab_size) ** len(grams))
    return len(set(grams)) / expected


def ead_n(texts: Sequence[str], n: int) -> float:
    """EAD-n on cl100k tokens of the replies joined in order, as in the TRACE code."""
    enc = _cl100k()
    ids = [i for t in texts for i in enc.encode(" ".join(str(t).split()))]
    return expectation_adjusted_distinct(ids, n, enc.n_vocab)


def mean_length(texts: Sequence[str]) -> float:
    """Average reply length in word tokens."""
    return sum(len(tokenize(t)) for t in texts) / len(texts) if texts else 0.0


# ---------------------------------------------------------------- response rules

_ADVICE = re.compile(
    # "you must" is advice unless it guesses a feeling or a past ("you must be so proud", "you must have
    # been scared"): that is an interpretation, the IP mechanism.
    r"\b(you should|you shouldn't|you need to|you have to|you must(?! (?:be|feel|have been|'ve been)\b)|"
    r"you ought|try to|try and|i suggest|i recommend|i'd recommend|i would recommend|my advice|why don't you|"
    r"why not just|have you tried|"
    r"make sure (?:you|to)|don't forget to|consider (?:talking|trying|getting|seeing|asking))\b",
    re.IGNORECASE,
)


def gives_advice(text: str) -> bool:
    """Does the reply tell the speaker what to do? (A phrase list, not a model.)"""
    return bool(_ADVICE.search(" ".join(str(text).replace(" n't", "n't").replace(" '", "'").split())))


def sentence_count(text: str) -> int:
    return count_sentences(str(text))


def reused_details(reply: str, source: str) -> set[str]:
    """Content words of ``source`` (the speaker's words or trigger spans) that the reply reuses."""
    return content_words(reply) & content_words(source)


def response_rules(reply: str, speaker_text: str, *, max_sentences: int = 2, max_words: int = 60,
                   speaker_turns: Sequence[str] | None = None,
                   also_parrots: Callable[[str, Sequence[str]], bool] | None = None) -> dict[str, bool]:
    """TRACE's reply rules, checked without a model (``speaker_turns``: the speaker's turns, for parroting;
    ``also_parrots``: see ``parrots``)."""
    words = len([t for t in tokenize(reply) if WORD_CHAR.search(t)])
    return {
        "brief": 1 <= sentence_count(reply) <= max_sentences and words <= max_words,
        "reuses_detail": bool(reused_details(reply, speaker_text)),
        "no_advice": not gives_advice(reply),
        "not_parroting": not parrots(reply, list(speaker_turns) if speaker_turns else [speaker_text],
                                     also=also_parrots),
    }


# ---------------------------------------------------------------- validity


def auc(positives: Sequence[float], negatives: Sequence[float]) -> float:
    """Probability that a random positive scores above a random negative (ties count half)."""
    if not positives or not negatives:
        raise ValueError("need at least one positive and one negative score")
    ordered = sorted([(s, 1) for s in positives] + [(s, 0) for s in negatives])
    rank_sum, i = 0.0, 0
    while i < len(ordered):  # average ranks over ties
        j = i
        while j < len(ordered) and ordered[j][0] == ordered[i][0]:
            j += 1
        mean_rank = (i + 1 + j) / 2
        rank_sum += mean_rank * sum(label for _, label in ordered[i:j])
        i = j
    n_pos, n_neg = len(positives), len(negatives)
    return (rank_sum - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)


def safe_mean(values: Iterable[float | None]) -> float | None:
    vals = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    return sum(vals) / len(vals) if vals else None


def paired_bootstrap_ci(treatment: Sequence[float], control: Sequence[float], *, samples: int = 2000,
                        confidence: float = 0.95, seed: int = 0) -> tuple[float, float, float]:
    """Mean of per-item differences (treatment - control) and its percentile bootstrap CI.

    Items are resampled in pairs, so the interval reflects the variation that
    both systems share on the same examples.
    """
    import numpy as np

    if len(treatment) != len(control) or not treatment:
        raise ValueError("need two equally long, non-empty score lists")
    diffs = np.asarray(treatment, dtype=float) - np.asarray(control, dtype=float)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(diffs), size=(samples, len(diffs)))
    means = diffs[idx].mean(axis=1)
    tail = (1 - confidence) / 2 * 100
    low, high = np.percentile(means, [tail, 100 - tail])
    return float(diffs.mean()), float(low), float(high)


# ---------------------------------------------------------------- copying

COPY_F1 = 0.8


def near_copy(reply: str, sources: Iterable[str], threshold: float = COPY_F1) -> str | None:
    """The first source that ``reply`` nearly copies (token F1 >= threshold), else None."""
    if not tokenize(reply):
        return None
    for source in sources:
        if source and token_f1(source, reply) >= threshold:
            return source
    return None


def parrots(reply: str, speaker_turns: Sequence[str], threshold: float = COPY_F1, *,
            also: Callable[[str, Sequence[str]], bool] | None = None) -> bool:
    """Does the reply repeat the speaker: one of their turns, all their words, or their last turn? ``also``,
    where given, is one more way to repeat them (the compact writer's guards: a first-person run of their words,
    an opening "my ..." of theirs)."""
    turns = [t for t in speaker_turns if t and t.strip()]
    if not turns:
        return False
    if near_copy(reply, [*turns, " ".join(turns)], threshold) is not None:
        return True
    words = lambda text: " ".join(t for t in tokenize(text) if WORD_CHAR.search(t))  # noqa: E731
    last = words(turns[-1])
    if len(last.split()) >= 4 and f" {last} " in f" {words(reply)} ":
        return True
    return also is not None and also(reply, turns)


# ---------------------------------------------------------------- agreement with human ratings


def _ranks(values: Sequence[float]) -> list[float]:
    """1-based ranks, ties given their average rank."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman rank correlation (Pearson on average ranks); 0 when either side is constant."""
    if len(a) != len(b) or len(a) < 2:
        raise ValueError("need two equally long sequences of at least 2 values")
    ra, rb = _ranks(list(a)), _ranks(list(b))
    ma, mb = sum(ra) / len(ra), sum(rb) / len(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    va = sum((x - ma) ** 2 for x in ra)
    vb = sum((y - mb) ** 2 for y in rb)
    return cov / math.sqrt(va * vb) if va > 0 and vb > 0 else 0.0


def macro_f1(gold: Sequence, predicted: Sequence, labels: Sequence | None = None) -> float:
    """Unweighted mean of per-class F1 over ``labels`` (default: the classes in gold)."""
    _check_pair(gold, predicted)
    classes = list(labels) if labels is not None else sorted(set(gold))
    scores = []
    for c in classes:
        tp = sum(g == c and p == c for g, p in zip(gold, predicted))
        fp = sum(g != c and p == c for g, p in zip(gold, predicted))
        fn = sum(g == c and p != c for g, p in zip(gold, predicted))
        scores.append(2 * tp / (2 * tp + fp + fn) if tp else 0.0)
    return sum(scores) / len(scores)
