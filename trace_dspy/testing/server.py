"""A loopback OpenAI-compatible chat server with a fixed latency, for benchmarks and tests.

It answers ``POST /v1/chat/completions`` with the scripted answers of
``trace_dspy.testing.fakes.ScriptedEngine`` after sleeping ``latency`` seconds, so
that a program reached through ``dspy.LM("openai/...", api_base=...)`` runs
end to end over real HTTP while the model costs nothing but the wait. Every
request is served on its own thread, so the server itself never limits
concurrency.

    with FakeChatServer(latency=0.2) as server:
        lm = dspy.LM("openai/fake", api_base=server.api_base, api_key="unused", cache=False)
"""

from __future__ import annotations

import http.server
import json
import threading
import time
from typing import Any


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: clients reuse connections as they would with a real provider
    # Headers and body go out in separate writes; with Nagle's algorithm on, the
    # second one waits for the client's delayed ACK (about 40 ms per call).
    disable_nagle_algorithm = True
    server: _Server

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        try:
            body = json.loads(self.rfile.read(length) or b"{}")
            messages = body["messages"]
        except (ValueError, KeyError, TypeError):
            self._send(400, {"error": {"message": "expected a JSON body with 'messages'"}})
            return
        if not self.path.rstrip("/").endswith("/chat/completions"):
            self._send(404, {"error": {"message": f"no route {self.path}"}})
            return
        time.sleep(self.server.latency)
        auth = self.headers.get("Authorization", "")
        with self.server.lock:
            self.server.received += 1
            refuse = self.server.refuse_every and self.server.received % self.server.refuse_every == 0
            self.server.refused += bool(refuse)
        if refuse:
            # A provider that rejects the key and quotes it back, as many providers' 401 replies do.
            self._send(401, {"error": {"message": f"Incorrect API key provided: {auth}. You can find your key "
                                                  f"at https://example.invalid/keys (header {auth!r})",
                                       "type": "invalid_request_error", "code": "invalid_api_key"}})
            return
        marker = self.server.fail_marker
        if marker and any(marker in _text(m) for m in messages):
            # An injected fault: a request the provider refuses (HTTP 400 is not retried by clients).
            with self.server.lock:
                self.server.refused += 1
            self._send(400, {"error": {"message": f"refused: the request contains {marker!r}",
                                       "type": "invalid_request_error"}})
            return
        system = "".join(_text(m) for m in messages if m.get("role") == "system")
        users = [_text(m) for m in messages if m.get("role") == "user"]
        # A last assistant message is a prefill, as llama.cpp's server reads it by default.
        prefill = _text(messages[-1]) if messages and messages[-1].get("role") == "assistant" else ""
        text = self.server.reply
        if text is None:
            text = self.server.engine.reply_text(system, users[-1] if users else "", prefill=prefill)
        n_in = sum(len(_text(m).split()) for m in messages)
        n_out = len(text.split())
        with self.server.lock:
            self.server.requests += 1
            self.server.authorizations.append(auth)
        self._send(200, {
            "id": f"fake-{self.server.requests}", "object": "chat.completion", "created": int(time.time()),
            "model": body.get("model", "fake"),
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": n_in, "completion_tokens": n_out, "total_tokens": n_in + n_out},
        })

    def do_GET(self):
        if self.path.rstrip("/").endswith("/models"):
            self._send(200, {"object": "list", "data": [{"id": "fake", "object": "model"}]})
        else:
            self._send(404, {"error": {"message": f"no route {self.path}"}})

    def _send(self, status: int, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):  # quiet
        pass


def _text(message: dict[str, Any]) -> str:
    content = message.get("content") or ""
    if isinstance(content, list):  # OpenAI content parts
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return str(content)


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256
    latency: float
    engine: Any
    lock: threading.Lock
    requests: int
    received: int
    refused: int
    fail_marker: str | None
    refuse_every: int
    reply: str | None
    authorizations: list[str]


class FakeChatServer:
    """Start on a free 127.0.0.1 port; use as a context manager (or call ``close``)."""

    def __init__(self, latency: float = 0.2, engine=None, *, fail_marker: str | None = None, refuse_every: int = 0,
                 reply: str | None = None):
        """``fail_marker``: a request whose messages contain it is refused with HTTP 400 (fault injection).
        ``refuse_every``: every N-th request (1: all) gets HTTP 401 with a body that quotes its Authorization
        header. ``reply``: this text answers every request, instead of the engine's."""
        from trace_dspy.testing.fakes import ScriptedEngine

        if latency < 0:
            raise ValueError("latency must be >= 0")
        if refuse_every < 0:
            raise ValueError("refuse_every must be >= 0")
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.latency = latency
        self._server.engine = engine or ScriptedEngine()
        self._server.lock = threading.Lock()
        self._server.requests = 0
        self._server.received = 0
        self._server.refused = 0
        self._server.fail_marker = fail_marker
        self._server.refuse_every = refuse_every
        self._server.reply = reply
        self._server.authorizations = []
        self._thread = threading.Thread(target=self._server.serve_forever, name="fake-chat-server", daemon=True)
        self._thread.start()

    @property
    def api_base(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/v1"

    @property
    def requests(self) -> int:
        return self._server.requests

    @property
    def refused(self) -> int:
        """Requests refused: those that carried the fail marker, and the 401s of ``refuse_every``."""
        return self._server.refused

    @property
    def authorizations(self) -> list[str]:
        """The Authorization header of every answered request, in order."""
        return list(self._server.authorizations)

    @property
    def engine(self):
        return self._server.engine

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> FakeChatServer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
