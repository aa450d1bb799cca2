"""Every code block in README.md runs as written, and .ci/run runs the README's test command.

How each block is covered (a block in any other language fails until a check is added here):
- ``python``: executed as written in a temporary working directory, with every model replaced by one
  scripted fake (``dspy.LM`` and the project's LM builder both return it); the block must call it.
- ``bash`` and ``console`` (a console block's commands are its ``$`` lines): each command is checked by
  its own tool. ``python -m trace_dspy.<command>`` and ``trace-dspy <command>`` run for real on the fake in
  a temporary directory; ``pip install`` may name only extras that pyproject.toml declares; ``mlflow ui``
  is parsed by MLflow's own CLI, and each variable set before it must be one its program reads.

Exemptions, and only these: the test command itself (``python -m pytest ...``, which .ci/run runs; the
first test below checks they are the same), and the commands of a block preceded by the line
``<!-- readme-test: long run -->``: those are parsed by the command's real argument parser, so a wrong
flag still fails, but not run (a compile or a 100-item evaluation takes minutes).
"""

from __future__ import annotations

import argparse
import io
import os
import re
import runpy
import shlex
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path

import dspy
import pytest

from trace_dspy.testing.fakes import fake_lm

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()
LONG_RUN = "<!-- readme-test: long run -->"
TEST_COMMAND = ("python", "-m", "pytest")
VENV_ACTIVATE = ".venv/bin/activate"


@dataclass(frozen=True)
class Block:
    lang: str
    text: str
    line: int
    long_run: bool


def _blocks(text: str) -> list[Block]:
    blocks, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        match = re.match(r"^```(\S*)\s*$", lines[i])
        if not match:
            i += 1
            continue
        end = lines.index("```", i + 1)
        previous = next((line for line in reversed(lines[:i]) if line.strip()), "")
        blocks.append(Block(match.group(1), "\n".join(lines[i + 1:end]), i + 1, previous.strip() == LONG_RUN))
        i = end + 1
    return blocks


BLOCKS = _blocks(README)


def _commands(block: Block) -> list[list[str]]:
    """The simple commands of a shell block: continuations joined, comments dropped, split on ``&&``."""
    lines = block.text.splitlines()
    if block.lang == "console":  # only the prompt lines (and their continuations) are commands
        kept, going_on = [], False
        for line in lines:
            if line.startswith("$ ") or going_on:
                kept.append(line.removeprefix("$ "))
                going_on = line.endswith("\\")
        lines = kept
    joined = "\n".join(lines).replace("\\\n", " ")
    commands = []
    for line in joined.splitlines():
        words = shlex.split(line, comments=True)
        while words:
            cut = words.index("&&") if "&&" in words else len(words)
            commands.append(words[:cut])
            words = words[cut + 1:]
    return commands


def _split_env(words: list[str]) -> tuple[dict[str, str], list[str]]:
    env = {}
    while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):
        name, value = words[0].split("=", 1)
        env[name] = value
        words = words[1:]
    return env, words


def test_the_readme_has_code_blocks_of_every_kind_checked_here():
    assert {b.lang for b in BLOCKS} == {"bash", "console", "python"}, [(b.line, b.lang) for b in BLOCKS]


def test_ci_runs_the_readme_test_command():
    ci = (REPO / ".ci/run").read_text()
    setup = [line for line in README.splitlines() if line.startswith("pip install -e") and "pytest" in line]
    assert len(setup) == 1, "README needs exactly one install-and-test command"
    test_command = setup[0].split("&&", 1)[1].strip()
    assert test_command.startswith("python -m pytest")
    ci_commands = [line.strip() for line in ci.splitlines() if "pytest" in line and not line.lstrip().startswith("#")]
    assert ci_commands == [test_command]


def test_ci_installs_every_extra():
    import tomllib

    extras = set(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    ci = (REPO / ".ci/run").read_text()
    installed = ci.split('pip install -q -e ".[', 1)[1].split("]", 1)[0].split(",")
    assert set(installed) == extras


# ---------------------------------------------------------------- running blocks on a fake model


@pytest.fixture
def fake_everywhere(tmp_path, monkeypatch):
    """Every model the README can reach is one scripted fake; the working directory is a fresh one."""
    from conftest import offline_workdir

    lm, engine = fake_lm()
    offline_workdir(tmp_path, monkeypatch, lm)
    monkeypatch.setattr(dspy, "LM", lambda *args, **kwargs: lm)
    return engine


class _Parsed(Exception):
    pass


def _run_project_command(words: list[str], *, run: bool, monkeypatch) -> str:
    """``python -m trace_dspy.X ARGS`` or ``trace-dspy X ARGS``: parse (and, with ``run``, run) in-process."""
    if words[:2] == ["python", "-m"] and words[2].startswith("trace_dspy."):
        module, argv = words[2], words[3:]
    elif words[0] == "trace-dspy":
        module, argv = f"trace_dspy.{words[1]}", words[2:]
    else:
        raise AssertionError(f"not a trace-dspy command: {shlex.join(words)}")
    monkeypatch.setattr(sys, "argv", [module, *argv])

    def main() -> int:  # what ``python -m`` does with the module
        try:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        except SystemExit as done:
            return done.code or 0
        except _Parsed:
            raise
        return 0

    if not run:
        original = argparse.ArgumentParser.parse_args

        def parse_then_stop(self, args=None, namespace=None):
            original(self, args, namespace)
            raise _Parsed

        monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_then_stop)
        stderr = io.StringIO()
        try:
            with redirect_stderr(stderr):
                code = main()  # returns only when the parser refused the arguments, or no parser ran
        except _Parsed:
            return ""
        finally:
            monkeypatch.setattr(argparse.ArgumentParser, "parse_args", original)
        pytest.fail(f"{shlex.join(words)}: not accepted by its argument parser (exit {code}): {stderr.getvalue()[-500:]}")
    out = io.StringIO()
    with redirect_stdout(out):
        code = main()
    assert code == 0, f"{shlex.join(words)} exited {code}:\n{out.getvalue()}"
    return out.getvalue()


