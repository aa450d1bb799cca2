"""No secret in any store, and bounded work on hostile replies.

A key lives in an environment variable of any name (named with --api-key-env, an [lm] table's
api_key_env, or the serving environment's TRACE_DSPY_API_KEY_ENV); a password may sit in an api_base
URL. Servers on 127.0.0.1 answer 401 with a body that quotes the Authorization header, as many
providers do, or a 10 MB reply that parses as nothing. The commands run with tracing on and off, on
success and failure, and then every file the run wrote, and its stdout and stderr, are searched for
the secrets.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from trace_dspy.testing.fakes import ScriptedEngine
from trace_dspy.testing.server import FakeChatServer

REPO = Path(__file__).resolve().parents[1]
FAST = '[metric]\nsimilarity_kind = "token_f1"\n[program]\nprior_k = 0\n[lm]\nnum_retries = 0\n'


def echo(outputs, inputs):
    if "response" in outputs:
        return {"response": "heard: " + inputs["dialogue"].splitlines()[-1]}
    return {}


# ---------------------------------------------------------------- a provider that quotes the key


def provider(refuse_every: int = 1, reply: str | None = None) -> FakeChatServer:
    """An OpenAI-compatible provider on 127.0.0.1 answering from ``echo``: every ``refuse_every``-th
    request (1: all, 0: none) gets a 401 that quotes the Authorization header; ``reply`` replaces the
    answer's text."""
    return FakeChatServer(latency=0, engine=ScriptedEngine(echo), refuse_every=refuse_every, reply=reply)


def with_credentials(api_base: str, credentials: str) -> str:
    """``api_base`` with ``user:password@`` before its host."""
    return api_base.replace("://", f"://{credentials}", 1)


# Runs (command, args) pairs in one process (one start-up of MLflow and DSPy, as the machine is
# small), as `python -m trace_dspy.<command>` would; prints each command's exit status.
DRIVER = """
import importlib, json, sys, time
codes = []
for command, args in json.loads(sys.argv[1]):
    started = time.monotonic()
    try:
        rc = importlib.import_module('trace_dspy.' + command).main(args)
    except SystemExit as exc:
        rc = exc.code
    codes.append([command, rc, round(time.monotonic() - started, 2)])
    print(f"### {command} -> {rc}", file=sys.stderr, flush=True)
print('EXIT CODES ' + json.dumps(codes))
"""


