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
    found = dict(re.findall(r"`([A-Z])`\s+(?:is\s+)?`(tests/(?:\w+/)*test_\w+\.py)`", text))
    assert found, "the document names no test-file abbreviations"
    return found


def _test_names(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {node.name for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test_")}


def test_every_test_the_reliability_doc_names_exists():
    text = DOC.read_text(encoding="utf-8")
    files = _abbreviations(text)
    refs = re.findall(r"`(?:([A-Z])|(tests/(?:\w+/)*test_\w+\.py))::(test_\w+)`", text)
    assert len(refs) > 50
    missing = []
    for short, path, name in refs:
        target = ROOT / (files[short] if short else path)
        if not target.exists() or name not in _test_names(target):
            missing.append(f"{short or path}::{name}")
    assert not missing, f"docs/reference/reliability.md names tests that do not exist: {missing}"


def _attack_sections(text: str) -> list[str]:
    """Each "## Hostile input ..." section, up to the next second-level heading."""
    sections = []
    for start in (m.start() for m in re.finditer(r"^## Hostile input", text, re.MULTILINE)):
        section = text[start:]
        sections.append(section[:section.index("\n## ", 1)])
    return sections


def _attack_rows(section: str) -> list[tuple[int, str, str]]:
    """(how many attacks, held or broke, the row) for each row of a section's attack tables. A table whose
    first column is ``n`` groups attacks (n of them in a row); otherwise a row is one attack."""
    rows, grouped = [], False
    for line in section.splitlines():
        if line.startswith(("| attack", "| n |")):
            grouped = line.startswith("| n |")
            continue
        if not line.startswith("| ") or line.startswith("| ---"):
            continue
        verdict = re.search(r"\| \*(held|broke)\*", line)
        assert verdict, line
        count = int(line.split("|")[1]) if grouped else 1
        rows.append((count, verdict.group(1), line))
    return rows


def test_the_attack_counts_agree_with_the_attack_table():
    sections = _attack_sections(DOC.read_text(encoding="utf-8"))
    assert len(sections) >= 2
    for section in sections:
        rows = _attack_rows(section)
        tried = sum(n for n, _, _ in rows)
        held = sum(n for n, verdict, _ in rows if verdict == "held")
        claim = re.search(r"Attacks tried: (\d+)\. On (\w+): (\d+) held, (\d+) broke\. Now: all (\d+) hold\.",
                          section)
        assert claim, "an attack section states no counts"
        numbers = (int(claim[1]), int(claim[3]), int(claim[4]), int(claim[5]))
        assert numbers == (tried, held, tried - held, tried), (claim[0], tried, held)
        # Every attack that broke names the test that reproduces it (or "same test", after one that does);
        # a held row names its test too, unless it stands for attacks the report did not list one by one.
        for _, verdict, row in rows:
            named = re.search(r"`(?:[A-Z]|tests/(?:\w+/)*test_\w+\.py)::test_\w+`|same test", row)
            assert named or (verdict == "held" and "not listed one by one" in row), row
