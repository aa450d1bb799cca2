"""The README's compile, evaluate and respond commands, run as a user runs them (subprocesses, a fake
OpenAI-compatible server instead of a model), print no Python warning, no DEBUG line and no traceback."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from conftest import echo_reply
from trace_dspy.testing.fakes import ScriptedEngine
from trace_dspy.testing.server import FakeChatServer

pytestmark = pytest.mark.slow

NOISE = re.compile(r"Warning|DEBUG|Traceback")


def test_the_readme_commands_keep_the_terminal_quiet(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRACE_DSPY_", "MLFLOW_"))}
    env["FAKE_QUIET_KEY"] = "unused"
    with FakeChatServer(engine=ScriptedEngine(responder=echo_reply)) as server:
        lm = ["--lm", "openai/fake", "--api-base", server.api_base, "--api-key-env", "FAKE_QUIET_KEY"]
        commands = [
            ["compile", "--train", "4", "--dev", "3", "--val", "2", *lm],
            ["evaluate", "--program", "trace-dspy@latest", "--split", "test", "--limit", "4", "--view", "trace", *lm],
            ["respond", "My dog died yesterday.", *lm],
        ]
        for argv in commands:
            run = subprocess.run([sys.executable, "-m", f"trace_dspy.{argv[0]}", *argv[1:]], cwd=tmp_path, env=env,
                                 capture_output=True, text=True, timeout=600, check=False)
            assert run.returncode == 0, run.stderr[-3000:]
            noisy = [line for line in run.stderr.splitlines() if NOISE.search(line)]
            assert noisy == [], (argv[0], noisy)
            # DSPy's optimizers print their progress (from their constructors on); only -v shows it.
            assert "Will attempt to bootstrap" not in run.stdout + run.stderr, argv[0]
    assert "dog died yesterday" in run.stdout  # the reply itself reached stdout
