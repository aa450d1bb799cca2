"""Trust boundaries and no lost work.

Each attack is built here: tampered artifacts, planted versions, hostile
batch files, replayed failures, hung and credentialed servers, Ctrl-C,
escape sequences. Models are fakes: ScriptedEngine, and FakeChatServer (an
OpenAI-compatible server on 127.0.0.1). docs/reference/reliability.md lists every case
with its test.
"""

from __future__ import annotations

import http.server
import json
import logging
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import dspy
import pytest

import trace_dspy
import trace_dspy.lm.specs as lms_module
from trace_dspy import ProgramConfig, TraceProgram
from trace_dspy.lm.specs import LMConfig, LMSpec, TraceLM
from trace_dspy.store.artifacts import ArtifactError, save_artifact
from trace_dspy.testing.fakes import ScriptedEngine, fake_lm
from trace_dspy.testing.server import FakeChatServer
from trace_dspy.workflows.batch import BatchError, respond_batch

REPO = Path(__file__).resolve().parents[1]
NO_PRIOR = {**ProgramConfig(prior_k=0).to_dict()}


def echo(outputs, inputs):
    if "response" in outputs:
        return {"response": "heard: " + inputs["dialogue"].splitlines()[-1]}
    return {}


def artifact(root: Path, lm: dict | None = None, name: str = "trace-dspy") -> Path:
    # Dev scores that make it the program respond and chat run by default (not worse than uncompiled).
    scores = {"dev_before": {"empathy": 0.5}, "dev_after": {"empathy": 0.6, "collapsed": False}}
    return save_artifact(TraceProgram(ProgramConfig(prior_k=0)),
                         {"config": {"program": NO_PRIOR, "lm": lm or {}}, "scores": scores}, name=name, root=root)


