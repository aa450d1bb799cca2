"""Word tokens the scorers and the reply guards compare: plain text in, tokens out.

Tokenization: lower-cased Treebank word tokens, sentence by sentence, which is
what NLTK's word tokenizer does, with a regex sentence splitter in place of
punkt so that no NLTK data download is needed. The preprocessed
EmpatheticDialogues text is already split this way ("i 'm sorry ."), so model
replies and gold replies are compared on the same footing.
"""

from __future__ import annotations

import re
from functools import lru_cache

from trace_dspy.core.text import split_sentences


@lru_cache(maxsize=1)
def _treebank():
    from nltk.tokenize import TreebankWordTokenizer

    return TreebankWordTokenizer()


def tokenize(text: str) -> list[str]:
    """Lower-cased word tokens (Treebank rules applied to each sentence)."""
    return list(_tokens(str(text)))


@lru_cache(maxsize=50_000)
def _tokens(text: str) -> tuple[str, ...]:
    # Cached: the metric tokenizes the same speaker turns and demo replies for every example.
    treebank = _treebank()
    text = " ".join(text.lower().split())
    return tuple(tok for sentence in split_sentences(text) if sentence for tok in treebank.tokenize(sentence))


# A token with a letter or a digit in it is a word; the others are punctuation.
WORD_CHAR = re.compile(r"[a-z0-9]")
STOPWORDS = frozenset(
    """a an the and or but if so of to in on at for with from by about as is are was were be been being am
    i me my mine we our you your yours he him his she her it its they them their this that these those there
    here what which who whom whose when where why how not no nor do does did doing have has had having
    can could would should will shall may might must just very really too also than then now all any some
    ' 's 're 've 'm 'll 'd n't oh well yeah yes okay ok get got""".split()
)


def content_words(text: str) -> set[str]:
    """Tokens that carry content: no stopwords, no punctuation."""
    return {t for t in tokenize(text) if WORD_CHAR.search(t) and t not in STOPWORDS}
