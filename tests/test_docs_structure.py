"""The README and docs/ hang together: every relative link reaches its file (and heading), every record a
page names exists, and no heading or code comment cites an issue number (headings name topics; comments
explain the code, not its history)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
ISSUE = re.compile(r"\b(issues?|#) ?\d+", re.IGNORECASE)


def _ids(paths):
    return [str(p.relative_to(ROOT)) for p in paths]


def _prose(text: str) -> str:
    return re.sub(r"^```.*?^```", "", text, flags=re.DOTALL | re.MULTILINE)


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@pytest.mark.parametrize("page", PAGES, ids=_ids(PAGES))
def test_every_relative_link_reaches_its_file_and_heading(page):
    broken = []
    for link in re.findall(r"\]\(([^)\s]+)\)", _prose(page.read_text(encoding="utf-8"))):
        if link.startswith(("http://", "https://", "mailto:")):
            continue
        path, _, anchor = link.partition("#")
        target = (page.parent / path).resolve() if path else page
        if not target.exists():
            broken.append(link)
        elif anchor and target.suffix == ".md":
            headings = [line.lstrip("#") for line in _prose(target.read_text(encoding="utf-8")).splitlines()
                        if line.startswith("#")]
            if anchor not in {_slug(h) for h in headings}:
                broken.append(link)
    assert not broken, f"{page.relative_to(ROOT)}: {broken}"


@pytest.mark.parametrize("page", PAGES, ids=_ids(PAGES))
def test_every_record_a_page_names_exists(page):
    named = set(re.findall(r"docs/[\w./-]+\.(?:jsonl|json|png|toml)\b", page.read_text(encoding="utf-8")))
    missing = sorted(p for p in named if not (ROOT / p).exists())
    assert not missing, f"{page.relative_to(ROOT)} names records that do not exist: {missing}"


def test_no_heading_names_an_issue():
    found = [f"{page.relative_to(ROOT)}: {line}" for page in PAGES
             for line in _prose(page.read_text(encoding="utf-8")).splitlines()
             if line.startswith("#") and ISSUE.search(line.lstrip("#"))]
    assert not found, found


def test_no_code_comment_cites_an_issue():
    found = []
    for folder in ("trace_dspy", "signatures", "optimize", "tests"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if re.search(r"\bissues? \d+", line, re.IGNORECASE):
                    found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not found, found