def run_commands(tmp_path: Path, commands: list, env_extra: dict[str, str], timeout: float = 600):
    env = {k: v for k, v in os.environ.items()
           if k not in ("TRACE_DSPY_DATA", "MLFLOW_TRACKING_URI", "OPENAI_API_KEY")}
    (tmp_path / "tmp").mkdir(exist_ok=True)
    env.update(TMPDIR=str(tmp_path / "tmp"), TRACE_DSPY_ARTIFACTS=str(tmp_path / "artifacts"),
               DSPY_CACHEDIR=str(tmp_path / "dspy-cache"), TRACE_DSPY_CACHE=str(tmp_path / "index-cache"),
               NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost", PYTHONPATH=str(REPO), **env_extra)
    (tmp_path / "c.toml").write_text(FAST)
    run = subprocess.run([sys.executable, "-c", DRIVER, json.dumps(commands)], capture_output=True, env=env,
                         cwd=tmp_path, timeout=timeout, check=False)
    assert run.returncode == 0, run.stderr.decode(errors="replace")[-4000:]
    codes = json.loads(run.stdout.decode().rsplit("EXIT CODES ", 1)[1])
    return run, {f"{i}:{c}": rc for i, (c, rc, _) in enumerate(codes)}, codes


def files_holding(root: Path, needles: list[str], extra: dict[str, bytes]) -> list[str]:
    found = []
    blobs = {**extra, **{str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}}
    for name, data in blobs.items():
        for needle in needles:
            if needle.encode() in data:
                found.append(f"{name} holds {needle[:6]}...")
    return sorted(set(found))


def secret_needles(key: str, password: str, user: str = "alice") -> list[str]:
    # The key, its random part in any wrapping, the password, and the Basic token made of the URL's
    # user and password.
    return [key, key[3:], password, base64.b64encode(f"{user}:{password}".encode()).decode()]


# ---------------------------------------------------------------- 1 and 2: no key in any store


@pytest.mark.parametrize(("refuse_every", "variable"), [(1, "LLM_CRED"), (3, "Q7_SETTING")])
def test_no_key_or_url_password_reaches_any_file_with_tracing_on_or_off(tmp_path, refuse_every, variable):
    """The key is in a variable whose name does not look like a key's; the provider quotes it in its
    401 replies (every reply, or every third one so that success and failure both occur). respond
    (one message, and a batch), evaluate and compile run with tracing on and off; then the key and
    the URL's password are in none of the files the run wrote, nor in its stdout or stderr."""
    key = "sk-" + secrets.token_hex(20)
    password = "pw" + secrets.token_hex(10)
    (tmp_path / "in.jsonl").write_text("".join(json.dumps({"id": f"d{i}", "turns": [f"I lost my keys {i}."]}) + "\n"
                                               for i in range(4)))
    with provider(refuse_every) as server:
        lm = ["--config", "c.toml", "--lm", "openai/x", "--api-base", server.api_base, "--api-key-env", variable]
        with_url = ["--config", "c.toml", "--lm", "openai/x", "--api-base",
                    with_credentials(server.api_base, f"alice:{password}@"), "--api-key-env", variable]
        uri = ["--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}"]
        commands = [
            ["respond", [*lm, "--trace", "I failed my driving test."]],
            ["respond", [*lm, "I failed my driving test again."]],
            ["respond", [*lm, "--trace", "--input", "in.jsonl", "--output", "traced.jsonl"]],
            ["respond", [*lm, "--input", "in.jsonl", "--output", "plain.jsonl"]],
            ["respond", [*with_url, "--trace", "My dog is ill."]],
            ["respond", [*with_url, "--input", "in.jsonl", "--output", "url.jsonl"]],
            ["evaluate", [*lm, *uri, "--limit", "3", "--max-failure-rate", "1", "--output-dir", "eval-traced"]],
            ["evaluate", [*lm, *uri, "--limit", "3", "--max-failure-rate", "1", "--no-trace",
                          "--output-dir", "eval-plain"]],
            ["evaluate", [*with_url, *uri, "--limit", "2", "--max-failure-rate", "1", "--output-dir", "eval-url"]],
            ["compile", [*lm, *uri, "--optimizer", "labeled", "--train", "4", "--dev", "3", "--threads", "1",
                         "--max-failure-rate", "1"]],
        ]
        run, codes, timing = run_commands(tmp_path, commands, {variable: key})
        refused, answered = server.refused, server.requests
    out, err = run.stdout, run.stderr
    (tmp_path / "run.log").write_bytes(out + b"\n" + err)  # scanned with the rest
    # The attack was live: the provider saw requests and refused some of them, quoting the key.
    assert refused > 0, (refused, answered, timing)
    if refuse_every > 1:
        assert answered > 0, (refused, answered, timing)
    assert b"Traceback" not in err, err.decode(errors="replace")[-3000:]
    assert (tmp_path / "mlflow.db").is_file() and (tmp_path / "traced.jsonl").is_file()
    rows = [json.loads(line) for line in (tmp_path / "plain.jsonl").read_text().splitlines()]
    failed = [r for r in rows if r.get("error")]
    assert failed and all("***" in r["error"] for r in failed), rows
    leaks = files_holding(tmp_path, secret_needles(key, password), {"stdout": out, "stderr": err})
    assert not leaks, (leaks, timing)


def test_the_variable_an_lm_reads_its_key_from_is_masked_whatever_its_name(monkeypatch):
    from trace_dspy.core.config import ConfigError
    from trace_dspy.core.safety import redact
    from trace_dspy.lm.specs import LMConfig, LMSpec
    from trace_dspy.workflows.serving import lm_config_from_env

    values = {}
    for name in ("LLM_CRED_X9", "MY_PROVIDER_SETTING", "Q", "openai_api_key_2b", "SERVED_BY_ENV", "FROM_TOML"):
        values[name] = "v-" + secrets.token_hex(12)
        monkeypatch.setenv(name, values[name])
    LMSpec(model="openai/x", api_key_env="LLM_CRED_X9")
    LMSpec.from_dict({"model": "openai/x", "api_key_env": "MY_PROVIDER_SETTING"})
    LMConfig().with_overrides(lm="openai/x", api_key_env="Q")
    LMConfig.from_dict({"model": "openai/x", "api_key_env": "FROM_TOML"})
    lm_config_from_env({"TRACE_DSPY_LM": "openai/x", "TRACE_DSPY_API_KEY_ENV": "SERVED_BY_ENV"})
    with pytest.raises(ConfigError):
        LMSpec(model="openai/x", api_key_env="not a name")
    text = " | ".join(f"{n}={v}" for n, v in values.items())
    masked = redact(text)
    for name, value in values.items():
        assert value not in masked and f"{name}=***" in masked
    assert value[2:] not in redact(json.dumps({"k": value}))


@pytest.mark.parametrize("name", ["OPENAI_API_KEY_2", "LLM_CRED", "SERVICE_TOKEN_B", "DB_PASSWORD_FILE",
                                  "GITHUBTOKEN", "app_secret_v2", "AZURE_CREDENTIALS"])
def test_key_like_names_are_masked_without_being_named(monkeypatch, name):
    from trace_dspy.core.safety import redact

    value = "s3cr3t-" + secrets.token_hex(8)
    monkeypatch.setenv(name, value)
    assert redact(f"the server said: bad key {value}.") == "the server said: bad key ***."
    # Names that only contain such letters (PWD, KEYBOARD_LAYOUT, MONKEY_PATH) are not credentials.
    for ordinary in ("PWD", "KEYBOARD_LAYOUT", "MONKEY_PATH", "TOKENIZERS_PARALLELISM_X"):
        monkeypatch.setenv(ordinary, "/home/someone/work")
    assert redact("no file /home/someone/work/x.json") == "no file /home/someone/work/x.json"


def test_a_url_password_is_masked_in_any_form_once_an_lm_names_that_url():
    from trace_dspy.core.safety import redact
    from trace_dspy.lm.specs import LMSpec

    password = "pw" + secrets.token_hex(8)
    LMSpec(model="openai/x", api_base=f"http://bob:{password}@127.0.0.1:9/v1")
    basic = base64.b64encode(f"bob:{password}".encode()).decode()
    text = f"password={password}; Authorization: Basic {basic}; url http://bob:{password}@h/v1"
    masked = redact(text)
    assert password not in masked and basic not in masked and "http://***@h/v1" in masked


def test_an_exception_leaving_the_lm_is_masked_for_every_recorder(monkeypatch):
    """The exception that TraceLM raises, and the ones it was raised from, carry the masked text."""
    import traceback

    from trace_dspy.lm.specs import LMSpec, build_lm

    key = "sk-" + secrets.token_hex(16)
    monkeypatch.setenv("Z_SETTING", key)
    with provider() as server:
        lm = build_lm(LMSpec(model="openai/x", api_base=server.api_base, api_key_env="Z_SETTING",
                             num_retries=0, cache=False))
        with pytest.raises(Exception) as info:
            lm(messages=[{"role": "user", "content": "hi"}])
    assert server.refused == 1
    shown = "".join(traceback.format_exception(info.value)) + repr(info.value) + repr(vars(info.value))
    assert key not in shown and key[3:] not in shown and "***" in shown


def test_every_span_is_masked_before_it_is_stored(tmp_path, monkeypatch):
    """Spans made outside the program (MLflow's own API, an autologger) pass the same guard: name,
    attributes, inputs, outputs, exception events and status."""
    import mlflow

    from trace_dspy.store.tracking import prepare_tracing

    key = "tok-" + secrets.token_hex(16)
    monkeypatch.setenv("SOME_API_KEY", key)
    prepare_tracing(f"sqlite:///{tmp_path / 'mlflow.db'}", "spans")
    with pytest.raises(RuntimeError):
        with mlflow.start_span(name=f"call {key}") as live:
            live.set_inputs({"api_base": "http://u:pass-word-123@h/v1", "key": key})
            live.set_attribute("error", f"401 Bearer {key}")
            raise RuntimeError(f"Incorrect API key provided: Bearer {key}")
    trace_id = mlflow.get_last_active_trace_id()
    mlflow.flush_trace_async_logging()
    trace = mlflow.get_trace(trace_id)
    stored = json.dumps(trace.to_dict())
    assert "***" in stored and "Bearer ***" in stored
    assert key not in stored and "pass-word-123" not in stored
    assert key.encode() not in (tmp_path / "mlflow.db").read_bytes()


# ---------------------------------------------------------------- 5: linear redaction, bounded echo

N = 5_000_000
SHAPES = ["A", "a:", "http://a", ":", "@", "a:b", "a@", "a:b@", "a:b@c", " a:b", "://", "a://", "a://b", "/a:b@",
          ":a@", "a:@", "http://u:p@h/", "x://a:b@c ", "\"'a:b"]

# Times redact on one shape in a fresh interpreter; a quadratic one is stopped by the timeout.
TIMER = """
import sys, time
from trace_dspy.core.safety import redact
shape, n = sys.argv[1], int(sys.argv[2])
text = "user:hunter2hunter2@host " + (shape * (n // len(shape) + 1))[:n]
started = time.perf_counter()
out = redact(text)
print(time.perf_counter() - started, "hunter2hunter2" in out, len(out))
"""


@pytest.mark.parametrize("shape", SHAPES)
def test_redaction_takes_linear_time_on_adversarial_text(shape):
    """5 MB of each shape that made the old patterns backtrack: under 2 s each. The bound is
    generous because the machine is shared; quadratic redaction took ~1.6 s for 40 kB."""
    try:
        run = subprocess.run([sys.executable, "-c", TIMER, shape, str(N)], capture_output=True, text=True,
                             timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)}, check=True)
    except subprocess.TimeoutExpired:
        pytest.fail(f"redact on 5 MB of {shape!r} ran for more than 60 s")
    seconds, leaked, _ = run.stdout.split()
    assert float(seconds) < 2.0, (shape, seconds)
    assert leaked == "False"  # the credential before the noise is still masked


