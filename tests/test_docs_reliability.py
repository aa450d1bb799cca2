"""docs/reference/reliability.md names a test for every fault and attack; those tests must exist, and the attack
table's counts must agree with its rows."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "reference" / "reliability.md"


def _abbreviations(text: str) -> dict[str, str]:
    """`X` is `tests/test_x.py` -> {"X": "tests/test_x.py"}, however the sentence names them."""
    found = dict(re.findall(r"`([A-Z])`\s+(?:is\s+)?`(tests/test_\w+\.py)`", text))
    assert found, "the document names no test-file abbreviations"
    return found


def _test_names(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {node.name for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test_")}


def test_every_test_the_reliability_doc_names_exists():
    text = DOC.read_text(encoding="utf-8")
    files = _abbreviations(text)
    refs = re.findall(r"`(?:([A-Z])|(tests/test_\w+\.py))::(test_\w+)`", text)
    assert len(refs) > 50
    missing = []
    for short, path, name in refs:
        target = ROOT / (files[short] if short else path)
        if not target.exists() or name not in _test_names(target):
            missing.append(f"{short or path}::{name}")
    assert not missing, f"docs/reference/reliability.md names tests that do not exist: {missing}"


def test_the_attack_counts_agree_with_the_attack_table():
    text = DOC.read_text(encoding="utf-8")
    section = text[text.index("## Hostile input"):]
    section = section[:section.index("\n## ", 1)]
    rows = [line for line in section.splitlines()
            if line.startswith("| ") and not line.startswith(("| attack", "| ---"))]
    verdicts = [re.search(r"\| \*(held|broke)\*", row) for row in rows]
    assert all(verdicts), [row for row, v in zip(rows, verdicts) if not v]
    held = sum(v.group(1) == "held" for v in verdicts)
    broke = len(rows) - held
    claim = re.search(r"Attacks tried: (\d+)\. On bd8e8e9: (\d+) held, (\d+) broke\. Now: all (\d+) hold\.", section)
    assert claim, "the attack section states no counts"
    assert tuple(map(int, claim.groups())) == (len(rows), held, broke, len(rows))
    # Every attack row names the test that reproduces it (or "same test", after one that does).
    assert all(re.search(r"`[A-Z]::test_\w+`|same test", row) for row in rows)
