"""Every file the package opens goes through the bounded readers of ``trace_dspy/core/files.py``.

Those readers refuse a FIFO (which would block forever), a device such as ``/dev/zero`` (which never ends)
and a file or a line past its bound. A reader that opens a file itself skips all of that, so this test
reads the package's source (``trace_dspy/``, ``signatures/``, ``optimize/``) with ``ast`` and fails on
every call that opens, reads or writes a file outside ``core/files.py`` unless the call states why it may:
a comment ``# file-audit: <reason>`` on one of the call's lines, or on the line just above it. Writers
(``open(..., "w")``, ``write_text``) and fixed system files (``/proc/stat``) are listed the same way.

The calls looked for: the builtin ``open``, ``io.open``, ``os.open``, ``os.fdopen``, ``Path.open`` (any
``.open(...)``), ``Path.read_text``/``read_bytes``/``write_text``/``write_bytes``, the ``csv`` readers (a
raw handle would bypass the bounds), the loaders that take a file (``np.load`` and friends, ``json.load``,
``tomllib.load``, ``pickle.load``, ``safetensors``' ``load_file``/``safe_open``, ``Tokenizer.from_file``,
``BM25.load``), ``shutil``'s copies, ``zipfile.ZipFile``, ``mmap.mmap`` and the temporary-file openers.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("trace_dspy", "signatures", "optimize")
EXEMPT = {"trace_dspy/core/files.py"}
MARK = "# file-audit:"

# A call ``<anything>.<attr>(...)`` with one of these names opens, reads or writes a file.
ANY_RECEIVER = {"open", "fdopen", "read_text", "read_bytes", "write_text", "write_bytes", "from_file", "tofile"}
# ``<module>.<attr>(...)`` for these modules (or names) and attributes.
BY_RECEIVER = {
    "np": {"load", "loadtxt", "genfromtxt", "fromfile", "memmap", "save", "savez", "savez_compressed"},
    "numpy": {"load", "loadtxt", "genfromtxt", "fromfile", "memmap", "save", "savez", "savez_compressed"},
    "json": {"load"}, "tomllib": {"load"}, "pickle": {"load"}, "marshal": {"load"}, "torch": {"load"},
    "csv": {"reader", "DictReader"},
    "shutil": {"copy", "copy2", "copyfile", "copytree", "copyfileobj"},
    "zipfile": {"ZipFile"}, "mmap": {"mmap"},
    "tempfile": {"mkstemp", "NamedTemporaryFile", "TemporaryFile", "SpooledTemporaryFile"},
    "BM25": {"load"},
}
# Plain names (imported functions) that open a file.
NAMES = {"open", "fdopen", "load_file", "safe_open", "ZipFile", "mkstemp", "NamedTemporaryFile"}


def _receiver(node: ast.expr) -> str | None:
    """The last name of a call's receiver: ``np`` of ``np.load``, ``BM25`` of ``bm25s.BM25.load``."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def file_call(call: ast.Call) -> str | None:
    """What ``call`` is (``open``, ``np.load``, ``.read_text``...) when it opens a file, else None."""
    func = call.func
    if isinstance(func, ast.Name):
        return func.id if func.id in NAMES else None
    if not isinstance(func, ast.Attribute):
        return None
    receiver = _receiver(func.value)
    if receiver in BY_RECEIVER and func.attr in BY_RECEIVER[receiver]:
        return f"{receiver}.{func.attr}"
    return f".{func.attr}" if func.attr in ANY_RECEIVER else None


def _reason(lines: list[str], call: ast.Call) -> str:
    """The reason stated for ``call``: after the mark on one of its lines, or on a comment line just above."""
    candidates = lines[call.lineno - 1:call.end_lineno]
    above = lines[call.lineno - 2].strip() if call.lineno >= 2 else ""
    if above.startswith(MARK):
        candidates.append(above)
    for line in candidates:
        if MARK in line:
            return line.split(MARK, 1)[1].strip()
    return ""


def unexplained(source: str, where: str) -> list[str]:
    """``where:line: call`` for each file call in ``source`` without a stated reason (three words at least)."""
    lines = source.splitlines()
    found = []
    calls = sorted((n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Call)),
                   key=lambda n: (n.lineno, n.col_offset))
    for node in calls:
        if (what := file_call(node)) is not None:
            if len(_reason(lines, node).split()) < 3:
                found.append(f"{where}:{node.lineno}: {what}(...) opens a file outside trace_dspy/core/files.py "
                             f"without '{MARK} <reason>'")
    return found


def package_files() -> list[Path]:
    files = [p for top in SOURCES for p in sorted((ROOT / top).rglob("*.py"))]
    assert len(files) > 50 and any(p.name == "situations.py" for p in files), "the package's sources were not found"
    return files


# Each way of opening a file the audit must see (a sanity check of the audit itself, run before the scan).
OPENERS = (
    "open(path)", "open(path, 'rb')", "io.open(path)", "os.open(path, os.O_RDONLY)", "os.fdopen(fd, 'wb')",
    "Path(p).open('rb')", "path.read_text()", "path.read_bytes()", "path.write_text('x')", "np.load(path)",
    "numpy.load(path)", "json.load(fh)", "tomllib.load(fh)", "csv.reader(fh)", "csv.DictReader(fh)",
    "load_file(str(path))", "Tokenizer.from_file(str(path))", "bm25s.BM25.load(folder)",
    "shutil.copyfile(a, b)", "tempfile.mkstemp()", "zipfile.ZipFile(path)",
    "x = [line for line in open(path)]", "with open(path) as fh:\n    pass",
)
# Calls that state no reason (an empty or one-word reason, a mark too far above, a misspelt mark).
NO_REASON = ("open(path)  # file-audit:", "open(path)  # file-audit: fine",
             "# file-audit: a reason given here\n\nopen(path)", "open(path)  # file audit: a reason given here")
# Calls that open nothing.
HARMLESS = ("d = {}.copy()\nx = json.loads(s)\nHead.load(path)\nEmotionPrior.load(path, root=folder)\n"
            "data = read_bytes(path, max_bytes=10)\nwebsite = f.opener()\nre.compile('x').search('y')\n")


def check_the_audit() -> None:
    reason = "  # file-audit: a reason given here"
    for code in OPENERS:
        assert len(unexplained(code + "\n", "m.py")) == 1, f"the audit misses {code!r}"
        first, _, rest = code.partition("\n")
        assert unexplained(first + reason + ("\n" + rest if rest else "") + "\n", "m.py") == [], code
        assert unexplained(f"{reason.strip()}\n{code}\n", "m.py") == [], code
    for code in NO_REASON:
        assert len(unexplained(code + "\n", "m.py")) == 1, f"the audit takes {code!r} for a reason"
    assert unexplained(HARMLESS, "m.py") == []


def test_every_file_the_package_opens_goes_through_core_files_or_says_why():
    check_the_audit()
    problems = []
    for path in package_files():
        rel = path.relative_to(ROOT).as_posix()
        if rel not in EXEMPT:
            problems += unexplained(path.read_text(encoding="utf-8"), rel)
    assert not problems, "\n".join(problems)
