"""The MLflow UI, in a real browser, shows what a compile logged.

Two small compiles (fake LM) write to a fresh sqlite store; ``mlflow ui`` serves
it on a free loopback port; headless Chromium (Debian's ``chromium``) renders
the runs list and each run's page, and writes screenshots to the test's temp
dir. The pages are React: Chromium's ``--dump-dom`` after a virtual-time budget
gives the DOM once the app has fetched and drawn the runs.

Marked ``browser``. Without Chromium it is skipped locally and fails in CI
(``CI`` set), where ``.ci/run`` installs it.
"""

from __future__ import annotations

import html
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

import trace_dspy.lm.specs as lms_module
from trace_dspy.cli.compile import config_from_args
from trace_dspy.testing.fakes import fake_lm
from trace_dspy.workflows.compiling import run_compile

pytestmark = pytest.mark.browser

EXPERIMENT = "trace-dspy"
RUN_NAMES = ("compile trace-dspy labeled", "compile trace-dspy bootstrap")
METRICS = ("dev_before/empathy", "dev_after/empathy", "dev_delta/empathy", "dev_after/rules")


def find_chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    return None


@pytest.fixture(scope="module")
def chromium() -> str:
    path = find_chromium()
    if path is None:
        if os.environ.get("CI"):
            pytest.fail("headless Chromium is required in CI (.ci/run installs Debian's chromium)")
        pytest.skip("Chromium is not installed (apt-get install chromium); CI installs it and runs this test")
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_ok(url: str) -> bool:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=5) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError):
        return False


class UIServer:
    """``mlflow ui`` in its own process group, so that all its workers stop together."""

    def __init__(self, store_uri: str, log: Path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
        env["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"  # no fetch of LiteLLM's price list
        self.log = log
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", store_uri, "--host", "127.0.0.1",
             "--port", str(self.port), "--workers", "1"],
            stdout=log.open("wb"), stderr=subprocess.STDOUT, env=env, start_new_session=True,
        )

    def wait_ready(self, deadline_s: float = 300) -> None:
        give_up = time.monotonic() + deadline_s
        while time.monotonic() < give_up:
            if self.proc.poll() is not None:
                pytest.fail(f"mlflow ui exited with {self.proc.returncode}:\n{self.log.read_text()[-3000:]}")
            if http_ok(self.url + "/health"):
                return
            time.sleep(1)
        pytest.fail(f"mlflow ui did not answer on {self.url}:\n{self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)


def page_text(dom: str) -> str:
    dom = re.sub(r"<(script|style)\b.*?</\1>", " ", dom, flags=re.DOTALL | re.IGNORECASE)
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", dom)).split())


def render(chromium: str, url: str, screenshot: Path, workdir: Path, expect: list[str], tries: int = 3,
           size: tuple[int, int] = (1400, 1800)) -> str:
    """The page's visible text after the app has drawn it; retried while an expected string is missing."""
    text = ""
    for attempt in range(tries):
        profile = workdir / f"profile-{screenshot.stem}-{attempt}"
        run = subprocess.run(
            [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic",
             "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--no-proxy-server", "--hide-scrollbars", f"--user-data-dir={profile}", f"--window-size={size[0]},{size[1]}",
             f"--virtual-time-budget={15000 * (attempt + 1)}", f"--screenshot={screenshot}", "--dump-dom", url],
            capture_output=True, text=True, timeout=180, check=False,
        )
        shutil.rmtree(profile, ignore_errors=True)
        text = page_text(run.stdout)
        if all(s in text for s in expect):
            return text
    missing = [s for s in expect if s not in text]
    pytest.fail(f"{url} lacks {missing} after {tries} renders; page text: {text[:1500]!r}")


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return struct.unpack(">II", data[16:24])


@pytest.fixture
def store(monkeypatch, tmp_path):
    """A sqlite store holding two compile runs (labeled, then bootstrap) made with a fake LM."""
    lm, _ = fake_lm(lambda outputs, inputs: {"emotion": "joyful"} if "!" in inputs.get("dialogue", "") else {})
    monkeypatch.setattr(lms_module, "build_lm", lambda spec: lm)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TRACE_DSPY_DATA", raising=False)
    config = tmp_path / "fast.toml"
    config.write_text('[metric]\nsimilarity_kind = "token_f1"\n')
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    for optimizer in ("labeled", "bootstrap"):
        run_compile(config_from_args(["--optimizer", optimizer, "--train", "3", "--dev", "3", "--threads", "1",
                                      "--tracking-uri", uri, "--artifacts-dir", str(tmp_path / "artifacts"),
                                      "--config", str(config)]))
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name(EXPERIMENT)
    runs = {r.info.run_name: r for r in client.search_runs(
        [experiment.experiment_id], filter_string="tags.`trace_dspy.kind` = 'compile'")}
    assert set(runs) == set(RUN_NAMES)
    return uri, experiment.experiment_id, runs


def test_the_ui_shows_the_experiment_the_compile_runs_and_their_metrics(chromium, store, tmp_path):
    uri, experiment_id, runs = store
    server = UIServer(uri, tmp_path / "mlflow-ui.log")
    try:
        server.wait_ready()
        runs_shot = tmp_path / "mlflow-runs.png"
        text = render(chromium, f"{server.url}/#/experiments/{experiment_id}/runs", runs_shot, tmp_path,
                      [EXPERIMENT, *RUN_NAMES])
        # Two compile runs, each with its two child evaluation runs (dev before, dev after).
        assert "6 matching runs" in text
        for name, run in runs.items():
            shot = tmp_path / f"mlflow-run-{name.rsplit(' ', 1)[1]}.png"
            text = render(chromium, f"{server.url}/#/experiments/{experiment_id}/runs/{run.info.run_id}", shot,
                          tmp_path, [name, *METRICS])
            for metric in METRICS:
                shown = re.search(re.escape(metric) + r" (-?[0-9.]+(?:e-?\d+)?)", text)
                assert shown, f"{metric} has no value on the page of {name}"
                assert float(shown.group(1)) == pytest.approx(run.data.metrics[metric], abs=1e-9), metric
            assert png_size(shot) == (1400, 1800)
    finally:
        server.stop()
    assert png_size(runs_shot) == (1400, 1800) and runs_shot.stat().st_size > 20_000
