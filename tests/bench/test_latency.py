"""The latency bench with tiny scripts in place of respond and the raw model: its record, its ratios, the
competing processes, the load-average refusal and a run that times out."""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import sys

import pytest

from trace_dspy.bench import latency
from trace_dspy.bench.latency import (
    EVERYDAY,
    BusyMachine,
    Commands,
    LatencyBench,
    LatencyOptions,
    chat_messages,
    cold_messages,
    latency_markdown,
    read_dialogues,
)
from trace_dspy.bench.processes import run_process
from trace_dspy.cli.bench import main
from trace_dspy.core import env

PY = sys.executable
QUIET = (0.1, 0.2, 0.3)

# respond MESSAGE [PIDFILE]: a reply on stdout; "broken" exits 3; "slow" notes its pid and sleeps past any timeout
RESPOND = """\
import sys, time
message = sys.argv[1]
print("fake respond: " + message, file=sys.stderr, flush=True)
if "broken" in message:
    sys.exit(3)
if "slow" in message:
    with open(sys.argv[2], "a") as fh:
        fh.write(f"{__import__('os').getpid()}\\n")
    time.sleep(30)
print("reply to " + message)
"""
BATCH = """\
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
with open(sys.argv[2], "w") as out:
    for row in rows:
        out.write(json.dumps({"id": row["id"], "response": "batch reply to " + row["turns"][-1]}) + "\\n")
"""
RAW = """\
import json, sys
print(json.dumps(["raw reply to " + chat[-1]["content"] for chat in json.load(open(sys.argv[1]))]))
"""


class FakeCommands(Commands):
    """Tiny scripts for respond, the batch, the raw model; a sleeping process as the competitor (no CPU used)."""

    def __init__(self, options: LatencyOptions, pidfile):
        super().__init__(options)
        self.pidfile = str(pidfile)

    def respond(self, message):
        return [PY, "-c", RESPOND, message, self.pidfile]

    def respond_batch(self, input_path, output_path):
        return [PY, "-c", BATCH, str(input_path), str(output_path)]

    def raw_settings(self):
        return {"model_path": "fake.gguf", "n_threads": 2, "n_ctx": 16, "max_tokens": 64, "temperature": 0}

    def raw(self, chats_path, settings):
        return [PY, "-c", RAW, str(chats_path)]

    def hog(self):
        return [PY, "-c", "import time; time.sleep(60)"]


@pytest.fixture(autouse=True)
def quiet_machine(monkeypatch, tmp_path):
    """A quiet machine and an empty cache folder of the test's own."""
    monkeypatch.setattr(os, "getloadavg", lambda: QUIET)
    monkeypatch.setenv(env.CACHE, str(tmp_path / "user-cache"))


def scripted_seconds(bench: LatencyBench):
    """Runs each command for real, then reports a scripted wall time: cold 3, 1, 2 s; the batch 10 s, the raw
    model 4 s; a contended run 2 s plus one per competing process alive while it ran."""
    cold = iter([3.0, 1.0, 2.0])

    def runner(argv, *, env, timeout):
        done = run_process(argv, env=env, timeout=timeout)
        if argv[2] == BATCH:
            seconds = 10.0
        elif argv[2] == RAW:
            seconds = 4.0
        elif argv[3] not in cold_messages(3):  # the contention phase's message (and the warm-up's)
            seconds = 2.0 + sum(p.poll() is None for p in bench.hogs)
        else:
            seconds = next(cold)
        return dataclasses.replace(done, seconds=seconds)

    return runner


def make_bench(tmp_path, **options) -> LatencyBench:
    opts = LatencyOptions(settle=0.0, **options)
    return LatencyBench(opts, FakeCommands(opts, tmp_path / "pids"), log=lambda line: None)


