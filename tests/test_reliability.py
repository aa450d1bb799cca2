"""Reliability: model faults, bad input, kill -9, leaked secrets, damaged artifacts, threads.

Every model here is fake: ``FaultyEngine`` (trace_dspy.testing.fakes) injects
transport faults and broken replies at seeded rates, and the interruption
tests run the real commands in a subprocess with a slow fake model, then
SIGKILL them. docs/reference/reliability.md lists each fault with the test that covers it.
"""

from __future__ import annotations

import http.server
import json
import os
import pickle
import re
import secrets
import signal
import subprocess
import sys
import threading
import time
import types
from pathlib import Path
from typing import ClassVar

import dspy
import pytest
from dspy.utils.exceptions import DSPyError

import trace_dspy
import trace_dspy.lm.specs as lms_module
from trace_dspy import TraceProgram
from trace_dspy.core.jsonl import read_records
from trace_dspy.store.artifacts import ArtifactError, save_artifact, versions
from trace_dspy.testing.fakes import (
    FAULTS,
    FaultyEngine,
    ScriptedEngine,
    fake_lm,
    faulty_lm,
)
from trace_dspy.workflows.batch import respond_batch
from trace_dspy.workflows.evaluation import FailureRateExceeded, evaluate_program
from conftest import offline_workdir

TRANSPORT = {"timeout": 0.1, "server_error": 0.1, "rate_limit": 0.1}  # 30% retryable faults
# No sentence-embedding model to load: token-F1 similarity, and no emotion prior (its faults are not these).
FAST_METRIC = '[metric]\nsimilarity_kind = "token_f1"\n[program]\nprior_k = 0\n'


def echo(outputs, inputs):
    if "response" in outputs:
        return {"response": "heard: " + inputs["dialogue"].splitlines()[-1]}
    return {}


def examples(n):
    return [dspy.Example(dialogue=f"Speaker: I lost my keys at beach number {i}.", emotion="sad",
                         response="Oh no, did you find them?", sample_id=f"s{i}").with_inputs("dialogue")
            for i in range(n)]


def metric():
    from trace_dspy.optimize.metric import EmpathyMetric

    return EmpathyMetric(embedder=None)


def without_timing(rows):
    return [{k: v for k, v in r.items() if k != "seconds"} for r in rows]


@pytest.fixture
def sleeps(monkeypatch):
    """DSPy's retry backoff is recorded instead of slept."""
    from dspy.clients import execution

    record: list[float] = []

    class Clock:
        def __getattr__(self, name):
            return getattr(time, name)

        def sleep(self, seconds):
            record.append(seconds)

    monkeypatch.setattr(execution, "time", Clock())
    return record


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    offline_workdir(tmp_path, monkeypatch)
    (tmp_path / "fast.toml").write_text(FAST_METRIC)
    return tmp_path


def route_to(monkeypatch, engine):
    """Every LM a command builds runs on ``engine``, with the spec's num_retries."""
    monkeypatch.setattr(lms_module, "build_lm",
                        lambda spec: dspy.LM("fake/faulty", engine=engine, cache=False, num_retries=spec.num_retries))
    return engine


