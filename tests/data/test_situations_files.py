"""The situations file and the data CSVs are read as every other file is: checked, bounded, UTF-8 by line.

A FIFO named by ``--situations`` or ``TRACE_DSPY_SITUATIONS`` blocked its reader forever (even ``respond
--program default``, which reads the variable), and ``/dev/zero`` was read as one endless line until
``MemoryError``. Both are refused at once now, naming the file. A spreadsheet's CSV (a UTF-8 byte-order mark
first) is read, and bytes that are not UTF-8 are reported on their own line, not on the header's.

The FIFO and device tests run the reader or the command in a subprocess with a timeout and a memory bound,
so that a regression fails them instead of hanging the suite or filling the machine's memory.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trace_dspy.data.ed_csv import read_ed_csv
from trace_dspy.data.epitome import FILES, EpitomeError, load_epitome
from trace_dspy.data.samples import DataError
from trace_dspy.data.situations import SITUATIONS_ENV, read_situations

REPO = Path(__file__).resolve().parents[2]
SEED = REPO / "trace_dspy/data/seed/seed_dialogues.jsonl"
HANG_TIMEOUT = 60  # a child still running after this long hangs
QUICK = 2.0  # seconds a refusal may take, once the reader is imported

# Runs resolve_situations(argv[1], or None for "-") with its memory bounded to 256 MiB past what the imports
# took, and prints the outcome as JSON: what was raised, its message, how long the call took.
READER = """
import json, os, resource, sys, time
from trace_dspy.data.samples import DataError
from trace_dspy.data.situations import resolve_situations
with open("/proc/self/statm") as fh:
    used = int(fh.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
resource.setrlimit(resource.RLIMIT_AS, (used + 256 * 1024 * 1024, resource.getrlimit(resource.RLIMIT_AS)[1]))
started = time.monotonic()
try:
    resolve_situations(None if sys.argv[1] == "-" else sys.argv[1])
    out = {"raised": None, "message": ""}
except BaseException as exc:
    out = {"raised": type(exc).__name__, "message": str(exc)[:500]}
out["seconds"] = time.monotonic() - started
print(json.dumps(out))
"""


def child_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "TRACE_DSPY_ARTIFACTS": str(tmp_path / "no-artifacts"),
           "TRACE_DSPY_CACHE": str(tmp_path / "cache"), "DSPY_CACHEDIR": str(tmp_path / "dspy-cache"), **extra}
    for name in ("TRACE_DSPY_DATA", SITUATIONS_ENV):
        if name not in extra:
            env.pop(name, None)
    return env


def run_child(argv: list[str], tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(argv, cwd=tmp_path, env=child_env(tmp_path, **env), capture_output=True, text=True,
                              timeout=HANG_TIMEOUT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{' '.join(argv[-4:])} did not return within {HANG_TIMEOUT} s (it hangs on the file)")


def read_in_child(tmp_path: Path, path: Path, *, via_env: bool) -> dict:
    """The outcome of resolve_situations on ``path`` (the flag's value, or the environment variable's)."""
    proc = run_child([sys.executable, "-c", READER, "-" if via_env else str(path)], tmp_path,
                     **({SITUATIONS_ENV: str(path)} if via_env else {}))
    assert proc.returncode == 0 and proc.stdout.strip(), proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("via_env", [False, True], ids=["--situations", SITUATIONS_ENV])
def test_a_fifo_is_refused_at_once_naming_it(tmp_path, via_env):
    fifo = tmp_path / "situations.csv"
    os.mkfifo(fifo)
    out = read_in_child(tmp_path, fifo, via_env=via_env)
    assert out["raised"] == "DataError" and out["message"].startswith(f"{fifo}: ") and "FIFO" in out["message"], out
    assert out["seconds"] < QUICK, out


@pytest.mark.parametrize("command", ["fit_prior --situations", f"respond --program default with {SITUATIONS_ENV}"])
def test_commands_given_a_fifo_stop_with_one_line_and_exit_2(tmp_path, command):
    fifo = tmp_path / "situations.csv"
    os.mkfifo(fifo)
    if command.startswith("fit_prior"):
        argv = [sys.executable, "-m", "trace_dspy.fit_prior", "--data", str(SEED), "--situations", str(fifo),
                "--output", str(tmp_path / "prior.npz")]
        proc = run_child(argv, tmp_path)
    else:
        argv = [sys.executable, str(REPO / "tests/fake_cli.py"), "trace_dspy.cli.respond", "--program", "default",
                "I lost my keys today."]
        proc = run_child(argv, tmp_path, **{SITUATIONS_ENV: str(fifo)})
    err = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and err and err[-1].startswith(f"error: {fifo}: ") and "FIFO" in err[-1], proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "prior.npz").exists()


def test_a_link_to_dev_zero_is_refused_without_reading_it(tmp_path):
    link = tmp_path / "situations.csv"
    link.symlink_to("/dev/zero")
    out = read_in_child(tmp_path, link, via_env=False)
    assert out["raised"] == "DataError" and out["message"].startswith(f"{link}: "), out
    assert "character device" in out["message"] and out["seconds"] < QUICK, out


@pytest.mark.parametrize("kind", ["situations", "ed-csv"])
def test_a_csv_a_spreadsheet_saved_with_a_byte_order_mark_is_read(tmp_path, kind):
    bom = b"\xef\xbb\xbf"
    if kind == "situations":
        path = write(tmp_path / "s.csv", bom + b"situation,emotion\r\nMy dog died,sad\r\nI won,proud\r\n")
        read = read_situations(path)
        assert read.texts == ("My dog died", "I won") and read.labels == ("sad", "proud")
    else:
        path = write(tmp_path / "valid.csv", bom + b"dialogue_id,turns,text,dialogue_emotion\r\n"
                     b"d1,1,My dog died.,sad\r\nd1,2,I am so sorry.,sad\r\n")
        (sample,) = read_ed_csv(path)
        assert sample.turns == ("My dog died.",) and sample.response == "I am so sorry." and sample.emotion == "sad"


def _bad_epitome(tmp_path: Path, line2: bytes) -> Path:
    folder = tmp_path / "epitome"
    folder.mkdir()
    for name in FILES.values():
        write(folder / name, b"sp_id,rp_id,seeker_post,response_post,level,rationales\n" + line2
              + b"s2,r2,fine,fine,0,\n")
    return folder


@pytest.mark.parametrize("kind", ["situations", "ed-csv", "epitome"])
def test_bytes_that_are_not_utf8_are_reported_on_their_own_line(tmp_path, kind):
    bad = b"caf\xe9 au lait"  # Latin-1, as a spreadsheet may save it
    if kind == "situations":
        path = write(tmp_path / "s.csv", b"situation,emotion\n" + bad + b",sad\nI won,proud\n")
        with pytest.raises(DataError) as info:
            read_situations(path)
        where = re.escape(f"{path}:2: ")
    elif kind == "ed-csv":
        path = write(tmp_path / "valid.csv", b"dialogue_id,turns,text,dialogue_emotion\nd1,1," + bad
                     + b",sad\nd1,2,I am sorry.,sad\n")
        with pytest.raises(DataError) as info:
            read_ed_csv(path)
        where = re.escape(f"{path}:2: ")
    else:
        folder = _bad_epitome(tmp_path, b"s1,r1," + bad + b",ok,1,\n")
        with pytest.raises(EpitomeError) as info:
            load_epitome(folder)
        where = re.escape(f"{folder}/") + r"[a-z-]+\.csv:2: "
    message = str(info.value)
    assert re.match(where + "not valid UTF-8", message) and "\n" not in message, message
