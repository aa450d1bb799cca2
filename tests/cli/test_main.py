"""The ``trace-dspy`` console script: every command is a subcommand, called directly, imported only when chosen."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from trace_dspy.cli.main import COMMANDS, main

REPO = Path(__file__).resolve().parents[2]
CLI = REPO / "trace_dspy" / "cli"
ALL = ("respond", "chat", "compile", "evaluate", "inspect", "fit_prior", "fit_empathy", "fit_relevance",
       "fit_tone", "metric_validity", "bench", "bench_local")


def _command_modules() -> set[str]:
    """The modules of trace_dspy/cli that define a top-level ``main`` (the dispatcher aside), read, not imported."""
    found = set()
    for path in CLI.glob("*.py"):
        tree = ast.parse(path.read_text())
        if path.stem != "main" and any(isinstance(node, ast.FunctionDef) and node.name == "main"
                                       for node in tree.body):
            found.add(path.stem)
    return found


def test_every_command_module_is_a_subcommand_with_a_launcher():
    assert set(ALL) <= set(COMMANDS)
    assert {module for module, _ in COMMANDS.values()} == _command_modules()
    for name, (_, what) in COMMANDS.items():
        assert what and "\n" not in what
        assert importlib.util.find_spec(f"trace_dspy.{name}") is not None, f"python -m trace_dspy.{name} is missing"


@pytest.mark.parametrize("name", ALL)
def test_a_subcommands_usage_names_the_console_script(name, capsys):
    assert main([name, "--help"]) == 0
    assert capsys.readouterr().out.startswith(f"usage: trace-dspy {name} ")
    command = importlib.import_module(f"trace_dspy.cli.{COMMANDS[name][0]}")
    with pytest.raises(SystemExit) as done:  # as ``python -m trace_dspy.NAME`` runs it
        command.main(["--help"])
    assert done.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: python -m trace_dspy.{name} ")


def test_a_usage_error_is_the_exit_code(capsys):
    assert main(["fit_tone", "--bogus"]) == 2
    err = capsys.readouterr().err
    assert "usage: trace-dspy fit_tone" in err and "unrecognized arguments: --bogus" in err
    assert main(["bench", "embedded", "--bogus"]) == 2
    assert "usage: trace-dspy bench embedded" in capsys.readouterr().err


PROBE = """
import json, sys
from trace_dspy.cli.main import main
def commands():
    return sorted(m for m in sys.modules if m.startswith("trace_dspy.cli.") and m != "trace_dspy.cli.main")
main(["--help"])
before = commands()
code = main(["fit_tone", "--help"])
print(json.dumps({"before": before, "after": commands(), "code": code}))
"""


def test_the_dispatcher_imports_only_the_chosen_command():
    run = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert run.returncode == 0, run.stderr
    seen = json.loads(run.stdout.splitlines()[-1])
    assert seen["before"] == []
    assert seen["code"] == 0
    assert set(seen["after"]) == {"trace_dspy.cli.fit_tone", "trace_dspy.cli.common"}


def test_the_dispatcher_runs_as_a_module():
    run = subprocess.run([sys.executable, "-m", "trace_dspy.cli.main", "inspect", "--help"], capture_output=True,
                         text=True, timeout=300, cwd=REPO)
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("usage: trace-dspy inspect ")