def test_the_record_has_every_phase_with_its_commands_replies_and_ratios(tmp_path):
    snapshots = []
    bench = make_bench(tmp_path)
    bench.runner = scripted_seconds(bench)
    bench.on_update = lambda result: snapshots.append(json.loads(json.dumps(result)))
    result = bench.run()

    assert result["phases"] == ["cold", "anchor", "contention"] and result["failures"] == []
    assert result["load_at_start"] == list(QUIET) and not result["forced"]
    cold = result["cold"]
    assert [r["seconds"] for r in cold["runs"]] == [3.0, 1.0, 2.0] and cold["median_s"] == 2.0
    assert len({r["message"] for r in cold["runs"]}) == 3 and cold["trace_cache"] == "user"
    dspy_dirs = [r["env"]["DSPY_CACHEDIR"] for r in cold["runs"]]
    assert len(set(dspy_dirs)) == 3 and all(r["command"].startswith("DSPY_CACHEDIR=") for r in cold["runs"])
    assert all(r["trace_cache"]["dir"] == str(tmp_path / "user-cache") for r in cold["runs"])
    assert cold["runs"][0]["stdout"] == "reply to " + cold["runs"][0]["message"]
    assert all(len(r["load_before"]) == 3 for r in cold["runs"])

    anchor = result["anchor"]
    turns = read_dialogues(EVERYDAY)
    assert anchor["dialogues"] == turns and len(turns) == 8
    assert anchor["program"]["seconds"] == 10.0 and anchor["raw"]["seconds"] == 4.0 and anchor["ratio"] == 2.5
    assert anchor["program"]["replies"] == ["batch reply to " + t[-1] for t in turns]
    assert anchor["raw"]["replies"] == ["raw reply to " + t[-1] for t in turns]
    assert anchor["program"]["command"].endswith("anchor-output.jsonl")
    assert anchor["raw"]["settings"]["n_threads"] == 2 and anchor["raw"]["chats"][0][0]["role"] == "user"

    contention = result["contention"]
    assert len(contention["runs"]) == 9  # three rounds of quiet, 1 and 3 competing
    assert [r["competing_alive_after"] for r in contention["runs"]] == [0, 1, 3] * 3
    assert [(c["competing"], c["median_s"], c["ratio_to_quiet"]) for c in contention["conditions"]] == [
        (0, 2.0, 1.0), (1, 3.0, 1.5), (3, 5.0, 2.5)]
    assert len(bench.hogs) == 12 and all(p.poll() is not None for p in bench.hogs)

    # the cache folder was empty: one unmeasured respond filled it before the anchor (outside every phase)
    assert result["warmup"]["ok"] and result["warmup"]["trace_cache"]["empty"]
    assert snapshots[1]["cold"]["runs"] and "anchor" not in snapshots[1]  # the record grows run by run
    table = latency_markdown(result)
    assert "| anchor | respond --input, 8 dialogues, one process | 10.00 | 2.50 |" in table
    assert "| contention | 3 competing, median of 3 of 3 | 5.00 | 2.50 |" in table


def test_cold_cache_gives_every_cold_run_a_new_empty_cache_folder(tmp_path):
    result = make_bench(tmp_path, phases=("cold",), repeats=2, cold_cache=True).run()
    runs = result["cold"]["runs"]
    folders = [r["env"][env.CACHE] for r in runs]
    assert result["cold"]["trace_cache"] == "fresh" and len(set(folders)) == 2
    assert all(r["trace_cache"]["empty"] and r["trace_cache"]["dir"] == f for r, f in zip(runs, folders))
    assert all(r["ok"] and r["seconds"] > 0 for r in runs) and "warmup" not in result


def test_competing_processes_are_killed_when_the_measured_command_fails(tmp_path):
    bench = make_bench(tmp_path, phases=("contention",), repeats=1, message="broken", competing=(2,))
    result = bench.run()
    assert [f["phase"] for f in result["failures"]] == ["contention", "contention"]
    assert result["failures"][0]["reason"] == "exit code 3" and "fake respond: broken" in result["failures"][0][
        "stderr_tail"]
    assert [c["ratio_to_quiet"] for c in result["contention"]["conditions"]] == [None, None]
    assert len(bench.hogs) == 2 and all(p.poll() is not None for p in bench.hogs)


def test_competing_processes_are_killed_on_ctrl_c_and_the_record_keeps_earlier_runs(tmp_path):
    snapshots = []

    def interrupted(bench):
        def runner(argv, *, env, timeout):
            if bench.hogs:
                raise KeyboardInterrupt
            return run_process(argv, env=env, timeout=timeout)
        return runner

    bench = make_bench(tmp_path, phases=("cold", "contention"), repeats=1, competing=(3,))
    bench.runner = interrupted(bench)
    bench.on_update = lambda result: snapshots.append(json.loads(json.dumps(result)))
    with pytest.raises(KeyboardInterrupt):
        bench.run()
    assert len(bench.hogs) == 3 and all(p.poll() is not None for p in bench.hogs)
    assert snapshots[-1]["cold"]["runs"][0]["ok"] and len(snapshots[-1]["contention"]["runs"]) == 1


