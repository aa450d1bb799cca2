"""Progress bars: drawn on a terminal, absent from pipes and files (DSPy's own bars included)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pexpect

FAKE_CLI = Path(__file__).resolve().parents[1] / "fake_cli.py"
# What any tqdm bar leaves in a stream: "50%|#####     | 1/2 [00:00<00:00, 3.1it/s]".
BAR = re.compile(r"\d+%\||\d+/\d+ \[\d\d:\d\d|it/s\]|s/it\]")


def fake_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("TRACE_DSPY_DATA", "MLFLOW_TRACKING_URI")}
    env["TRACE_DSPY_ARTIFACTS"] = str(tmp_path / "artifacts")
    return env


def write_dialogues(path: Path, n: int) -> None:
    path.write_text("".join(json.dumps({"id": str(i), "turns": [f"I lost my keys, day {i}."]}) + "\n"
                            for i in range(n)))


def test_no_bar_reaches_a_pipe(tmp_path):
    """respond --input and compile (whose default optimizer draws DSPy's own bar) write no bar to pipes."""
    write_dialogues(tmp_path / "in.jsonl", 3)
    config = tmp_path / "fast.toml"
    config.write_text('[metric]\nsimilarity_kind = "token_f1"\n')
    commands = [
        ["trace_dspy.cli.respond", "--input", "in.jsonl", "--output", "out.jsonl"],
        ["trace_dspy.cli.compile", "--optimizer", "bootstrap", "--train", "3", "--dev", "2", "--threads", "1",
         "--no-mlflow", "--config", str(config)],
    ]
    for argv in commands:
        run = subprocess.run([sys.executable, str(FAKE_CLI), *argv], capture_output=True, text=True, cwd=tmp_path,
                             env=fake_env(tmp_path), timeout=300, check=False)
        assert run.returncode == 0, run.stderr
        assert not BAR.search(run.stderr) and not BAR.search(run.stdout), (argv[0], run.stderr)
    assert len((tmp_path / "out.jsonl").read_text().splitlines()) == 3
    assert (tmp_path / "artifacts/trace-dspy/v0001/manifest.json").is_file()  # compile really ran its steps


def test_a_bar_is_drawn_on_a_terminal(tmp_path):
    write_dialogues(tmp_path / "in.jsonl", 3)
    child = pexpect.spawn(sys.executable, [str(FAKE_CLI), "trace_dspy.cli.respond", "--input", "in.jsonl", "--output",
                                           "out.jsonl"], cwd=str(tmp_path), env=fake_env(tmp_path),
                          encoding="utf-8", timeout=120, dimensions=(24, 120))
    child.expect(r"respond: 100%\|.*\| 3/3")
    child.expect("3 dialogues: 3 answered now")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
