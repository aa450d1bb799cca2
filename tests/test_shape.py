"""The package stays readable in pieces: no module over 500 lines, no function over 60.

A module that outgrows the limit is split by what its parts do, and a long function gives its steps to
named helpers. Every Python file of the package counts: trace_dspy/ and the two folders installed inside it,
signatures/ and optimize/.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FOLDERS = ("trace_dspy", "signatures", "optimize")
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 60


def _modules() -> list[Path]:
    return sorted(p for folder in FOLDERS for p in (REPO / folder).rglob("*.py") if "__pycache__" not in p.parts)


def _functions(path: Path):
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node.name, node.lineno, node.end_lineno - node.lineno + 1


def test_every_folder_of_the_package_is_measured():
    # a walk that found nothing would pass everything below
    names = {p.relative_to(REPO).as_posix() for p in _modules()}
    assert {"trace_dspy/lm/decoding.py", "optimize/metric.py", "signatures/stages.py"} <= names


def test_no_module_is_over_500_lines():
    over = [f"{p.relative_to(REPO).as_posix()}: {n} lines" for p in _modules()
            if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES]
    assert over == [], "split these modules by responsibility"


def test_no_function_is_over_60_lines():
    over = [f"{p.relative_to(REPO).as_posix()}:{line} {name}: {n} lines" for p in _modules()
            for name, line, n in _functions(p) if n > MAX_FUNCTION_LINES]
    assert over == [], "give these functions' steps to named helpers"
