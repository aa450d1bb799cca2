"""The OpenAI-compatible route against real servers on 127.0.0.1.

llama.cpp's server (extra ``server``) with the same GGUF file, reached through
``dspy.LM("openai/...", api_base=...)``; and stub servers that fail or hang,
which must give a clear error after bounded retries.
"""

from __future__ import annotations

import http.server
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import dspy
import pytest

from trace_dspy import ProgramConfig, TraceProgram
from trace_dspy.core.labels import CAUSE_CATEGORIES, EMOTIONS, STRATEGIES
from trace_dspy.lm.specs import GrammarLM, LMSpec, build_lm

# llama-cpp-python's server, started through the project's wrapper so that it loads the model with plain weight
# buffers, as the embedded engine does (a CPU that advertises AMX without granting it crashes otherwise).
SERVE = "import sys; from trace_dspy.lm.model_files import run_llama_server; run_llama_server(sys.argv[1:])"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def llama_server(local_model, tmp_path_factory):
    import importlib.util

    if importlib.util.find_spec("uvicorn") is None or importlib.util.find_spec("sse_starlette") is None:
        if os.environ.get("CI"):
            pytest.fail("the 'server' extra is not installed")
        pytest.skip("the 'server' extra is not installed")
    port = free_port()
    log = tmp_path_factory.mktemp("server") / "server.log"
    with open(log, "w") as fh:
        proc = subprocess.Popen(
            [sys.executable, "-c", SERVE, "--model", str(local_model), "--host", "127.0.0.1",
             "--port", str(port), "--n_ctx", "4096", "--model_alias", "smollm2", "--n_threads", "2"],
            stdout=fh, stderr=subprocess.STDOUT,
        )
    base = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(base + "/models", timeout=2).read()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"llama.cpp server did not start:\n{log.read_text()[-2000:]}")
                time.sleep(0.5)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.mark.slow
@pytest.mark.embedded
def test_program_runs_through_the_openai_route(llama_server, monkeypatch):
    monkeypatch.setenv("TRACE_SERVER_KEY", "sk-local-test")
    lm = build_lm(LMSpec(model="openai/smollm2", api_base=llama_server, api_key_env="TRACE_SERVER_KEY",
                         server_grammar=True, cache=False, num_retries=1, timeout=120))
    assert isinstance(lm, GrammarLM)
    # the small model behind a server: the compact writer is asked for by name (auto picks it only in-process)
    program = TraceProgram(ProgramConfig(reasoning=(), writer="compact"))
    with dspy.context(lm=lm):
        for message in ("I failed my driving test again.", "My brother surprised me with concert tickets!"):
            pred = program(dialogue=message)
            assert pred.emotion in EMOTIONS and pred.cause_category in CAUSE_CATEGORIES
            assert pred.strategy in STRATEGIES and pred.response.strip()
    # Three analysis stages and two reply sentences (the scaffold), twice, and at most one second try per sentence.
    assert 2 * (3 + 2) <= len(lm.history) <= 2 * (3 + 4)


# respond with --lm on the server, in a fresh interpreter: which writer ran, what the server was asked, and
# whether anything of the compact writer was imported.
STANDARD_RESPOND = (
    "import json, sys\n"
    "from trace_dspy.cli.main import main\n"
    "code = main(['respond', '--json', '--config', sys.argv[1], 'My sister is moving across the country next month.'])\n"
    "print(json.dumps({'code': code, 'compact': sorted(m for m in sys.modules if m.startswith('trace_dspy.compact'))}))\n"
)


@pytest.mark.slow
@pytest.mark.embedded
def test_a_standard_run_on_the_server_makes_no_compact_call(llama_server, tmp_path):
    env = {**os.environ, "TRACE_SERVER_KEY": "sk-local-test", "TRACE_DSPY_CACHE": str(tmp_path / "cache"),
           "DSPY_CACHEDIR": str(tmp_path / "dspy")}
    # The model behind the server is the 135M one: without the grammar DSPy's layout is beyond it. The grammar
    # (server_grammar) keeps the layout; it does not make the writer compact.
    config = tmp_path / "server.toml"
    config.write_text(f'[lm]\nmodel = "openai/smollm2"\napi_base = "{llama_server}"\napi_key_env = "TRACE_SERVER_KEY"\n'
                      'server_grammar = true\n')
    run = subprocess.run([sys.executable, "-c", STANDARD_RESPOND, str(config)], capture_output=True, text=True,
                         timeout=600, env=env, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    lines = run.stdout.strip().splitlines()
    start, end = lines.index("{"), lines.index("}")  # the prediction, pretty-printed, whatever else is printed
    status, pred = json.loads(lines[-1]), json.loads("\n".join(lines[start:end + 1]))
    assert status == {"code": 0, "compact": []}
    assert pred["writer"] == "standard" and pred["response"].strip()
    # TRACE as published: the planner was asked and one reply written for its plan (no race, no candidates)
    assert pred["plan_path"] == "lm" and "reply_plans" not in pred and "reply_rewards" not in pred


@pytest.mark.slow
@pytest.mark.embedded
def test_plain_openai_lm_reaches_the_server(llama_server, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-local-test")
    lm = build_lm(LMSpec(model="openai/smollm2", api_base=llama_server, cache=False, max_tokens=8))
    (text,) = lm("Say hello.")
    assert isinstance(text, str)


def _assert_bounded_failure(api_base: str, limit_s: float, *, num_retries: int = 1, timeout: float = 3):
    lm = build_lm(LMSpec(model="openai/x", api_base=api_base, num_retries=num_retries, timeout=timeout, cache=False))
    started = time.monotonic()
    with pytest.raises(Exception) as info:
        with dspy.context(lm=lm):
            TraceProgram()(dialogue="hello there")
    assert time.monotonic() - started < limit_s
    return info.value


def test_unreachable_server_fails_fast_and_clearly(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-local-test")
    error = _assert_bounded_failure(f"http://127.0.0.1:{free_port()}/v1", limit_s=30)
    assert "connect" in str(error).lower()


class _Stub(http.server.BaseHTTPRequestHandler):
    mode = "500"
    hits = 0

    def do_POST(self):  # noqa: N802
        type(self).hits += 1
        if self.mode == "hang":
            time.sleep(30)
            return
        self.send_response(500)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b'{"error": {"message": "model crashed", "type": "server_error"}}')

    def log_message(self, *args):
        pass


@pytest.mark.parametrize("mode", ["500", "hang"])
def test_failing_or_hanging_server_gives_an_error_after_bounded_retries(monkeypatch, mode):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-local-test")
    handler = type("Stub", (_Stub,), {"mode": mode, "hits": 0})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        error = _assert_bounded_failure(f"http://127.0.0.1:{server.server_port}/v1", limit_s=40,
                                        num_retries=2, timeout=2)
    finally:
        server.shutdown()
    assert 1 <= handler.hits <= 3  # first try plus at most num_retries
    assert type(error).__name__ != "AssertionError"