def lines_of(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


# ---------------------------------------------------------------- the fault-injecting engine


def test_faulty_engine_is_seeded_thread_independent_and_records_injections():
    def run(seed, threads):
        lm, engine = faulty_lm(dict.fromkeys(FAULTS, 0.1), seed=seed, num_retries=0)

        def one(i):
            try:
                with dspy.context(lm=lm):
                    TraceProgram()(dialogue=f"My plant {i} died.")
                return "ok"
            except DSPyError as exc:
                return type(exc).__name__

        if threads == 1:
            outcomes = [one(i) for i in range(40)]
        else:
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(threads) as pool:
                outcomes = list(pool.map(one, range(40)))
        return outcomes, engine

    first, engine = run(seed=1, threads=1)
    again, same = run(seed=1, threads=8)
    other, _ = run(seed=2, threads=1)
    assert first == again and sorted(engine.injected, key=repr) == sorted(same.injected, key=repr)
    assert first != other
    counts = engine.counts()
    assert set(counts) == set(FAULTS)  # every kind was injected at these rates
    assert {"LMTimeoutError", "LMServerError", "LMRateLimitError", "AdapterParseError", "ok"} <= set(first)
    assert engine.calls == same.calls > len(engine.injected)  # most calls pass through
    with pytest.raises(ValueError, match="sum to at most 1"):
        FaultyEngine(rates={"garbage": 0.7, "timeout": 0.7})
    with pytest.raises(ValueError, match="unknown fault"):
        FaultyEngine(rates={"meteor": 0.1})


@pytest.mark.parametrize(("fault", "error", "text"), [
    ("timeout", "LMTimeoutError", "timed out"),
    ("server_error", "LMServerError", "503"),
    ("rate_limit", "LMRateLimitError", "429"),
    ("garbage", "AdapterParseError", "LM Response"),
    ("truncated", "AdapterParseError", "[[ ## emo"),
    ("bad_label", "AdapterParseError", "hangry"),
])
def test_each_fault_surfaces_as_the_error_a_real_provider_would_give(sleeps, fault, error, text):
    lm, engine = faulty_lm({fault: 1.0}, num_retries=2)
    with pytest.raises(Exception) as info, dspy.context(lm=lm):
        TraceProgram()(dialogue="I failed my driving test again.")
    assert type(info.value).__name__ == error and text in str(info.value)
    assert {i.fault for i in engine.injected} == {fault}
    if fault in ("timeout", "server_error", "rate_limit"):
        assert engine.calls == 3 and sleeps == [1, 2]  # the first try and two retries, backing off
    else:  # a broken reply is not retried by the LM; the adapter's JSON fallback asks once more
        assert engine.calls == 2 and sleeps == []


def test_retries_back_off_exponentially_up_to_a_cap_and_honour_retry_after(sleeps):
    lm, engine = faulty_lm({"server_error": 1.0}, num_retries=8)
    with pytest.raises(Exception, match="503"), dspy.context(lm=lm):
        TraceProgram()(dialogue="hello")
    assert engine.calls == 9 and sleeps == [1, 2, 4, 8, 16, 32, 60, 60]
    sleeps.clear()
    lm, engine = faulty_lm({"rate_limit": 1.0}, num_retries=3, retry_after=0.25)
    with pytest.raises(Exception, match="429"), dspy.context(lm=lm):
        TraceProgram()(dialogue="hello")
    assert engine.calls == 4 and sleeps == [0.25] * 3  # the provider's Retry-After wins
    sleeps.clear()
    lm, engine = faulty_lm({"timeout": 1.0}, num_retries=0)
    with pytest.raises(Exception, match="timed out"), dspy.context(lm=lm):
        TraceProgram()(dialogue="hello")
    assert engine.calls == 1 and sleeps == []


# ---------------------------------------------------------------- model faults in evaluate and compile


def test_evaluate_rides_out_retryable_faults_and_counts_them_without_retries(workdir, monkeypatch, sleeps, capsys):
    from trace_dspy.cli.evaluate import main

    (workdir / "retry.toml").write_text(FAST_METRIC + "[lm]\nnum_retries = 5\n")
    engine = route_to(monkeypatch, FaultyEngine(ScriptedEngine(echo), rates=TRANSPORT, seed=3))
    argv = ["--limit", "16", "--threads", "4", "--no-mlflow", "--output-dir", "retry", "--config", "retry.toml"]
    assert main(argv) == 0
    summary = json.loads((workdir / "retry/summary.json").read_text())["summary"]
    assert summary["n"] == 16 and summary["failed"] == 0
    assert set(engine.counts()) == {"timeout", "server_error", "rate_limit"}
    assert engine.retried_prompts() > 0 and len(sleeps) == len(engine.injected) and max(sleeps) <= 60

    # The same faults with retries switched off: each failed example is recorded and counted.
    (workdir / "once.toml").write_text(FAST_METRIC + "[lm]\nnum_retries = 0\n")
    route_to(monkeypatch, FaultyEngine(ScriptedEngine(echo), rates=TRANSPORT, seed=3))
    assert main(["--limit", "16", "--threads", "4", "--no-mlflow", "--output-dir", "once", "--config", "once.toml",
                 "--max-failure-rate", "1"]) == 0
    rows = lines_of(workdir / "once/examples.jsonl")
    failed = [r for r in rows if "error" in r]
    summary = json.loads((workdir / "once/summary.json").read_text())["summary"]
    assert summary["failed"] == len(failed) > 0 and len(rows) == 16
    assert all(r["error"].split(":")[0] in ("LMTimeoutError", "LMServerError", "LMRateLimitError") for r in failed)
    assert "| failed | " + str(len(failed)) + " |" in capsys.readouterr().out


def test_broken_replies_fail_their_examples_and_a_rerun_redoes_only_those(tmp_path, sleeps):
    rows_path = tmp_path / "rows.jsonl"
    lm, engine = faulty_lm({"garbage": 0.04, "truncated": 0.04, "bad_label": 0.04}, seed=5, inner=ScriptedEngine(echo))
    result = evaluate_program(TraceProgram(), examples(16), metric(), lm=lm, threads=2, results_path=rows_path)
    failed = [r for r in result.rows if "error" in r]
    assert result.summary["failed"] == len(failed) and 0 < len(failed) < 16
    assert all(r["error"].startswith("AdapterParseError") and r["score"] == 0.0 for r in failed)
    assert set(engine.counts()) == {"garbage", "truncated", "bad_label"} and sleeps == []  # never retried
    healthy, clean = fake_lm(echo)
    again = evaluate_program(TraceProgram(), examples(16), metric(), lm=healthy, results_path=rows_path)
    assert len(clean.calls) == 4 * len(failed) and again.summary["failed"] == 0


def test_too_many_broken_replies_stop_evaluate_clearly_and_keep_the_rows(workdir, monkeypatch, capsys):
    from trace_dspy.cli.evaluate import main

    route_to(monkeypatch, FaultyEngine(ScriptedEngine(echo), rates={"garbage": 0.5}, seed=1))
    assert main(["--limit", "20", "--threads", "1", "--no-mlflow", "--output-dir", "out", "--config", "fast.toml"]) == 1
    err = capsys.readouterr().err
    assert "examples failed (more than 50%); stopping instead of reporting a misleading score" in err
    assert "First error: AdapterParseError" in err and "rerun to resume" in err
    rows = lines_of(workdir / "out/examples.jsonl")  # every line parses
    assert len(rows) >= 10 and not (workdir / "out/summary.json").exists()


def test_a_short_run_that_mostly_failed_reports_no_score(workdir, monkeypatch, capsys):
    # Below the early-stop minimum (10 examples) the finished run is judged as a whole.
    from trace_dspy.cli.evaluate import main

    route_to(monkeypatch, FaultyEngine(ScriptedEngine(echo), rates={"bad_label": 1.0}))
    assert main(["--limit", "4", "--no-mlflow", "--output-dir", "out", "--config", "fast.toml"]) == 1
    assert "4 of 4 examples failed" in capsys.readouterr().err
    assert not (workdir / "out/summary.json").exists()
    lm, _ = faulty_lm({"garbage": 1.0})
    with pytest.raises(FailureRateExceeded, match="3 of 3 examples failed"):
        evaluate_program(TraceProgram(), examples(3), metric(), lm=lm)
    assert evaluate_program(TraceProgram(), examples(3), metric(), lm=lm, max_failure_rate=None).summary["failed"] == 3


def test_compile_completes_under_faults_and_reports_the_failure_counts(workdir, monkeypatch, sleeps, capsys):
    from trace_dspy.cli.compile import main

    rates = {**TRANSPORT, "garbage": 0.03}
    engine = route_to(monkeypatch, FaultyEngine(ScriptedEngine(echo), rates=rates, seed=2))
    assert main(["--optimizer", "bootstrap", "--train", "6", "--dev", "12", "--no-mlflow", "--threads", "2",
                 "--config", "fast.toml"]) == 0
    manifest = json.loads((workdir / "artifacts/trace-dspy/v0001/manifest.json").read_text())
    for phase in ("dev_before", "dev_after"):
        rows = lines_of(workdir / f"artifacts/trace-dspy/v0001/{phase}.jsonl")
        assert manifest["scores"][phase]["failed"] == sum("error" in r for r in rows)
    assert manifest["scores"]["dev_before"]["failed"] + manifest["scores"]["dev_after"]["failed"] > 0
    assert "| failed |" in capsys.readouterr().out
    assert {"timeout", "server_error", "rate_limit", "garbage"} <= set(engine.counts()) and sleeps


def test_compile_stops_clearly_when_dev_or_the_optimizer_fails_too_often(workdir, monkeypatch, capsys):
    from trace_dspy.cli.compile import main

    route_to(monkeypatch, FaultyEngine(ScriptedEngine(echo), rates={"garbage": 0.6}, seed=1))
    assert main(["--optimizer", "labeled", "--train", "4", "--dev", "12", "--no-mlflow", "--config", "fast.toml"]) == 1
    err = capsys.readouterr().err
    assert "examples failed (more than 50%)" in err and "No artifact version was written" in err
    assert "rerun to resume" not in err  # compile's dev rows live in a temporary folder
    # Dev passes (lenient threshold), but BootstrapFewShot gives up after too many failed examples:
    # a one-line error, not a traceback.
    route_to(monkeypatch, FaultyEngine(ScriptedEngine(echo), rates={"garbage": 0.3}, seed=1))
    assert main(["--optimizer", "bootstrap", "--train", "30", "--dev", "4", "--max-failure-rate", "0.99",
                 "--no-mlflow", "--config", "fast.toml"]) == 1
    err = capsys.readouterr().err
    assert "the bootstrap optimizer stopped: AdapterParseError" in err and "No artifact version was written" in err
    assert versions("trace-dspy", workdir / "artifacts") == []


# ---------------------------------------------------------------- bad input through the commands


@pytest.mark.parametrize(("message", "reason"), [
    ("", "dialogue is empty"),
    (" \t  ", "dialogue is empty"),
    ("Speaker: \\nListener: hi\\nSpeaker: ok", "turn 1 (Speaker) is empty"),
    ("x" * 200_000, "the limit is"),
    ("I lost \udcff\udcfe my keys", "not valid UTF-8"),
])
def test_respond_refuses_unusable_messages_before_any_model_call(monkeypatch, capsys, message, reason):
    from trace_dspy.cli.respond import main

    lm, engine = fake_lm(echo)
    monkeypatch.setattr(lms_module, "build_lm", lambda spec: lm)
    assert main([message]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and reason in err and "Traceback" not in err
    assert engine.calls == []


RUNNER = """
import importlib, json, sys, time
import trace_dspy.lm.specs as lms
from trace_dspy.testing.fakes import ScriptedEngine, faulty_lm

opts = json.loads(sys.argv[1])
lm, engine = faulty_lm(latency=opts.get("latency", 0.0), inner=ScriptedEngine(answers={"response": "I hear you."}))
lms.build_lm = lambda spec: lm
if opts.get("stall_save"):  # hang inside save_artifact: files written, version not yet renamed into place
    import trace_dspy.store.artifacts as artifacts

    def stall(*args, **kwargs):
        open(opts["stall_save"], "w").close()
        time.sleep(600)

    artifacts.git_commit = stall
sys.exit(importlib.import_module("trace_dspy." + opts["command"]).main(sys.argv[2:]))
"""


def runner(tmp_path: Path, command: str, *args, **opts) -> list:
    script = tmp_path / "runner.py"
    script.write_text(RUNNER)
    return [sys.executable, str(script), json.dumps({"command": command, **opts}), *args]


def subprocess_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("TRACE_DSPY_DATA", "MLFLOW_TRACKING_URI")}
    (tmp_path / "tmp").mkdir(exist_ok=True)
    env.update(TMPDIR=str(tmp_path / "tmp"), TRACE_DSPY_ARTIFACTS=str(tmp_path / "artifacts"), **extra)
    return env


def test_invalid_utf8_from_the_command_line_or_stdin_is_a_clear_error(monkeypatch, capsys):
    import io

    from trace_dspy.cli.respond import main

    lm, engine = fake_lm(echo)
    monkeypatch.setattr(lms_module, "build_lm", lambda spec: lm)
    # Python hands undecodable argv bytes over as lone surrogates.
    assert main([os.fsdecode(b"I lost \xff\xfe my keys")]) == 2
    assert "not valid UTF-8" in capsys.readouterr().err
    # A strict stdin, as under many users' locales: reading it as text would raise mid-command.
    stdin = io.TextIOWrapper(io.BytesIO(b"Speaker: caf\xe9 closed\n"), encoding="utf-8", errors="strict")
    monkeypatch.setattr(sys, "stdin", stdin)
    assert main(["-"]) == 2
    assert "turn 1 (Speaker) is not valid UTF-8" in capsys.readouterr().err and engine.calls == []


def test_non_english_text_is_answered_and_kept_intact(tmp_path, monkeypatch, capsys):
    from trace_dspy.cli.respond import main

    lm, engine = fake_lm(echo)
    monkeypatch.setattr(lms_module, "build_lm", lambda spec: lm)
    messages = ["J'ai raté mon permis, encore une fois.", "试驾又没通过，我很难过。", "فقدت قطتي اليوم",
                "Я потерял ключи 🔑", "Ich habe die Prüfung bestanden! 🎉"]
    for text in messages:
        assert main([text]) == 0
        assert capsys.readouterr().out.strip() == f"heard: Speaker: {text}"
        assert engine.calls[-1].inputs["dialogue"] == f"Speaker: {text}"
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text("".join(json.dumps({"id": str(i), "turns": [t]}, ensure_ascii=False) + "\n"
                           for i, t in enumerate(messages)), encoding="utf-8")
    assert main(["--input", str(src), "--output", str(out)]) == 0
    assert [r["response"] for r in lines_of(out)] == [f"heard: Speaker: {t}" for t in messages]


def test_a_batch_survives_every_kind_of_bad_line_and_keeps_finished_ones(tmp_path, monkeypatch, capsys):
    from trace_dspy.cli.respond import main

    lm, engine = fake_lm(echo)
    monkeypatch.setattr(lms_module, "build_lm", lambda spec: lm)
    lines = [
        (json.dumps({"id": "first", "turns": ["I lost my keys."]}).encode(), None),
        (json.dumps({"id": "empty", "turns": []}).encode(), "dialogue is empty"),
        (json.dumps({"id": "blank", "dialogue": "  \t "}).encode(), "dialogue is empty"),
        (json.dumps({"id": "huge", "turns": ["y" * 200_000]}).encode(), "the limit is"),
        (b'{"id": "latin1", "turns": ["caf\xe9"]}', "not valid UTF-8"),
        (b'{"id": "surrogate", "turns": ["bad \\udcff escape"]}', "not valid UTF-8"),
        (json.dumps({"id": "nul", "dialogue": "bin\x00ary"}).encode(), "NUL"),
        (json.dumps({"id": "listener", "dialogue": "Speaker: hi\nListener: hello"}).encode(), "last turn"),
        (json.dumps({"id": "number", "turns": 42}).encode(), "string or a list"),
        (b"[1, 2, 3]", "expected a JSON object"),
        (bytes(range(256)).replace(b"\n", b""), "not valid UTF-8"),
        (json.dumps({"id": "tokyo", "turns": ["東京で財布をなくした。"]}, ensure_ascii=False).encode(), None),
        (json.dumps({"id": "last", "turns": ["My cat came home!"]}).encode(), None),
    ]
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_bytes(b"\n".join(raw for raw, _ in lines) + b"\n")
    assert main(["--input", str(src), "--output", str(out), "--threads", "3"]) == 1
    records = lines_of(out)
    assert len(records) == len(lines) and [r["line"] for r in records] == list(range(1, len(lines) + 1))
    for record, (_, reason) in zip(records, lines):
        if reason is None:
            assert record["response"].startswith("heard: "), record
        else:
            assert record["error"].startswith(f"{src}:{record['line']}: ") and reason in record["error"], record
    # Four stage calls per answered line: the shipped default (trace-dspy@v6) on this LM (not the embedded
    # model) is TRACE as published, one reply for the planner's plan.
    assert "3 answered now" in capsys.readouterr().err and len(engine.calls) == 3 * 4
    # A rerun keeps the answered lines and retries only the failed ones (which fail again, before any model call).
    before = out.read_text(encoding="utf-8")
    assert main(["--input", str(src), "--output", str(out)]) == 1
    assert out.read_text(encoding="utf-8") == before and len(engine.calls) == 3 * 4


@pytest.mark.parametrize("command", ["evaluate", "compile", "respond"])
def test_data_problems_are_one_line_errors_naming_file_and_line(workdir, monkeypatch, capsys, command):
    import importlib

    main = importlib.import_module(f"trace_dspy.{command}").main
    lm, engine = fake_lm(echo)
    monkeypatch.setattr(lms_module, "build_lm", lambda spec: lm)
    extra = {"evaluate": ["--no-mlflow"], "compile": ["--no-mlflow"], "respond": ["hello"]}[command]
    good = {"turns": ["I got the job!"], "emotion": "joyful", "reply": "Congratulations!"}
    (workdir / "bad.jsonl").write_text(json.dumps(good) + "\n" + json.dumps(good) + "\n{not json\n")
    (workdir / "latin1.jsonl").write_bytes(json.dumps(good).encode() + b'\n{"turns": ["caf\xe9"]}\n')
    cases = [(["--data", "nowhere"], "data path from --data does not exist: nowhere"),
             (["--data", "bad.jsonl"], "bad.jsonl:3: invalid JSON"),
             (["--data", "latin1.jsonl"], "latin1.jsonl:2: not valid UTF-8")]
    for flags, message in cases:
        assert main([*flags, *extra]) == 2, flags
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err, err
    monkeypatch.setenv("TRACE_DSPY_DATA", str(workdir / "gone"))
    # respond runs trace-dspy@latest, which retrieves from its own saved index; the uncompiled program needs the data.
    assert main(["--program", "default", *extra] if command == "respond" else extra) == 2
    assert "data path from TRACE_DSPY_DATA does not exist" in capsys.readouterr().err
    assert engine.calls == []


def test_respond_with_an_artifact_says_data_is_unused(workdir, monkeypatch, capsys):
    from trace_dspy.respond import main

    lm, engine = fake_lm(echo)
    monkeypatch.setattr(lms_module, "build_lm", lambda spec: lm)
    good = {"turns": ["I got the job!"], "emotion": "joyful", "reply": "Congratulations!"}
    other = {"turns": ["My cat is sick."], "emotion": "sad", "reply": "Oh no, I hope she gets better."}
    (workdir / "pool.jsonl").write_text(json.dumps(good) + "\n" + json.dumps(other) + "\n")
    assert main(["--program", "trace-dspy@v0002", "--data", "pool.jsonl", "hello"]) == 0
    err = capsys.readouterr().err
    assert "trace-dspy@v0002 retrieves exemplars from the index saved in it" in err and "pool.jsonl" in err
    assert engine.calls  # the reply was still made


# ---------------------------------------------------------------- kill -9


def kill_when(cmd: list, tmp_path: Path, ready, env=None) -> str:
    """Start ``cmd``, SIGKILL it once ``ready()`` holds while it still runs; returns its output."""
    log = tmp_path / "killed.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen(cmd, cwd=tmp_path, env=env or subprocess_env(tmp_path), stdout=fh,
                                stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 240  # a liveness guard, not a performance check
        while not ready():
            if proc.poll() is not None:
                pytest.fail(f"the command ended (rc={proc.returncode}) before the kill:\n{log.read_text()[-3000:]}")
            if time.monotonic() > deadline:
                pytest.fail(f"the command made no progress:\n{log.read_text()[-3000:]}")
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGKILL
    return log.read_text(errors="replace")


def complete_lines(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


def assert_valid_jsonl(path: Path) -> dict[str, dict]:
    """Every complete line parses; a torn last line (if any) is cut off by read_records."""
    data = path.read_bytes()
    complete, _, _torn = data.rpartition(b"\n")
    for line in complete.split(b"\n") if complete else []:
        json.loads(line)
    records = read_records(path)
    assert path.read_bytes() == (complete + b"\n" if complete else b"")  # only a torn tail is cut
    return records


def test_kill_9_during_a_batch_then_the_rerun_resumes(tmp_path, monkeypatch):
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text("".join(json.dumps({"id": f"d{i}", "turns": [f"Story {i}: my bike was stolen."]}) + "\n"
                           for i in range(40)))
    cmd = runner(tmp_path, "respond", "--input", str(src), "--output", str(out), "--threads", "2", latency=0.05)
    kill_when(cmd, tmp_path, lambda: complete_lines(out) >= 4)
    kept = assert_valid_jsonl(out)
    assert 4 <= len(kept) < 40 and all("response" in r for r in kept.values())
    lm, engine = fake_lm(echo)
    report = respond_batch(TraceProgram(), src, out, lm=lm)
    assert (report.total, report.skipped, report.failed) == (40, len(kept), 0)
    assert len(engine.calls) == 4 * (40 - len(kept))  # finished ids are not asked again
    final = lines_of(out)
    assert [r["id"] for r in final] == [f"d{i}" for i in range(40)]
    assert all(r["response"] == "I hear you." for r in final if r["id"] in kept)


def test_kill_9_during_evaluate_then_the_rerun_resumes(tmp_path, monkeypatch, capsys):
    from trace_dspy.cli.evaluate import main

    (tmp_path / "fast.toml").write_text(FAST_METRIC)
    argv = ["--limit", "20", "--threads", "1", "--no-mlflow", "--output-dir", "out", "--config", "fast.toml"]
    rows = tmp_path / "out/examples.jsonl"
    kill_when(runner(tmp_path, "evaluate", *argv, latency=0.05), tmp_path, lambda: complete_lines(rows) >= 3)
    kept = assert_valid_jsonl(rows)
    assert 3 <= len(kept) < 20 and not (tmp_path / "out/summary.json").exists()
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TRACE_DSPY_DATA", raising=False)
    lm, engine = fake_lm(echo)
    monkeypatch.setattr(lms_module, "build_lm", lambda spec: lm)
    assert main(argv) == 0
    assert len(engine.calls) == 4 * (20 - len(kept))
    final = lines_of(rows)
    assert len(final) == 20 and len({r["id"] for r in final}) == 20
    assert json.loads((tmp_path / "out/summary.json").read_text())["summary"]["n"] == 20


def test_kill_9_during_compile_leaves_no_version_and_the_rerun_is_gap_free(tmp_path, monkeypatch):
    from trace_dspy.cli.compile import main

    (tmp_path / "fast.toml").write_text(FAST_METRIC)
    lm, _ = fake_lm(echo)
    offline_workdir(tmp_path, monkeypatch, lm)
    argv = ["--optimizer", "labeled", "--train", "4", "--dev", "12", "--threads", "1", "--no-mlflow",
            "--config", "fast.toml"]
    assert main(argv) == 0  # v0001 exists before the killed runs
    folder = tmp_path / "artifacts/trace-dspy"

    # Killed while evaluating on dev: nothing reaches the artifact folder.
    def evaluating():
        return any(complete_lines(p) >= 2 for p in (tmp_path / "tmp").glob("trace-compile-*/dev_before.jsonl"))

    kill_when(runner(tmp_path, "compile", *argv, latency=0.05), tmp_path, evaluating)
    assert versions("trace-dspy", tmp_path / "artifacts") == [1] and not list(folder.glob(".tmp-*"))
    # Killed while saving: files are written, the version is not yet renamed into place.
    marker = tmp_path / "saving"
    kill_when(runner(tmp_path, "compile", *argv, stall_save=str(marker)), tmp_path, marker.exists)
    (stale,) = folder.glob(".tmp-*")  # the killed writer's private folder, never a version
    assert (stale / "program.json").is_file() and not (stale / "manifest.json").exists()
    assert versions("trace-dspy", tmp_path / "artifacts") == [1]
    # The rerun starts cleanly: the next number, no gap, the stale folder removed.
    assert main(argv) == 0
    assert versions("trace-dspy", tmp_path / "artifacts") == [1, 2] and not list(folder.glob(".tmp-*"))
    assert json.loads((folder / "v0002/manifest.json").read_text())["version"] == 2
    assert trace_dspy.load(str(folder / "v0002"), attach_lms=False)


# ---------------------------------------------------------------- secrets


class _ChatHandler(http.server.BaseHTTPRequestHandler):
    """An OpenAI-compatible chat endpoint answering from a ScriptedEngine; records each Authorization header."""

    engine = ScriptedEngine(echo)
    authorizations: ClassVar[list[str]] = []

    def do_POST(self):
        type(self).authorizations.append(self.headers.get("Authorization", ""))
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))

        def text(m):
            c = m.get("content") or ""
            return c if isinstance(c, str) else "".join(p.get("text", "") for p in c)

        request = types.SimpleNamespace(
            system="".join(text(m) for m in body["messages"] if m["role"] == "system"),
            messages=[types.SimpleNamespace(role=m["role"], text=text(m)) for m in body["messages"]
                      if m["role"] != "system"])
        reply = self.engine.complete(request).message.parts[0].text
        data = json.dumps({"id": "x", "object": "chat.completion", "created": 0, "model": body["model"],
                           "choices": [{"index": 0, "message": {"role": "assistant", "content": reply},
                                        "finish_reason": "stop"}],
                           "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


def test_api_keys_never_reach_artifacts_mlflow_or_logs(tmp_path):
    provider_key = "sk-" + secrets.token_hex(24)
    custom_key = "sk-" + secrets.token_hex(24)
    handler = type("Handler", (_ChatHandler,), {"authorizations": []})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    api_base = f"http://127.0.0.1:{server.server_port}/v1"
    # The default LM reads the key from the variable named by --api-key-env; the reply stage's
    # own LM (a different spec) reads the provider's usual OPENAI_API_KEY.
    (tmp_path / "c.toml").write_text(FAST_METRIC + f'[lm.stages.response]\nmodel = "openai/replier"\n'
                                                   f'api_base = "{api_base}"\n')
    env = subprocess_env(tmp_path, OPENAI_API_KEY=provider_key, TRACE_SECRET_KEY=custom_key,
                         DSPY_CACHEDIR=str(tmp_path / "dspy-cache"), TRACE_DSPY_CACHE=str(tmp_path / "index-cache"),
                         NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost")
    common = ["-v", "--config", "c.toml", "--lm", "openai/analyst", "--api-base", api_base,
              "--api-key-env", "TRACE_SECRET_KEY", "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}"]
    # Both commands in one process (one MLflow start-up, as the machine is small), as `python -m` runs them.
    driver = ("import importlib, json, sys\n"
              "for command, args in json.loads(sys.argv[1]):\n"
              "    rc = importlib.import_module('trace_dspy.' + command).main(args)\n"
              "    if rc:\n"
              "        sys.exit(rc)\n")
    commands = [["compile", ["--optimizer", "labeled", "--train", "4", "--dev", "3", *common]],
                ["evaluate", ["--limit", "3", "--output-dir", "evaluation", *common]]]
    try:
        run = subprocess.run([sys.executable, "-c", driver, json.dumps(commands)], capture_output=True, check=False,
                             env=env, cwd=tmp_path, timeout=300)
    finally:
        server.shutdown()
        server.server_close()
    (tmp_path / "commands.log").write_bytes(run.stdout + b"\n" + run.stderr)
    assert run.returncode == 0, run.stderr.decode()[-3000:]
    # Both ran and logged to MLflow: compile prints "mlflow run: ID; registered ...", evaluate
    # "mlflow evaluation run ID".
    assert b"mlflow run: " in run.stdout
    assert re.search(rb"^mlflow evaluation run [0-9a-f]{32}$", run.stdout, re.MULTILINE)
    # The keys were live: the server saw both.
    assert {f"Bearer {custom_key}", f"Bearer {provider_key}"} <= set(handler.authorizations)
    manifest = json.loads((tmp_path / "artifacts/trace-dspy/v0001/manifest.json").read_text())
    assert manifest["config"]["lm"]["default"]["api_key_env"] == "TRACE_SECRET_KEY"  # the name is recorded
    assert (tmp_path / "mlflow.db").is_file() and any((tmp_path / "mlruns").rglob("program.json"))
    leaks = []
    for path in tmp_path.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            for key in (provider_key, custom_key):
                for needle in (key, key[3:]):  # the key, or its random part in any wrapping
                    if needle.encode() in data:
                        leaks.append(str(path.relative_to(tmp_path)))
    assert not leaks, f"API key found in {sorted(set(leaks))}"


# ---------------------------------------------------------------- artifacts from outside


def _artifact(tmp_path: Path) -> Path:
    from trace_dspy import ProgramConfig

    return save_artifact(TraceProgram(), {"config": {"program": ProgramConfig().to_dict(), "lm": {}}},
                         name="a", root=tmp_path)


def _truncate(path: Path, keep: float) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


@pytest.mark.parametrize("name", ["program.json", "manifest.json"])
@pytest.mark.parametrize(("damage", "message"), [
    pytest.param(lambda p: _truncate(p, 0.5), "damaged or truncated JSON", id="half"),
    pytest.param(lambda p: _truncate(p, 0.98), "damaged or truncated JSON", id="last-bytes-missing"),
    pytest.param(lambda p: p.write_bytes(b""), "damaged or truncated JSON", id="empty"),
    pytest.param(lambda p: p.write_bytes(b"\x80\x04\x95 binary, not JSON"), "damaged or truncated JSON", id="binary"),
    pytest.param(lambda p: p.write_text("[1, 2]"), "expected a JSON object", id="not-an-object"),
])
def test_truncated_or_garbled_artifact_files_give_clear_errors(tmp_path, name, damage, message):
    folder = _artifact(tmp_path)
    damage(folder / name)
    with pytest.raises(ArtifactError, match=message) as info:
        trace_dspy.load(str(folder))
    assert name in str(info.value)


def test_damaged_artifacts_are_one_line_errors_in_the_commands(tmp_path, monkeypatch, capsys):
    from trace_dspy.cli.respond import main

    lm, engine = fake_lm(echo)
    monkeypatch.setattr(lms_module, "build_lm", lambda spec: lm)
    folder = _artifact(tmp_path)
    state = json.loads((folder / "program.json").read_text())
    state["generate_response"]["demos"] = "not a list"
    (folder / "program.json").write_text(json.dumps(state))
    assert main(["--program", str(folder), "hi"]) == 2
    assert "predictor 'generate_response' has no valid state" in capsys.readouterr().err
    _truncate(folder / "manifest.json", 0.6)
    assert main(["--program", str(folder), "hi"]) == 2
    err = capsys.readouterr().err
    assert "manifest.json: damaged or truncated JSON" in err and "Traceback" not in err and engine.calls == []


class _Trap:
    """Unpickling this writes a marker file: proof that a pickle was executed."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (Path(self.marker).write_text, ("unpickled",))


def test_a_pickle_is_never_loaded_even_when_it_is_all_there_is(tmp_path):
    folder = _artifact(tmp_path)
    marker = tmp_path / "marker"
    payload = pickle.dumps(_Trap(str(marker)))
    (folder / "program.pkl").write_bytes(payload)
    trace_dspy.load(str(folder))  # program.json is used; the pickle beside it is ignored
    (folder / "program.json").unlink()
    with pytest.raises(ArtifactError, match="program.json is missing"):
        trace_dspy.load(str(folder))
    with pytest.raises(ArtifactError):
        trace_dspy.load(str(folder / "program.pkl"))
    lone = tmp_path / "lone"
    lone.mkdir()
    (lone / "program.pkl").write_bytes(payload)
    with pytest.raises(ArtifactError, match="manifest.json is missing"):
        trace_dspy.load(str(lone))
    assert not marker.exists()


# ---------------------------------------------------------------- threads


def test_eight_threads_give_the_same_results_as_one_even_under_faults(workdir, monkeypatch, sleeps):
    from trace_dspy.cli.evaluate import main as evaluate
    from trace_dspy.cli.respond import main as respond

    rates = {**TRANSPORT, "garbage": 0.03, "bad_label": 0.03}
    src = workdir / "in.jsonl"
    src.write_text("".join(json.dumps({"id": f"d{i}", "turns": [f"Day {i}: my team lost the final."]}) + "\n"
                           for i in range(24)))
    respond_out, evaluate_rows = [], []
    for threads in ("1", "8"):
        route_to(monkeypatch, FaultyEngine(ScriptedEngine(echo), rates=rates, seed=4))
        respond(["--input", str(src), "--output", f"out{threads}.jsonl", "--threads", threads])
        respond_out.append((workdir / f"out{threads}.jsonl").read_text())
        route_to(monkeypatch, FaultyEngine(ScriptedEngine(echo), rates=rates, seed=4))
        assert evaluate(["--limit", "20", "--threads", threads, "--no-mlflow", "--output-dir", f"eval{threads}",
                         "--config", "fast.toml", "--max-failure-rate", "1"]) == 0
        rows = lines_of(workdir / f"eval{threads}/examples.jsonl")
        evaluate_rows.append(sorted(without_timing(rows), key=lambda r: r["id"]))
    assert respond_out[0] == respond_out[1] and '"error"' in respond_out[0]  # some lines failed, identically
    assert evaluate_rows[0] == evaluate_rows[1] and any("error" in r for r in evaluate_rows[0])
