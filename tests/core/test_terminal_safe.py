"""Terminal-safe output: what the escaping functions escape, and that no command can print around them.

``terminal_safe`` (text) and ``json_safe_dumps`` (JSON) must turn every
character that can drive a terminal or reorder what it shows into a visible
escape: C0 and C1 controls (ESC, CSI U+009B) and the bidirectional-text
controls (a right-to-left override makes ``gpj.exe`` read as ``exe.jpg``),
while ordinary text such as ``café`` or emoji stays readable. The audit reads
every module of the package: only ``trace_dspy/core/console.py`` (whose output
functions escape) may write to stdout or stderr, so no caller can bypass the
escaping; a line that must write raw says why in a ``# raw output: REASON``
comment.
"""

from __future__ import annotations

import ast
import io
import json
import logging
import sys
import time
from pathlib import Path

import pytest

from trace_dspy.core import console
from trace_dspy.core.safety import terminal_safe

PACKAGE = Path(__file__).resolve().parents[2] / "trace_dspy"
CONSOLE = PACKAGE / "core" / "console.py"
RAW_OUTPUT = "# raw output:"

BIDI = ["\u202a", "\u202b", "\u202c", "\u202d", "\u202e", "\u2066", "\u2067", "\u2068", "\u2069",
        "\u200e", "\u200f", "\u061c"]
# What an attacker plants: an OSC window title, clear screen, a colour, C1 CSI, DEL and each bidi control.
HOSTILE = "\x1b]0;owned\x07\x1b[2J\x1b[31mred\x9b2J\x7f" + "".join(BIDI) + "gpj.exe"
DANGEROUS = ["\x1b", "\x07", "\x9b", "\x7f", *BIDI]


def _raw(text: str) -> list[str]:
    return [c for c in DANGEROUS if c in text]


def test_terminal_safe_escapes_controls_and_bidi_controls_and_keeps_readable_text():
    shown = terminal_safe(HOSTILE + "\tcafé 🙂\nnext line")
    assert _raw(shown) == [], shown
    assert "\\x1b]0;owned\\x07" in shown and "\\x9b2J" in shown
    assert "\\u202e" in shown and "\\u2066" in shown and "\\u200f" in shown and "\\u061c" in shown
    assert shown.endswith("\tcafé 🙂\nnext line")  # tab, newline, accents and emoji stay as they are
    assert terminal_safe(shown) == shown  # escaping twice changes nothing


def test_json_safe_dumps_is_the_same_data_harmless_on_a_terminal_and_readable():
    from trace_dspy.core.safety import json_safe_dumps

    value = {"instructions": HOSTILE, "reply": "café 🙂", HOSTILE: [1, "\u202e"]}
    text = json_safe_dumps(value, indent=2)
    assert _raw(text) == [], text
    assert "\\u009b" in text and "\\u202e" in text and "\\u001b" in text
    assert "café 🙂" in text  # not \\u00e9: normal non-ASCII text stays readable
    assert json.loads(text) == value


def test_every_console_output_escapes(capsys):
    console.out(HOSTILE)
    console.say(HOSTILE)
    console.out_json({"a": HOSTILE}, indent=2)
    stream = io.StringIO()
    console.status_line(HOSTILE, stream)
    with console.Progress(HOSTILE, total=2, stream=stream, terminal=False, interval=0.01) as phase:
        phase.note(HOSTILE)
        phase.update(1)
        deadline = time.monotonic() + 10
        while phase.lines == 0 and time.monotonic() < deadline:  # the timer's plain line
            time.sleep(0.01)
    assert phase.lines >= 2  # the timer's line and the closing one
    captured = capsys.readouterr()
    for text in (captured.out, captured.err, stream.getvalue().replace("\r\x1b[K", "", 1)):
        assert _raw(text) == [], text


def test_log_lines_and_warnings_escape_what_they_quote(capsys):
    import warnings

    saved_factory, saved_show = logging.getLogRecordFactory(), warnings.showwarning
    try:
        console.escape_logs_and_warnings()
        try:
            raise ValueError(HOSTILE)
        except ValueError:
            record = logging.getLogger("dspy").makeRecord("dspy", logging.WARNING, __file__, 1, "reply was %s",
                                                          (HOSTILE,), sys.exc_info())
        assert _raw(logging.Formatter("%(message)s").format(record)) == []  # the message and the traceback
        warnings.showwarning(HOSTILE, UserWarning, __file__, 1)
        assert _raw(capsys.readouterr().err) == []
    finally:
        logging.setLogRecordFactory(saved_factory)
        warnings.showwarning = saved_show


# ---------------------------------------------------------------- the audit

_STREAMS = {"stdout", "stderr", "__stdout__", "__stderr__"}


def _dotted(node: ast.AST) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    return ".".join(reversed(parts))


def _bypass(node: ast.AST) -> str | None:
    """What ``node`` writes to the terminal around the console module, or None."""
    if isinstance(node, ast.Name) and node.id == "print":
        return "print"
    if isinstance(node, ast.Call):
        name = _dotted(node.func)
        head, _, method = name.rpartition(".")
        if method in ("write", "writelines") and head.split(".")[:2] in (["sys", s] for s in _STREAMS):
            return name
        if name in ("os.write", "tqdm.write") or name.endswith("tqdm.write"):
            return name
    return None


def _bypasses(path: Path, root: Path = PACKAGE.parent) -> list[str]:
    source = path.read_text(encoding="utf-8")
    lines = source.splitlines()
    found = []
    for node in ast.walk(ast.parse(source)):
        what = _bypass(node)
        if what is None:
            continue
        # The hatch: on a line of the call, or on a comment line just above it.
        here = [*lines[node.lineno - 1:getattr(node, "end_lineno", node.lineno)]]
        if node.lineno > 1 and lines[node.lineno - 2].lstrip().startswith("#"):
            here.append(lines[node.lineno - 2])
        reasons = [line.split(RAW_OUTPUT, 1)[1].strip() for line in here if RAW_OUTPUT in line]
        if not any(reasons):
            found.append(f"{path.relative_to(root)}:{node.lineno}: {what}")
    return found


def test_the_audit_sees_each_way_around_the_console(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("import os, sys\nprint('x')\nlog = print\nsys.stdout.write('x')\nsys.stderr.buffer.write(b'x')\n"
                      "os.write(2, b'x')\nsys.stdout.write('x')  # raw output: a test of the hatch\n"
                      "sys.stderr.write('x')  # raw output:\n")
    hits = sorted(_bypasses(sample, tmp_path), key=lambda hit: int(hit.split(":")[1]))
    # the hatch needs a reason: the last line has none
    assert [hit.split(":", 1)[1] for hit in hits] == [
        "2: print", "3: print", "4: sys.stdout.write", "5: sys.stderr.buffer.write", "6: os.write",
        "8: sys.stderr.write"]


@pytest.mark.parametrize("folder", ["cli", "core", "inspect", "store", "workflows", "bench", "program", "data",
                                    "lm", "."])
def test_no_module_writes_to_the_terminal_around_the_console(folder):
    files = sorted(PACKAGE.glob("*.py")) if folder == "." else sorted((PACKAGE / folder).rglob("*.py"))
    assert files
    found = [hit for path in files if path != CONSOLE for hit in _bypasses(path)]
    assert found == [], ("write through trace_dspy.core.console (out, out_json, say, status_line), which "
                         "escapes what it shows, or say why not with '# raw output: REASON':\n" + "\n".join(found))