def test_a_busy_machine_is_refused_unless_forced(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(os, "getloadavg", lambda: (2.0, 1.0, 0.5))
    out = tmp_path / "out"
    assert main(["latency", "--output-dir", str(out), "--no-mlflow"]) == 2
    err = capsys.readouterr().err
    assert "load average is 2.00, above --max-load 0.5" in err and "--force" in err
    assert not (out / "latency.json").exists()
    with pytest.raises(BusyMachine):
        make_bench(tmp_path, phases=("cold",), repeats=1, max_load=1.5).run()
    assert make_bench(tmp_path, phases=("cold",), repeats=1, max_load=2.5).run()["busy_at_start"] is False
    result = make_bench(tmp_path, phases=("cold",), repeats=1, force=True).run()
    assert result["forced"] and result["load_at_start"] == [2.0, 1.0, 0.5] and result["cold"]["runs"][0]["ok"]
    assert "measured with --force" in latency_markdown(result)


def test_a_timed_out_run_is_killed_and_reported_and_the_other_phases_are_kept(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(latency, "default_commands", lambda options: FakeCommands(options, tmp_path / "pids"))
    out = tmp_path / "out"
    argv = ["latency", "--output-dir", str(out), "--no-mlflow", "--timeout", "2", "--message", "slow please",
            "--competing", "1", "--repeats", "1", "--program", "trace-dspy@v6"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "2 run(s) failed" in err and "contention, 0 competing, round 1: timed out after 2 s" in err
    record = json.loads((out / "latency.json").read_text())
    assert record["command"] == "python -m trace_dspy.bench " + shlex.join(argv) and record["machine"]["cpus"]
    result = record["result"]
    assert result["cold"]["median_s"] > 0 and result["anchor"]["ratio"] > 0
    failures = result["failures"]
    assert [f["phase"] for f in failures] == ["contention", "contention"]
    assert all(f["stderr_tail"].strip() == "fake respond: slow please" for f in failures)
    runs = result["contention"]["runs"]
    assert all(r["timed_out"] and not r["ok"] and 2 <= r["seconds"] < 10 for r in runs)
    assert result["contention"]["conditions"][1]["ratio_to_quiet"] is None
    for pid in map(int, (tmp_path / "pids").read_text().split()):
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert "FAILED contention, 1 competing, round 1" in (out / "latency.md").read_text()


def test_the_real_command_lines():
    options = LatencyOptions(program="trace-dspy@v6", config="my.toml")
    commands = Commands(options, python="py")
    assert commands.respond("I lost my keys.") == ["py", "-m", "trace_dspy.respond", "--program", "trace-dspy@v6",
                                                   "--config", "my.toml", "I lost my keys."]
    assert commands.respond("-oops")[-2:] == ["--", "-oops"]
    assert commands.respond_batch("in.jsonl", "out.jsonl")[-4:] == ["--input", "in.jsonl", "--output", "out.jsonl"]
    settings = {"model_path": "m.gguf", "n_threads": 2, "n_ctx": 4096, "max_tokens": 64}
    raw = commands.raw("chats.json", settings)
    assert raw[:2] == ["py", "-c"] and raw[3:] == ["m.gguf", "2", "4096", "64", "chats.json"]
    compile(raw[2], "raw", "exec")
    assert "create_chat_completion(messages=messages, max_tokens=max_tokens, temperature=0)" in raw[2]
    assert commands.hog() == ["py", "-c", "while True: pass"]


def test_dialogues_chats_and_messages(tmp_path):
    assert [m["role"] for m in chat_messages(["a", "b", "c"])] == ["user", "assistant", "user"]
    assert len(set(cold_messages(12))) == 12
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"turns": ["fine"]}\n{"dialogue": "no turns"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: expected"):
        read_dialogues(bad)
    assert read_dialogues(bad, count=1) == [["fine"]]
