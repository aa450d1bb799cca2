"""Word tokens: Treebank rules as the preprocessed EmpatheticDialogues text has them."""

from trace_dspy.optimize.tokens import content_words, tokenize


def test_tokenize_matches_ed_preprocessing():
    assert tokenize("I'm SO sorry. That's bad!") == ["i", "'m", "so", "sorry", ".", "that", "'s", "bad", "!"]
    assert tokenize("i 'm so sorry . that 's bad !") == ["i", "'m", "so", "sorry", ".", "that", "'s", "bad", "!"]
    assert content_words("I lost my keys at the beach.") == {"lost", "keys", "beach"}