def _check_pip(words: list[str]) -> None:
    import tomllib

    extras = set(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    assert words[:3] == ["pip", "install", "-e"], words
    named = re.fullmatch(r"\.\[([\w,-]+)\]", words[3])
    assert named, f"install the checkout with extras: {words}"
    assert set(named.group(1).split(",")) <= extras, named.group(1)


def _check_mlflow(env: dict[str, str], words: list[str]) -> None:
    import click
    import mlflow.environment_variables
    from mlflow.cli import cli

    command = cli.get_command(click.Context(cli), words[1])
    assert command is not None, f"mlflow has no command {words[1]!r}"
    command.make_context(words[1], words[2:])  # a wrong option raises click's UsageError
    for variable, value in env.items():
        if variable.startswith("MLFLOW_"):
            assert hasattr(mlflow.environment_variables, variable), variable
        elif variable.startswith("LITELLM_"):
            import importlib.util

            package = Path(importlib.util.find_spec("litellm").origin).parent
            assert variable in (package / "litellm_core_utils/get_model_cost_map.py").read_text(), variable
        elif variable == "PYTHONWARNINGS":
            _check_warning_filter(value)
        else:
            raise AssertionError(f"no check for the variable {variable} set before mlflow")


# Imports starlette's deprecated module with every warning recorded, then replays each warning through
# the filters PYTHONWARNINGS set: it must warn, and the README's filter must hide it.
_WARNING_PROBE = """
import warnings
configured = list(warnings.filters)
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    import starlette.middleware.wsgi
with warnings.catch_warnings(record=True) as shown:
    warnings.filters[:] = configured
    for w in seen:
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, module="mlflow.server", registry={})
print(len(seen), len(shown))
"""


def _check_warning_filter(value: str) -> None:
    env = {**os.environ, "PYTHONWARNINGS": value}
    done = subprocess.run([sys.executable, "-c", _WARNING_PROBE], env=env, capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0 and "Invalid -W option" not in done.stderr, done.stderr
    seen, shown = map(int, done.stdout.split())
    assert seen >= 1, "starlette no longer warns here: drop PYTHONWARNINGS from the README"
    assert shown == 0, f"PYTHONWARNINGS={value!r} does not hide starlette's warning"


def _check_shell_command(words: list[str], block: Block, monkeypatch) -> str:
    env, words = _split_env(words)
    if tuple(words[:3]) == TEST_COMMAND:
        return ""  # exempt: .ci/run runs it (test_ci_runs_the_readme_test_command)
    if tuple(words[:3]) == ("python", "-m", "venv"):
        assert not env and words[3:] == [VENV_ACTIVATE.split("/")[0]], words  # the folder activated below
        return ""  # .ci/run makes its environment the same way
    if words[0] in (".", "source"):
        assert words[1:] == [VENV_ACTIVATE], f"README.md:{block.line}: only the venv's activation is sourced"
        return ""
    if words[0] == "pip":
        assert not env
        _check_pip(words)
        return ""
    if words[0] == "mlflow":
        _check_mlflow(env, words)
        return ""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return _run_project_command(words, run=not block.long_run, monkeypatch=monkeypatch)


# What only the compact writer prints (its reply race and candidates' rewards).
COMPACT_ONLY = ("reply_plans", "reply_rewards")


def _stage_names(console_output: str) -> list[str]:
    return [line.split()[0] for line in console_output.splitlines() if line and not line.startswith((" ", "$"))]


@pytest.mark.parametrize("block", BLOCKS, ids=[f"line{b.line}-{b.lang}" for b in BLOCKS])
def test_every_readme_block_runs_as_written(block, fake_everywhere, monkeypatch):
    if block.lang == "python":
        before = len(fake_everywhere.calls)
        with redirect_stdout(io.StringIO()):
            exec(compile(block.text, f"README.md:{block.line}", "exec"), {"__name__": "__readme__"})  # noqa: S102 (the README's own code)
        assert len(fake_everywhere.calls) > before, "the block never called the model"
        return
    assert block.lang in ("bash", "console"), f"README.md:{block.line}: no check for {block.lang!r} blocks"
    commands = _commands(block)
    assert commands, f"README.md:{block.line}: a shell block without a command"
    for words in commands:
        printed = _check_shell_command(words, block, monkeypatch)
        if block.lang == "console" and "--show-stages" in words:
            # The pasted output (a real run on the embedded model) lists the stages this command prints; the fake
            # LM is not the embedded model, so the standard writer runs here and prints no reply race.
            pasted = [name for name in _stage_names(block.text) if name not in COMPACT_ONLY]
            assert pasted == _stage_names(printed)