def test_redaction_masks_what_it_masked_before_in_linear_time():
    """Every form the patterns masked is still masked, after 200 kB of letters (quadratic redaction
    took about 40 s on those; a generous 2 s bound for a shared machine)."""
    import time

    from trace_dspy.core.safety import redact

    cases = {
        "http://alice:pw@127.0.0.1:9/v1": "http://***@127.0.0.1:9/v1",
        "https://u@host/x and ftp://a:b@c": "https://***@host/x and ftp://***@c",
        "connect to alice:secret@127.0.0.1 failed": "connect to ***@127.0.0.1 failed",
        "(':x:y@[::1]')": "(':***@[::1]')",
        "'user:pw@host'": "'***@host'",
        "mail me at bob@example.com": "mail me at bob@example.com",
        "a:b@ c": "a:b@ c",
        "http://h/path?q=a:b@c": "http://h/***@c",
    }
    for text, masked in cases.items():
        assert redact(text) == masked, text
    noise = "A" * 200_000
    started = time.perf_counter()
    out = redact("\n".join(cases) + " " + noise)
    assert time.perf_counter() - started < 2.0
    assert out.startswith("\n".join(cases.values()) + " AAAA")


def test_a_long_message_is_shortened_and_says_how_long_it_was(monkeypatch):
    from trace_dspy.core.safety import MAX_MESSAGE_CHARS, redact

    key = "sk-" + secrets.token_hex(16)
    monkeypatch.setenv("OPENAI_API_KEY", key)
    # The key straddles the cut: it is masked before the text is shortened.
    text = "x" * (MAX_MESSAGE_CHARS - 5) + key + "y" * 10_000_000
    out = redact(text)
    assert len(out) < MAX_MESSAGE_CHARS + 40 and out.endswith(f"... ({10_000_000 + MAX_MESSAGE_CHARS - 2:,} characters)")
    assert key[:8] not in out and key[3:8] not in out
    assert redact("short message") == "short message"