def edit_json(path: Path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


@pytest.fixture
def no_cache_isolation():
    """DSPy's memory cache on for one test (the suite runs with it off), emptied before and after."""
    dspy.configure_cache(enable_disk_cache=False, enable_memory_cache=True)
    dspy.cache.reset_memory_cache()
    yield
    dspy.cache.reset_memory_cache()
    dspy.configure_cache(enable_disk_cache=False, enable_memory_cache=False)


# ---------------------------------------------------------------- 1. artifacts cannot redirect credentials


def test_an_artifact_that_names_an_endpoint_or_key_is_refused_and_nothing_is_sent(tmp_path, monkeypatch, capsys):
    key = "sk-" + secrets.token_hex(16)
    monkeypatch.setenv("VICTIM_KEY", key)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    with FakeChatServer(latency=0) as attacker:
        planted = artifact(tmp_path, {"default": {"model": "openai/gpt-4o-mini", "api_base": attacker.api_base,
                                                  "api_key_env": "VICTIM_KEY"}})
        with pytest.raises(ArtifactError) as info:
            trace_dspy.load(str(planted))
        err = info.value
        assert err.file.endswith("manifest.json") and err.field == "config.lm"
        assert attacker.api_base in err.reason and "$VICTIM_KEY" in err.reason and "--trust-artifact-lm" in err.reason
        from trace_dspy.cli.respond import main as respond

        assert respond(["--program", str(planted), "I lost my job today."]) == 2
        out = capsys.readouterr().err
        assert "--trust-artifact-lm" in out and "Traceback" not in out
        # A planted newer version in the folder `chat` reads by default is refused the same way.
        monkeypatch.chdir(tmp_path)
        monkeypatch.setenv("TRACE_DSPY_ARTIFACTS", str(tmp_path))
        monkeypatch.setattr("sys.stdin", open(os.devnull))
        from trace_dspy.cli.chat import main as chat

        assert chat([]) == 2 and "--trust-artifact-lm" in capsys.readouterr().err
        assert attacker.requests == 0 and attacker.authorizations == []
        # Opting in (you made the artifact) uses the recorded endpoint, with the key it names.
        program = trace_dspy.load(str(planted), trust_lm=True)
        assert program(dialogue="I lost my job today.").response
        assert attacker.requests >= 4 and set(attacker.authorizations) == {f"Bearer {key}"}


def test_an_endpoint_chosen_by_the_user_replaces_the_recorded_one(tmp_path, monkeypatch):
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    with FakeChatServer(latency=0) as recorded, FakeChatServer(latency=0) as mine:
        planted = artifact(tmp_path, {"default": {"model": "openai/fake", "api_base": recorded.api_base}})
        config = LMConfig(default=LMSpec(model="openai/fake", api_base=mine.api_base, cache=False))
        monkeypatch.setenv("OPENAI_API_KEY", "unused-key-value")
        program = trace_dspy.load(str(planted), lm_config=config)
        assert program(dialogue="My exam went well!").response
        assert recorded.requests == 0 and mine.requests >= 4
    # An artifact that names only a model is fine: it says what it was compiled for.
    plain = artifact(tmp_path, {"default": {"model": "openai/gpt-4o-mini"}}, name="plain")
    assert trace_dspy.load(str(plain), attach_lms=False)


def test_every_artifact_file_is_checked_field_by_field(tmp_path):
    def fresh():
        return artifact(tmp_path / secrets.token_hex(4))

    cases = [
        ("manifest.json", lambda m: m.update(predictors="generate_response"), "predictors", "expected list"),
        ("manifest.json", lambda m: m.update(config=["program"]), "config", "expected object"),
        ("manifest.json", lambda m: m.update(version="one"), "version", "expected integer"),
        ("manifest.json", lambda m: m.update(version=True), "version", "expected integer"),
        ("manifest.json", lambda m: m["config"].update(lm="local"), "config.lm", "expected object"),
        ("manifest.json", lambda m: m.update(packages={"dspy": 3.4}), "packages.dspy", "expected text"),
        ("manifest.json", lambda m: m.update(emotion_prior={"file": ["x"]}), "emotion_prior.file", "expected text"),
        ("program.json", lambda s: s["generate_response"].update(demos=["just a string"]),
         "generate_response.demos[0]", "a demo must be an object"),
        ("program.json", lambda s: s["generate_response"].update(demos=[{"dialogue": {"nested": 1}}]),
         "generate_response.demos[0].dialogue", "expected text"),
        ("program.json", lambda s: s["generate_response"].update(demos=[{"dialogue": "x"}] * 65),
         "generate_response.demos", "more than the 64 allowed"),
        ("program.json", lambda s: s["analyze_cause"]["signature"].update(instructions=42),
         "analyze_cause.signature.instructions", "expected text"),
    ]
    for name, damage, field, reason in cases:
        folder = fresh()
        edit_json(folder / name, damage)
        with pytest.raises(ArtifactError) as info:
            trace_dspy.load(str(folder), attach_lms=False)
        assert (info.value.file, info.value.field) == (str(folder / name), field), (field, str(info.value))
        assert reason in info.value.reason
    # Deeply nested JSON is one clear error, not a RecursionError.
    folder = fresh()
    (folder / "manifest.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ArtifactError, match="nested more than 64 levels"):
        trace_dspy.load(str(folder))


def test_a_damaged_retrieval_index_names_its_file(tmp_path):
    from trace_dspy.data.retrieval import ExemplarIndex, RetrievalConfig
    from trace_dspy.data.sources import load_splits, resolve_source

    index = ExemplarIndex.build(load_splits(resolve_source(None, announce_seed=False)).train[:20], RetrievalConfig())

    def with_index(damage):
        folder = artifact(tmp_path / secrets.token_hex(4))
        index.save(folder / "index")
        edit_json(folder / "manifest.json", lambda m: m.update(retrieval={"index": "index"}))
        damage(folder / "index")
        return folder

    cases = [
        (lambda d: (d / "items.json").write_text('{"version": 1, "items": [1, 2]'), "items.json", "damaged"),
        (lambda d: edit_json(d / "items.json", lambda x: x["items"].pop()), "bm25", "num_docs"),
        (lambda d: edit_json(d / "items.json", lambda x: x["items"][0].update(response=None)), "items.json",
         "items[0]: response must be text"),
        (lambda d: (d / "bm25" / "params.index.json").write_text("{ not json"), "bm25", "damaged"),
        (lambda d: (d / "bm25" / "data.csc.index.npy").write_bytes(b"\x93NUMPY garbage"), "bm25", "damaged"),
    ]
    for damage, where, reason in cases:
        folder = with_index(damage)
        with pytest.raises(ArtifactError) as info:
            trace_dspy.load(str(folder), attach_lms=False)
        assert where in str(info.value) and reason in str(info.value), str(info.value)


def test_a_version_folder_that_is_a_symlink_is_refused(tmp_path):
    root = tmp_path / "artifacts"
    artifact(root)
    elsewhere = artifact(tmp_path / "elsewhere")
    (root / "trace-dspy" / "v0002").symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(ArtifactError, match="symbolic link") as info:
        trace_dspy.load("trace-dspy@latest", root=root, attach_lms=False)
    assert info.value.file.endswith("v0002")
    # Loading that folder by its own path is the user's explicit choice.
    assert trace_dspy.load(str(elsewhere), attach_lms=False)


# ---------------------------------------------------------------- 2. batch files only grow in knowledge


def batch_file(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def test_duplicate_ids_given_or_generated_are_refused_before_any_model_call(tmp_path):
    lm, engine = fake_lm(echo)
    out = tmp_path / "out.jsonl"
    for records, named in [
        ([{"id": "a", "turns": ["one"]}, {"id": "b", "turns": ["two"]}, {"id": "a", "turns": ["three"]}],
         "'a' (lines 1 and 3)"),
        # An explicit id that equals a generated one: line 2 has no id, so it is "line-2".
        ([{"id": "line-2", "turns": ["one"]}, {"turns": ["two"]}], "'line-2' (lines 1 and 2)"),
    ]:
        src = batch_file(tmp_path / "in.jsonl", records)
        with pytest.raises(BatchError, match="ids must be unique") as info:
            respond_batch(TraceProgram(ProgramConfig(prior_k=0)), src, out, lm=lm)
        assert named in str(info.value)
    assert engine.calls == [] and not out.exists()


def test_the_output_may_not_be_the_input_or_a_foreign_file(tmp_path, monkeypatch, capsys):
    from trace_dspy.cli.respond import main

    lm, engine = fake_lm(echo)
    monkeypatch.setattr(lms_module, "build_lm", lambda spec: lm)
    monkeypatch.setenv("TRACE_DSPY_DATA", "")
    (tmp_path / "c.toml").write_text("[program]\nprior_k = 0\n")
    src = batch_file(tmp_path / "in.jsonl", [{"id": "a", "turns": ["I got the job!"]}])
    before = src.read_bytes()
    (tmp_path / "link.jsonl").symlink_to(src)
    for output in (src, tmp_path / "link.jsonl"):
        assert main(["--config", str(tmp_path / "c.toml"), "--input", str(src), "--output", str(output)]) == 2
        assert "is the input file" in capsys.readouterr().err
    notes = tmp_path / "notes.jsonl"
    notes.write_text('{"id": "x", "turns": ["my own data"]}\n{"id": "y", "note": "keep me"}\n')
    text = tmp_path / "essay.txt"
    text.write_text("Dear diary,\nnot JSON at all.\n")
    for foreign in (notes, text):
        kept = foreign.read_bytes()
        assert main(["--config", str(tmp_path / "c.toml"), "--input", str(src), "--output", str(foreign)]) == 2
        err = capsys.readouterr().err
        assert "is not a respond output file" in err and "Traceback" not in err
        assert foreign.read_bytes() == kept
    assert src.read_bytes() == before and engine.calls == []


def test_a_corrupt_line_in_an_earlier_output_loses_no_other_row(tmp_path, caplog):
    lm, engine = fake_lm(echo)
    program = TraceProgram(ProgramConfig(prior_k=0))
    src = batch_file(tmp_path / "in.jsonl", [{"id": f"d{i}", "turns": [f"I lost my keys at beach {i}."]}
                                             for i in range(5)])
    out = tmp_path / "out.jsonl"
    respond_batch(program, src, out, lm=lm)
    lines = out.read_text().splitlines()
    lines[1] = lines[1][: len(lines[1]) // 2]  # a damaged record in the middle
    lines[3] = "\x00\x00 garbage"
    out.write_text("\n".join(lines) + "\n" + lines[4][:10])  # and a torn last line
    calls = len(engine.calls)
    with caplog.at_level(logging.WARNING, logger="trace_dspy.core.jsonl"):
        report = respond_batch(program, src, out, lm=lm)
    warned = caplog.text
    assert f"{out}:2" in warned and f"{out}:4" in warned and "torn last line" in warned
    # Only the two damaged rows (and the torn one) were asked again; every good row survived untouched.
    assert report.skipped == 3 and report.answered == 2 and len(engine.calls) - calls == 2 * 4
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in records] == [f"d{i}" for i in range(5)] and all("response" in r for r in records)


def test_the_final_rewrite_is_atomic(tmp_path, monkeypatch):
    from trace_dspy.core import jsonl

    lm, _ = fake_lm(echo)
    program = TraceProgram(ProgramConfig(prior_k=0))
    src = batch_file(tmp_path / "in.jsonl", [{"id": "a", "turns": ["I passed!"]}, {"id": "b", "turns": ["oops"]}])
    out = tmp_path / "out.jsonl"
    respond_batch(program, src, out, lm=lm)
    before = out.read_bytes()
    batch_file(src, [{"id": "a", "turns": ["I passed!"]}, {"id": "b", "turns": ["oops"]}, {"id": "c", "turns": ["new"]}])

    def crash(*args):
        raise OSError("disk full")

    monkeypatch.setattr(jsonl.os, "replace", crash)
    with pytest.raises(OSError, match="disk full"):
        respond_batch(program, src, out, lm=lm)
    # The appended row is on disk, the earlier rows are intact, and no temporary file is left.
    monkeypatch.undo()
    assert out.read_bytes().startswith(before) and [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []
    assert set(trace_dspy.core.jsonl.read_records(out)) == {"a", "b", "c"}


# ---------------------------------------------------------------- 3. retries that really retry


class Flaky:
    """Garbage until ``healed`` is set, good replies after (a server that had a bad moment)."""

    def __init__(self):
        self.inner = ScriptedEngine(echo)
        self.healed = False

    def reply_text(self, system, user, prefill=""):
        if not self.healed:
            return "lorem ipsum, nothing a parser can read"
        return self.inner.reply_text(system, user, prefill=prefill)


def test_failed_rows_are_asked_again_past_the_cache(tmp_path, no_cache_isolation, monkeypatch):
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    with FakeChatServer(latency=0, engine=Flaky()) as server:
        lm = TraceLM("openai/fake", api_base=server.api_base, api_key="unused", endpoint=server.api_base,
                     cache=True, num_retries=0)
        program = TraceProgram(ProgramConfig(prior_k=0, adapter="chat"))
        src = batch_file(tmp_path / "in.jsonl", [{"id": "a", "turns": ["My dog is sick."]}])
        out = tmp_path / "out.jsonl"
        first = respond_batch(program, src, out, lm=lm)
        assert first.failed == 1
        server.engine.healed = True
        asked = server.requests
        second = respond_batch(program, src, out, lm=lm)
        # The failed reply was not replayed from the cache: the server was asked again, and answered.
        assert server.requests > asked and second.failed == 0
        assert json.loads(out.read_text())["response"].startswith("heard: ")


def test_evaluate_redoes_failed_rows_past_the_cache(tmp_path, no_cache_isolation, monkeypatch):
    from trace_dspy.optimize.metric import EmpathyMetric

    from trace_dspy.workflows.evaluation import evaluate_program

    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    example = dspy.Example(dialogue="Speaker: My dog is sick.", emotion="sad", response="Oh no, is he okay?",
                           sample_id="s0").with_inputs("dialogue")
    with FakeChatServer(latency=0, engine=Flaky()) as server:
        lm = TraceLM("openai/fake", api_base=server.api_base, api_key="unused", endpoint=server.api_base,
                     cache=True, num_retries=0)
        program = TraceProgram(ProgramConfig(prior_k=0, adapter="chat"))
        rows = tmp_path / "rows.jsonl"
        kwargs = dict(lm=lm, results_path=rows, max_failure_rate=None)
        assert evaluate_program(program, [example], EmpathyMetric(embedder=None), **kwargs).summary["failed"] == 1
        server.engine.healed = True
        assert evaluate_program(program, [example], EmpathyMetric(embedder=None), **kwargs).summary["failed"] == 0


def test_the_cache_key_includes_the_endpoint(no_cache_isolation, monkeypatch):
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")

    def says(word):
        return ScriptedEngine(lambda outputs, inputs: {"response": word} if "response" in outputs else {})

    with FakeChatServer(latency=0, engine=says("first server")) as one, \
            FakeChatServer(latency=0, engine=says("second server")) as two:
        replies = []
        for server in (one, two, one):
            lm = lms_module.build_lm(LMSpec(model="openai/same-name", api_base=server.api_base, cache=True))
            monkeypatch.setenv("OPENAI_API_KEY", "unused-key-value")
            with dspy.context(lm=lm):
                replies.append(TraceProgram(ProgramConfig(prior_k=0, adapter="chat"))(
                    dialogue="I won the race!").response)
        assert replies == ["first server", "second server", "first server"]
        # The third call was a cache hit on the first server's own entry.
        assert one.requests == two.requests


# ---------------------------------------------------------------- 4 and 5. clean, bounded failures


class _Hang(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        time.sleep(30)

    def log_message(self, *args):
        pass


def test_a_hung_server_is_given_up_on_within_the_timeout(tmp_path, monkeypatch, capsys):
    from trace_dspy.cli.respond import main

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hang)
    server.daemon_threads = True
    server.block_on_close = False  # do not wait for the hanging handler
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    monkeypatch.setenv("OPENAI_API_KEY", "unused-key-value")
    (tmp_path / "c.toml").write_text("[program]\nprior_k = 0\n[lm]\nnum_retries = 0\n")
    try:
        started = time.monotonic()
        rc = main(["--config", str(tmp_path / "c.toml"), "--lm", "openai/x", "--timeout", "1",
                   "--api-base", f"http://127.0.0.1:{server.server_port}/v1", "I feel stuck."])
        elapsed = time.monotonic() - started
    finally:
        server.shutdown()
        server.server_close()
    err = capsys.readouterr().err
    assert rc == 1 and "the model call failed" in err and "Traceback" not in err
    assert elapsed < 20, elapsed  # 1 s timeout, no retry; a hang would take the server's 30 s
    assert lms_module.LMSpec().timeout == 60.0  # the documented default
    (tmp_path / "bad.toml").write_text("[lm]\ntimeout = 0\n")
    assert main(["--config", str(tmp_path / "bad.toml"), "hi"]) == 2
    assert "timeout > 0" in capsys.readouterr().err


def test_credentials_in_a_base_url_never_reach_messages_or_records(tmp_path, monkeypatch, capsys):
    from trace_dspy.cli.respond import main
    from trace_dspy.core.safety import redact

    password = "pw" + secrets.token_hex(8)
    url = f"http://alice:{password}@127.0.0.1:9/v1"  # port 9 (discard): nothing listens
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-" + secrets.token_hex(12))
    (tmp_path / "c.toml").write_text("[program]\nprior_k = 0\n[lm]\nnum_retries = 0\n")
    src = batch_file(tmp_path / "in.jsonl", [{"id": "a", "turns": ["hello there"]}])
    out = tmp_path / "out.jsonl"
    assert main(["--config", str(tmp_path / "c.toml"), "--lm", "openai/x", "--api-base", url,
                 "--input", str(src), "--output", str(out)]) == 1
    assert main(["--config", str(tmp_path / "c.toml"), "--lm", "openai/x", "--api-base", url, "hello"]) == 1
    err = capsys.readouterr().err
    assert password not in err and password not in out.read_text()
    assert "error" in json.loads(out.read_text())
    assert redact(f"failed at {url} with key {os.environ['OPENAI_API_KEY']}") == \
        "failed at http://***@127.0.0.1:9/v1 with key ***"
    assert LMSpec(model="openai/x", api_base=url).to_dict()["api_base"] == "http://***@127.0.0.1:9/v1"


@pytest.mark.parametrize(("argv", "message"), [
    (["evaluate", "--max-failure-rate", "-0.5"], "expected a share from 0 to 1"),
    (["evaluate", "--max-failure-rate", "lots"], "expected a number from 0 to 1"),
    (["compile", "--max-failure-rate", "1.5"], "expected a share from 0 to 1"),
    (["evaluate", "--output-dir", "{file}"], "exists and is not a folder"),
    (["evaluate", "--output-dir", "{file}/sub"], "is a file, so no folder can be made there"),
    (["respond", "--timeout", "-3", "hi"], "--timeout must be a positive number"),
])
def test_bad_flags_are_one_line_errors(tmp_path, monkeypatch, capsys, argv, message):
    import importlib

    lm, engine = fake_lm(echo)
    monkeypatch.setattr(lms_module, "build_lm", lambda spec: lm)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a-file").write_text("x")
    command, *args = [a.replace("{file}", str(tmp_path / "a-file")) for a in argv]
    main = importlib.import_module(f"trace_dspy.{command}").main
    try:
        rc = main(args)
    except SystemExit as exc:  # argparse's own error exit
        rc = exc.code
    err = capsys.readouterr().err
    assert rc == 2 and message in err and "Traceback" not in err and engine.calls == []


def _fake_cli(tmp_path: Path, *args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO), "TRACE_DSPY_ARTIFACTS": str(tmp_path / "artifacts"),
           "TRACE_DSPY_CACHE": str(tmp_path / "cache"), "DSPY_CACHEDIR": str(tmp_path / "dspy-cache"),
           "TRACE_FAKE_SLOW_MARKER": str(tmp_path / "sleeping")}
    env.pop("TRACE_DSPY_DATA", None)
    (tmp_path / "c.toml").write_text("[program]\nprior_k = 0\n")
    return subprocess.Popen([sys.executable, str(REPO / "tests/fake_cli.py"), "trace_dspy.cli.respond",
                             "--config", str(tmp_path / "c.toml"), *args],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=interruptible)


def interruptible() -> None:
    """In the child: SIGINT as a terminal gives it, even where the suite runs with it ignored (a background job
    started without job control inherits it ignored, and Python then installs no KeyboardInterrupt)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _interrupt_when(proc: subprocess.Popen, ready, timeout: float = 120) -> tuple[int, str]:
    deadline = time.monotonic() + timeout
    while not ready() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.2)
    assert proc.poll() is None, proc.communicate()[1].decode()[-2000:]
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    return proc.returncode, err.decode()


@pytest.mark.parametrize("threads", ["1", "3"])
def test_ctrl_c_in_a_batch_exits_130_and_keeps_every_finished_row(tmp_path, threads):
    lines = [{"id": f"ok{i}", "turns": [f"I baked bread number {i}."]} for i in range(3)]
    lines += [{"id": "stuck", "turns": ["this one is slow"]}, {"id": "after", "turns": ["never reached"]}]
    src = batch_file(tmp_path / "in.jsonl", lines)
    out = tmp_path / "out.jsonl"
    proc = _fake_cli(tmp_path, "--input", str(src), "--output", str(out), "--threads", threads)
    rc, err = _interrupt_when(proc, lambda: (tmp_path / "sleeping").exists() and out.exists()
                              and out.read_text().count("\n") >= 3)
    assert rc == 130 and "Traceback" not in err and "interrupted" in err and "Rerun the same command" in err
    kept = trace_dspy.core.jsonl.read_records(out)
    assert {f"ok{i}" for i in range(3)} <= set(kept) and all("response" in kept[f"ok{i}"] for i in range(3))


def test_ctrl_c_while_answering_one_message_exits_130_without_a_traceback(tmp_path):
    proc = _fake_cli(tmp_path, "this is slow")
    rc, err = _interrupt_when(proc, lambda: (tmp_path / "sleeping").exists())
    assert rc == 130 and "Traceback" not in err and "interrupted" in err


def test_escape_sequences_from_the_model_or_the_user_are_shown_not_obeyed(tmp_path, monkeypatch, capsys):
    from trace_dspy.cli.chat import Repl
    from trace_dspy.cli.respond import main
    from trace_dspy.workflows.conversation import ChatSession

    hostile = "Sorry to hear.\x1b]0;pwned\x07\x1b[2J\x9b31m end"

    def responder(outputs, inputs):
        return {"response": hostile} if "response" in outputs else {}

    lm, _ = fake_lm(responder)
    monkeypatch.setattr(lms_module, "build_lm", lambda spec: lm)
    monkeypatch.setenv("TRACE_DSPY_DATA", "")
    (tmp_path / "c.toml").write_text("[program]\nprior_k = 0\n")
    for extra in ([], ["--show-stages"], ["--json"]):
        assert main(["--program", "default", "--config", str(tmp_path / "c.toml"), *extra, "I lost my keys."]) == 0
        out = capsys.readouterr().out
        assert "\x1b" not in out and "\x07" not in out and "\x9b" not in out
        assert ("\\x1b]0;pwned" in out) if not extra or extra == ["--show-stages"] else ("\\u001b]0;pwned" in out)
    written: list[str] = []
    session = ChatSession(TraceProgram(ProgramConfig(prior_k=0)), lm)
    typed = iter(["I lost my keys.\x1b[31m", "/nope\x1b[2J"])

    def read(prompt):
        try:
            return next(typed)
        except StopIteration:
            raise EOFError from None

    Repl(session, read=read, write=written.append).run()
    shown = "\n".join(written)
    assert "\x1b" not in shown and "\\x1b[2J" in shown and "\\x9b31m" in shown


def test_store_initialisation_survives_concurrent_first_use(tmp_path):
    db = tmp_path / "fresh" / "mlflow.db"
    code = ("import sys\n"
            "from trace_dspy.store.tracking import ensure_experiment\n"
            "from trace_dspy.store.registry import register_version\n"
            "uri = 'sqlite:///' + sys.argv[1]\n"
            "ensure_experiment('trace-dspy', uri)\n"
            "import mlflow\n"
            "with mlflow.start_run() as run:\n"
            "    register_version(run.info.run_id, run.info.artifact_uri, 0.5, tracking_uri=uri)\n")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [subprocess.Popen([sys.executable, "-c", code, str(db)], env=env, cwd=tmp_path,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(4)]
    results = [(p.wait(timeout=240), p.stderr.read().decode()) for p in procs]
    assert all(rc == 0 for rc, _ in results), [err[-1500:] for rc, err in results if rc]
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{db}")
    assert [e.name for e in client.search_experiments() if e.name == "trace-dspy"] == ["trace-dspy"]
    assert sorted(int(v.version) for v in client.search_model_versions("name='trace-dspy'")) == [1, 2, 3, 4]


def test_deeply_nested_json_is_one_error_naming_file_and_line(tmp_path, caplog):
    from trace_dspy.data.sources import DataError, read_jsonl

    deep = "[" * 50_000 + "]" * 50_000
    lm, engine = fake_lm(echo)
    program = TraceProgram(ProgramConfig(prior_k=0))
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"id": "a", "turns": ["I moved to a new city."]}) + "\n"
                   + '{"id": "b", "turns": ' + deep + "}\n")
    out = tmp_path / "out.jsonl"
    report = respond_batch(program, src, out, lm=lm)  # an input line: that line's error, the rest answered
    records = {r["id"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert report.failed == 1 and "response" in records["a"]
    assert records["line-2"]["error"] == f"{src}:2: JSON nested more than 64 levels deep"
    with out.open("a") as fh:  # a resume file: the line is skipped with a warning, the good rows are kept
        fh.write(deep + "\n")
    with caplog.at_level(logging.WARNING, logger="trace_dspy.core.jsonl"):
        assert set(trace_dspy.core.jsonl.read_records(out)) == {"a", "line-2"}
    assert f"{out}:3: JSON nested more than 64 levels deep" in caplog.text
    data = tmp_path / "data.jsonl"  # a data file: one DataError naming the line
    data.write_text('{"turns": ["hi"], "emotion": "sad", "reply": "oh"}\n' + deep + "\n")
    with pytest.raises(DataError, match=r"data.jsonl:2: JSON nested more than 64 levels deep"):
        read_jsonl(data)
