"""Layer 3, data: dialogue sources (EmpatheticDialogues, JSONL, the hub, the seed set), EPITOME, exemplar retrieval."""
