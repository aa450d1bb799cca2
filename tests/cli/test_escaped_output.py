"""Text from an artifact, a model or a user never reaches the terminal raw, in text or in JSON output.

Each attack is planted as an adversary would: an artifact folder whose stage
instructions, demos and recorded command hold an OSC window-title sequence,
clear screen, colours, C1 CSI (U+009B) and bidirectional-text controls (a
right-to-left override makes ``gpj.exe`` read as ``exe.jpg``), shown by
``inspect``; a model whose reply holds the same, answered by ``respond`` (text,
``--show-stages``, ``--json``) and ``chat``; and the whole path in a real
process (a planted artifact whose recorded dspy version triggers a warning,
and a message that the model echoes). Every output must show these characters
as escapes, and JSON must still parse to the planted text.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import fake_every_lm


REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "artifacts" / "trace-dspy" / "v0006"

BIDI = "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c"
# An OSC window title (ESC ] 0; ... BEL), clear screen, a colour, C1 CSI and every bidi control.
HOSTILE = f"\x1b]0;owned\x07\x1b[2J\x1b[31mred\x1b[0m \x9b2J {BIDI} \u202egpj.exe\u202c"
DANGEROUS = ["\x1b", "\x07", "\x9b", *BIDI]


def raw_controls(text: str) -> list[str]:
    """The dangerous characters ``text`` holds raw."""
    return [c for c in DANGEROUS if c in text]


@pytest.fixture
def planted(tmp_path) -> Path:
    """A copy of the shipped artifact with hostile instructions, a hostile demo and a hostile command.
    A local artifact folder carries no file digests: editing its JSON is all that planting takes."""
    folder = tmp_path / "planted"
    shutil.copytree(SHIPPED, folder)
    state = json.loads((folder / "program.json").read_text(encoding="utf-8"))
    for name, entry in state.items():
        if name != "metadata":
            entry["signature"]["instructions"] = f"Write the reply. {HOSTILE}\nSecond line {HOSTILE}"
    state["generate_response"]["demos"] = [{"dialogue": f"Speaker: {HOSTILE}", "response": HOSTILE}]
    (folder / "program.json").write_text(json.dumps(state), encoding="utf-8")
    manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
    manifest["command"] = f"python -m trace_dspy.compile {HOSTILE}"
    (folder / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    return folder


def test_inspect_shows_a_planted_artifact_with_every_control_escaped(planted, capsys):
    from trace_dspy.cli.inspect_artifact import main

    assert main([str(planted)]) == 0
    text = capsys.readouterr()
    assert raw_controls(text.out + text.err) == [], text.out
    assert "\\x1b]0;owned\\x07" in text.out and "\\u202egpj.exe" in text.out  # shown, not obeyed
    assert main(["--json", str(planted)]) == 0
    shown = capsys.readouterr()
    assert raw_controls(shown.out + shown.err) == [], shown.out
    data = json.loads(shown.out)
    assert data["stages"]["generate_response"]["instructions"].endswith(HOSTILE)  # the same text once parsed
    assert data["command"].endswith(HOSTILE)


def test_inspect_diff_escapes_both_sides(planted, capsys):
    from trace_dspy.cli.inspect_artifact import main

    for argv in ([str(SHIPPED), str(planted)], ["--json", str(SHIPPED), str(planted)]):
        assert main(argv) == 0
        shown = capsys.readouterr()
        assert raw_controls(shown.out + shown.err) == [], shown.out
        assert "owned" in shown.out


def hostile_model(outputs, inputs):
    if "response" in outputs:
        return {"response": f"I hear you. {HOSTILE} That sounds hard."}
    if "cause" in outputs:
        return {"cause": HOSTILE}
    return {}


@pytest.fixture
def hostile_lm(monkeypatch):
    return fake_every_lm(monkeypatch, hostile_model)


@pytest.mark.parametrize("flags", [[], ["--show-stages"], ["--json"]])
def test_respond_prints_a_hostile_reply_escaped(hostile_lm, capsys, flags):
    from trace_dspy.cli.respond import main

    assert main([*flags, "I failed my driving test again."]) == 0
    shown = capsys.readouterr()
    assert hostile_lm.calls, "the model was not asked"
    assert raw_controls(shown.out + shown.err) == [], shown.out
    assert "owned" in shown.out
    if flags == ["--json"]:
        assert HOSTILE in json.loads(shown.out)["response"]  # JSON escapes: the same reply once parsed


def test_chat_prints_a_hostile_reply_and_echo_escaped(hostile_lm, capsys, monkeypatch):
    from trace_dspy.cli.chat import main

    monkeypatch.setattr(sys, "stdin", io.StringIO(f"My dog died.\n/stages\nStill sad {HOSTILE}\n/nope{HOSTILE}\n"))
    assert main([]) == 0
    shown = capsys.readouterr()
    assert raw_controls(shown.out + shown.err) == [], shown.out
    assert shown.out.count("trace> I hear you.") == 2 and "unknown command /nope" in shown.out


def test_a_real_run_on_a_planted_artifact_keeps_the_terminal_clean(planted, tmp_path):
    """The command as a user runs it: the artifact's recorded dspy version (quoted by a Python warning), the
    instructions, and a reply that echoes the message, all through the real output streams."""
    manifest = json.loads((planted / "manifest.json").read_text(encoding="utf-8"))
    manifest["packages"]["dspy"] = f"0.0.1{HOSTILE}"
    (planted / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(REPO), "TRACE_DSPY_ARTIFACTS": str(tmp_path / "none"),
           "PYTHONWARNINGS": "default"}
    env.pop("TRACE_DSPY_DATA", None)
    for flags in ([], ["--json"]):
        run = subprocess.run([sys.executable, str(REPO / "tests/fake_cli.py"), "trace_dspy.cli.respond",
                              "--program", str(planted), *flags, f"Speaker: my file {HOSTILE}"],
                             cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False)
        assert run.returncode == 0, run.stderr[-3000:]
        assert raw_controls(run.stdout + run.stderr) == [], (run.stdout, run.stderr[-2000:])
        assert "owned" in run.stdout
        assert "0.0.1\\x1b]0;owned" in run.stderr  # the drift warning, escaped


# A flag as a user might paste it: controls and bidi overrides, no space (argparse takes an argument with a
# space in it for a positional one).
HOSTILE_FLAG = "--bogus\x1b]0;owned\x07\x1b[2J\x9b2J\u202egpj.exe"


@pytest.mark.parametrize("name", ["respond", "chat", "compile", "evaluate", "inspect", "fit_prior", "fit_empathy",
                                  "fit_relevance", "fit_tone", "metric_validity", "bench", "bench_local"])
def test_a_flag_the_user_typed_is_echoed_escaped_in_the_usage_error(name, capsys):
    """argparse quotes what the user typed ("unrecognized arguments: ...", "invalid choice: ..."): the commands'
    parser sends its usage, help and error lines through the console, escaped."""
    from trace_dspy.cli.main import main

    assert main([name, HOSTILE_FLAG]) == 2
    err = capsys.readouterr().err
    assert err.strip() and not raw_controls(err), raw_controls(err)
    if name == "respond":  # the flag itself is quoted, escaped
        assert "unrecognized arguments: --bogus\\x1b]0;owned\\x07" in err, err