def test_a_10_mb_reply_is_one_short_error_line_without_the_secret(tmp_path):
    """A provider answers with 10 MB that parses as nothing. respond prints one short error line and a
    batch row holds a short error; the key (inside the reply) is masked. The old code echoed the
    whole reply through quadratic redaction (over 150 s for 10 MB)."""
    key = "sk-" + secrets.token_hex(20)
    garbage = ("a:" * 2_500_000) + f" Bearer {key} " + ("A" * 5_000_000)
    (tmp_path / "in.jsonl").write_text(json.dumps({"id": "only", "turns": ["I lost my job."]}) + "\n")
    with provider(refuse_every=0, reply=garbage) as server:
        lm = ["--config", "c.toml", "--lm", "openai/x", "--api-base", server.api_base, "--api-key-env", "Q_VAR"]
        try:
            run, codes, timing = run_commands(
                tmp_path, [["respond", [*lm, "I lost my job."]],
                           ["respond", [*lm, "--input", "in.jsonl", "--output", "out.jsonl"]]],
                {"Q_VAR": key}, timeout=240)
        except subprocess.TimeoutExpired:
            pytest.fail("a 10 MB reply kept respond busy for more than 240 s")
        assert server.requests >= 2
    err = run.stderr.decode()
    assert list(codes.values()) == [1, 1], (codes, err[-2000:])
    # One error for the message (DSPy's parse error spans a few lines), shortened, no traceback.
    first = err.split("### respond")[0]
    assert first.count("error:") == 1 and "Traceback" not in err, err[-2000:]
    assert len(first) < 2000 and "characters)" in first, first[-2000:]
    row = json.loads((tmp_path / "out.jsonl").read_text())
    assert row["error"] and len(row["error"]) < 2000, row
    # Each command, start to exit, including two 10 MB replies over HTTP and their parsing: well
    # under the old >150 s (a generous bound for a shared machine).
    assert all(seconds < 60 for _, _, seconds in timing), timing
    # DSPy's response cache keeps the provider's reply verbatim (the key is in it only because this
    # provider put it there); every message, row and record made from the reply is masked.
    leaks = files_holding(tmp_path, [key, key[3:]], {"stdout": run.stdout, "stderr": run.stderr})
    assert not [leak for leak in leaks if not leak.startswith("dspy-cache/")], leaks
