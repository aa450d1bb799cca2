"""Bounded work on hostile artifacts, config files and weight files.

Each attack is planted here: LM settings that would let one call run for days
(in a manifest, a config file, a flag, the serving environment), a malformed
``[lm.local]`` table, artifact files that are FIFOs, links to ``/dev/zero`` or
to files outside the artifact, ``.npz`` files that inflate far past their size
or hold the wrong JSON or dtypes, and damaged BM25 arrays. Every one must end
as one line naming the file or field, exit code 2 from ``respond``, before any
model call. Commands that could hang or read without end on a vulnerable
build run in a subprocess with a 60 s timeout and a memory cap, so such a
build fails the test instead of blocking the suite.
"""

from __future__ import annotations

import json
import math
import os
import resource
import secrets
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest

import trace_dspy
import trace_dspy.lm.specs as lms_module
from trace_dspy import ProgramConfig, TraceProgram
from trace_dspy.store.artifacts import ArtifactError, save_artifact
from trace_dspy.testing.fakes import fake_lm

REPO = Path(__file__).resolve().parents[1]
SHIPPED_PRIOR = REPO / "trace_dspy/program/emotion_prior.npz"
NO_PRIOR = ProgramConfig(prior_k=0).to_dict()
# Generous: a refused file takes about 2 s here; a hang or an endless read never returns.
HANG_TIMEOUT = 60
# A cap on the child's address space, so that an endless read fails there instead of filling the machine.
CHILD_MEMORY = 4 * 1024**3

PLANTED = [1e6, -1, "3", True, float("nan"), float("inf"), 1e308]
BOUNDS = {"num_retries": "from 0 to 10", "timeout": "at most 600"}


def echo(outputs, inputs):
    if "response" in outputs:
        return {"response": "heard: " + inputs["dialogue"].splitlines()[-1]}
    return {}


@pytest.fixture(scope="module")
def index():
    from trace_dspy.data.retrieval import ExemplarIndex, RetrievalConfig
    from trace_dspy.data.sources import load_splits, resolve_source

    return ExemplarIndex.build(load_splits(resolve_source(None, announce_seed=False)).train[:20], RetrievalConfig())


def make_artifact(root: Path, *, lm: dict | None = None, index=None, prior: bool = False) -> Path:
    """A saved artifact under ``root`` (a fresh folder each call), optionally with an index and the shipped prior."""
    extra: dict = {}
    if index is not None:
        extra["retrieval"] = {"index": "index"}
    if prior:
        extra["emotion_prior"] = {"file": "emotion_prior.npz"}
    folder = save_artifact(TraceProgram(ProgramConfig(prior_k=0)),
                           {"config": {"program": NO_PRIOR, "lm": lm if lm is not None else {}}, **extra},
                           root=root / secrets.token_hex(4))
    if index is not None:
        index.save(folder / "index")
    if prior:
        shutil.copyfile(SHIPPED_PRIOR, folder / "emotion_prior.npz")
    return folder


def one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert "Traceback" not in err, err[-3000:]
    assert len(lines) == 1, err[-3000:]
    return lines[0]


@pytest.fixture
def respond(monkeypatch, capsys):
    """``respond`` in this process with a fake model: (exit code, the one stderr line, the model's calls)."""
    from trace_dspy.cli.respond import main

    lm, engine = fake_lm(echo)
    monkeypatch.setattr(lms_module, "build_lm", lambda spec: lm)
    monkeypatch.setenv("OPENAI_API_KEY", "unused-key-value")
    for name in ("TRACE_DSPY_LM", "TRACE_DSPY_API_BASE", "TRACE_DSPY_API_KEY_ENV", "TRACE_DSPY_TIMEOUT",
                 "TRACE_DSPY_LM_CACHE"):
        monkeypatch.delenv(name, raising=False)

    def run(*argv: str) -> tuple[int, str, list]:
        capsys.readouterr()
        rc = main(list(argv))
        err = capsys.readouterr().err
        return rc, one_line(err) if rc else err, engine.calls

    return run


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (CHILD_MEMORY, CHILD_MEMORY))


def respond_child(tmp_path: Path, *argv: str) -> tuple[int, str]:
    """``respond`` in a subprocess with a fake model, capped in time and memory: (exit code, stderr)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "TRACE_DSPY_ARTIFACTS": str(tmp_path / "no-artifacts"),
           "TRACE_DSPY_CACHE": str(tmp_path / "cache"), "DSPY_CACHEDIR": str(tmp_path / "dspy-cache")}
    env.pop("TRACE_DSPY_DATA", None)
    started = time.monotonic()
    try:
        proc = subprocess.run([sys.executable, str(REPO / "tests/fake_cli.py"), "trace_dspy.cli.respond", *argv],
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=HANG_TIMEOUT,
                              preexec_fn=_limit_memory)
    except subprocess.TimeoutExpired:
        pytest.fail(f"respond {' '.join(argv)} did not return within {HANG_TIMEOUT} s")
    assert time.monotonic() - started < HANG_TIMEOUT
    return proc.returncode, proc.stderr


# ---------------------------------------------------------------- how long a call may run


def test_planted_retry_and_timeout_values_are_refused_before_any_model_call(tmp_path, respond):
    for field in ("num_retries", "timeout"):
        for value in PLANTED:
            for lm in ({"default": {"model": "openai/x", field: value}},
                       {"default": {"model": "openai/x"}, "stages": {"response": {"model": "openai/y", field: value}}},
                       {"default": {"model": "openai/x"}, "judge": {"model": "openai/y", field: value}}):
                folder = make_artifact(tmp_path, lm=lm)
                with pytest.raises(ArtifactError) as info:
                    trace_dspy.load(str(folder))
                err = info.value
                assert (err.file, err.field) == (str(folder / "manifest.json"), "config.lm"), str(err)
                assert field in err.reason and BOUNDS[field] in err.reason, str(err)
            # respond --program: exit 2, one line naming the file, the field and the bound; no model call.
            rc, line, calls = respond("--program", str(folder), "I lost my job today.")
            assert rc == 2 and str(folder / "manifest.json") in line and field in line and BOUNDS[field] in line, line
            assert calls == []
        # The pyfunc model (mlflow.pyfunc.load_model, mlflow models serve) loads the folder the same way.
        from types import SimpleNamespace

        from trace_dspy.workflows.serving import ARTIFACT_KEY, TraceModel

        folder = make_artifact(tmp_path, lm={"default": {"model": "openai/x", field: 1e6}})
        with pytest.raises(ArtifactError) as info:
            TraceModel().load_context(SimpleNamespace(artifacts={ARTIFACT_KEY: str(folder)}))
        assert field in info.value.reason and BOUNDS[field] in info.value.reason


def _toml(value) -> str:
    """A TOML value (inline tables and arrays for nested ones)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(map(_toml, value)) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {_toml(v)}" for k, v in value.items()) + "}"
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else "inf"
    return repr(value)


def test_config_files_flags_and_the_serving_environment_are_bounded_alike(tmp_path, respond):
    from trace_dspy.workflows.serving import ServingConfigError, lm_config_from_env

    for field in ("num_retries", "timeout"):
        for value in PLANTED:
            config = tmp_path / f"{field}-{secrets.token_hex(3)}.toml"
            config.write_text(f"[program]\nprior_k = 0\n[lm]\nmodel = \"openai/x\"\n{field} = {_toml(value)}\n")
            rc, line, calls = respond("--config", str(config), "I lost my job today.")
            assert rc == 2 and field in line and BOUNDS[field] in line, (value, line)
            assert calls == []
    (tmp_path / "plain.toml").write_text("[program]\nprior_k = 0\n")
    for value in ("1e6", "inf", "1e308"):
        rc, line, calls = respond("--config", str(tmp_path / "plain.toml"), "--lm", "openai/x", "--timeout", value,
                                  "I lost my job today.")
        assert rc == 2 and "timeout" in line and "at most 600" in line and calls == [], line
    for value in ("1e6", "inf", "nan", "-1", "soon"):
        with pytest.raises(ServingConfigError) as info:
            lm_config_from_env({"TRACE_DSPY_LM": "openai/x", "TRACE_DSPY_TIMEOUT": value})
        assert "TRACE_DSPY_TIMEOUT" in str(info.value) and "\n" not in str(info.value)
    assert lm_config_from_env({"TRACE_DSPY_LM": "openai/x", "TRACE_DSPY_TIMEOUT": "600"}).default.timeout == 600


MALFORMED_LOCAL = [
    ({"n_ctx": "big"}, "local.n_ctx"),
    ({"n_ctx": 10**9}, "local.n_ctx"),
    ({"n_threads": 1.5}, "local.n_threads"),
    ({"seed": {"nested": [1, {"deeper": [2]}]}}, "local.seed"),
    ({"loop_guard": "yes"}, "local.loop_guard"),
    ({"sample_min_p": float("nan")}, "local.sample_min_p"),
    ({"quote_fields": {"trigger_spans": {"nested": 1}}}, "local.quote_fields"),
    ({"text_limits": {"reasoning": -5}}, "local.text_limits"),
    ({"model_path": "/etc/passwd"}, "unknown key"),
    ({"junk": {"a": [1, 2, {"b": "c"}]}}, "unknown key"),
    ([1, 2], "local: expected a table"),
    ("n_ctx=1", "local: expected a table"),
]


def test_a_malformed_local_table_is_one_error_naming_the_field(tmp_path, respond):
    for local, where in MALFORMED_LOCAL:
        folder = make_artifact(tmp_path, lm={"default": {"model": "local", "local": local}})
        with pytest.raises(ArtifactError) as info:
            trace_dspy.load(str(folder))
        assert info.value.field == "config.lm" and where in info.value.reason, str(info.value)
        rc, line, calls = respond("--program", str(folder), "hello there")
        assert rc == 2 and where in line and calls == [], line
        # The same table in a config file.
        table = ("[lm.local]\n" + "".join(f"{json.dumps(k)} = {_toml(v)}\n" for k, v in local.items())
                 if isinstance(local, dict) else f"[lm]\nlocal = {_toml(local)}\n")
        config = tmp_path / f"local-{secrets.token_hex(3)}.toml"
        config.write_text("[program]\nprior_k = 0\n\n" + table)
        rc, line, calls = respond("--config", str(config), "hello there")
        assert rc == 2 and where in line and calls == [], (config.read_text(), line)
    # Tables of the wrong shape elsewhere in [lm] are one line too.
    for text, where in (("[lm]\nstages = [1]\n", "[lm.stages]"), ("[lm]\njudge = \"x\"\n", "[lm.judge]"),
                        ("[lm.stages]\nresponse = 3\n", "[lm.stages.response]")):
        (tmp_path / "shape.toml").write_text("[program]\nprior_k = 0\n" + text)
        rc, line, calls = respond("--config", str(tmp_path / "shape.toml"), "hello there")
        assert rc == 2 and where in line and calls == [], line


def test_an_api_base_from_an_artifact_is_checked_for_type_and_length(tmp_path, respond):
    for api_base, reason in ((5, "found int"), (["http://127.0.0.1:9/v1"], "found list"),
                             ({"url": "x"}, "found dict"), ("http://127.0.0.1:9/" + "a" * 5000, "2048 characters")):
        folder = make_artifact(tmp_path, lm={"default": {"model": "openai/x", "api_base": api_base}})
        for trust in (False, True):
            with pytest.raises(ArtifactError) as info:
                trace_dspy.load(str(folder), trust_lm=trust)
            assert info.value.field == "config.lm" and "api_base" in info.value.reason, str(info.value)
            assert reason in info.value.reason
        rc, line, calls = respond("--program", str(folder), "--trust-artifact-lm", "hello there")
        assert rc == 2 and "api_base" in line and len(line) < 400 and calls == [], line


# ---------------------------------------------------------------- files checked before they are read


ARTIFACT_FILES = ["manifest.json", "program.json", "emotion_prior.npz", "index/items.json",
                  "index/bm25/params.index.json", "index/bm25/vocab.index.json", "index/bm25/data.csc.index.npy",
                  "index/bm25/indices.csc.index.npy", "index/bm25/indptr.csc.index.npy"]


@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
def test_an_artifact_file_that_is_a_fifo_or_a_device_is_refused_quickly(tmp_path, index, kind):
    for rel in ARTIFACT_FILES:
        folder = make_artifact(tmp_path, index=index, prior=True)
        target = folder / rel
        target.unlink()
        if kind == "fifo":
            os.mkfifo(target)
        else:
            target.symlink_to("/dev/zero")
        rc, err = respond_child(tmp_path, "--program", str(folder), "I lost my job today.")
        line = one_line(err)
        assert rc == 2 and str(target) in line, (rel, line)
        assert ("FIFO" if kind == "fifo" else "character device") in line, (rel, line)


def test_an_artifact_file_that_leads_outside_its_folder_is_refused(tmp_path, index, respond):
    for rel in ARTIFACT_FILES:
        folder = make_artifact(tmp_path, index=index, prior=True)
        target = folder / rel
        # The very same bytes, but kept elsewhere: only the location is wrong.
        outside = tmp_path / "elsewhere" / secrets.token_hex(4) / target.name
        outside.parent.mkdir(parents=True)
        shutil.move(target, outside)
        target.symlink_to(outside)
        with pytest.raises(ArtifactError) as info:
            trace_dspy.load(str(folder))
        assert str(target) in str(info.value) and "outside" in str(info.value), (rel, str(info.value))
        rc, line, calls = respond("--program", str(folder), "I lost my job today.")
        assert rc == 2 and str(target) in line and calls == [], (rel, line)
    # A link that stays inside the folder and leads to a regular file is fine.
    folder = make_artifact(tmp_path, index=index, prior=True)
    (folder / "program.json").rename(folder / "program.real.json")
    (folder / "program.json").symlink_to("program.real.json")
    assert trace_dspy.load(str(folder), attach_lms=False)


# ---------------------------------------------------------------- .npz files


def write_npz(path: Path, members: dict) -> Path:
    """An .npz whose members are arrays or (shape, dtype, payload bytes) written as given, streamed."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, value in members.items():
            with archive.open(f"{name}.npy", "w", force_zip64=True) as fh:
                if isinstance(value, np.ndarray):
                    np.lib.format.write_array(fh, value, allow_pickle=True)
                    continue
                shape, dtype, payload = value
                np.lib.format.write_array_header_1_0(fh, {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)),
                                                          "fortran_order": False, "shape": shape})
                for chunk in payload:
                    fh.write(chunk)
    return path


def zeros(nbytes: int, chunk: int = 1 << 20):
    while nbytes > 0:
        yield bytes(min(chunk, nbytes))
        nbytes -= chunk


def header_array(value) -> np.ndarray:
    data = value if isinstance(value, bytes) else json.dumps(value).encode()
    return np.frombuffer(data, dtype=np.uint8)


def shipped_prior_arrays() -> tuple[dict, dict]:
    with np.load(SHIPPED_PRIOR, allow_pickle=False) as data:
        arrays = {k: data[k] for k in data.files}
    return json.loads(arrays.pop("header").tobytes()), arrays


def test_an_npz_that_inflates_past_its_limit_is_refused_before_inflating(tmp_path, index):
    from trace_dspy.optimize.empathy import Head, ScorerError
    from trace_dspy.optimize.relevance import RelevanceError, RelevanceHead
    from trace_dspy.program.emotion_prior import EmotionPrior, PriorError

    header, arrays = shipped_prior_arrays()
    rows, labels = arrays["weights"].shape
    # Weights that fit the header (more rows than words, one column per label) but take 300 MB of zeros:
    # about 0.3 MB on disk.
    big_rows = 300 * 2**20 // (4 * labels)
    bomb = write_npz(tmp_path / "bomb.npz", {"header": header_array(header), "idf": arrays["idf"],
                                             "bias": arrays["bias"],
                                             "weights": ((big_rows, labels), "<f4", zeros(big_rows * labels * 4))})
    assert bomb.stat().st_size < 2 * 2**20
    with pytest.raises(PriorError) as info:
        EmotionPrior.load(bomb)
    assert str(bomb) in str(info.value) and "inflates to" in str(info.value), str(info.value)
    # The same file in an artifact: ArtifactError, and respond exits 2 with one line naming it.
    folder = make_artifact(tmp_path, prior=True)
    shutil.copyfile(bomb, folder / "emotion_prior.npz")
    with pytest.raises(ArtifactError, match="inflates to"):
        trace_dspy.load(str(folder), attach_lms=False)
    rc, err = respond_child(tmp_path, "--program", str(folder), "I lost my job today.")
    line = one_line(err)
    assert rc == 2 and str(folder / "emotion_prior.npz") in line and "inflates to" in line, line
    # A header that declares more data than the member holds, or a shape that does not match its size.
    for damage in ({"weights": ((10**12, labels), "<f4", [b"\0" * 64])},
                   {"weights": ((rows, labels), "<f4", [b"\0" * 64])}):
        lying = write_npz(tmp_path / f"lying-{secrets.token_hex(3)}.npz",
                          {"header": header_array(header), "idf": arrays["idf"], "bias": arrays["bias"], **damage})
        with pytest.raises(PriorError, match="declares shape"):
            EmotionPrior.load(lying)
    # The scorers' weight files are read through the same checks.
    for loader, error, names in ((Head.load, ScorerError, ("mean", "scale", "weights", "bias")),
                                 (RelevanceHead.load, RelevanceError, ("A", "B", "C", "w", "calibration"))):
        members = {"header": header_array({"feature_version": 1}),
                   **{n: np.zeros(2, np.float32) for n in names[1:]},
                   names[0]: ((big_rows * labels,), "<f4", zeros(big_rows * labels * 4))}
        path = write_npz(tmp_path / f"head-{secrets.token_hex(3)}.npz", members)
        with pytest.raises(error) as info:
            loader(path)
        assert str(path) in str(info.value) and "inflates to" in str(info.value), str(info.value)


def test_a_prior_with_a_header_of_the_wrong_type_or_non_numeric_arrays_is_one_error(tmp_path, respond):
    from trace_dspy.optimize.empathy import Head, ScorerError
    from trace_dspy.optimize.relevance import RelevanceError, RelevanceHead
    from trace_dspy.program.emotion_prior import EmotionPrior, PriorError

    header, arrays = shipped_prior_arrays()
    cases = [
        ({"header": header_array([1, 2, 3])}, "expected a JSON object, found list"),
        ({"header": header_array("a prior")}, "expected a JSON object, found str"),
        ({"header": header_array(42)}, "expected a JSON object, found int"),
        ({"header": header_array(b"[" * 100_000 + b"]" * 100_000)}, "nested more than"),
        ({"header": header_array(b"\xff\xfe not utf-8")}, "not valid UTF-8"),
        ({"header": np.zeros(4, np.float64)}, "expected bytes"),
        ({"header": header_array({**header, "labels": "sad"})}, "labels: expected a list of text"),
        ({"header": header_array({**header, "vocab": [1, 2]})}, "vocab: expected a list of text"),
        ({"header": header_array({**header, "feature_version": [2]})}, "feature version"),
        ({"idf": np.array(["a"] * len(arrays["idf"]))}, "expected numbers"),
        ({"bias": np.array([{"x": 1}] * len(arrays["bias"]), dtype=object)}, "expected numbers"),
        ({"weights": np.full(arrays["weights"].shape, np.nan, np.float32)}, "non-finite"),
    ]
    for damage, reason in cases:
        path = write_npz(tmp_path / f"prior-{secrets.token_hex(3)}.npz",
                         {"header": header_array(header), **arrays, **damage})
        with pytest.raises(PriorError) as info:
            EmotionPrior.load(path)
        message = str(info.value)
        assert str(path) in message and reason in message and "\n" not in message, (reason, message)
        folder = make_artifact(tmp_path, prior=True)
        shutil.copyfile(path, folder / "emotion_prior.npz")
        rc, line, calls = respond("--program", str(folder), "I lost my job today.")
        assert rc == 2 and str(folder / "emotion_prior.npz") in line and reason in line and calls == [], line
    for loader, error, names in ((Head.load, ScorerError, ("mean", "scale", "weights", "bias")),
                                 (RelevanceHead.load, RelevanceError, ("A", "B", "C", "w", "calibration"))):
        for damage, reason in cases[:4] + cases[9:11]:
            members = {"header": header_array({"feature_version": 1}), **{n: np.zeros(2, np.float32) for n in names}}
            key = next(iter(damage))
            members[key if key == "header" else names[0]] = next(iter(damage.values()))
            path = write_npz(tmp_path / f"head-{secrets.token_hex(3)}.npz", members)
            with pytest.raises(error) as info:
                loader(path)
            assert str(path) in str(info.value) and reason in str(info.value), (reason, str(info.value))


# ---------------------------------------------------------------- BM25 arrays


def _npy(path: Path, change) -> None:
    np.save(path, change(np.load(path)), allow_pickle=True)


def _swap_first(a):
    a = a.copy()
    a[1], a[2] = a[2], a[1] + 1
    return a


BM25_DAMAGE = [
    ("data.csc.index.npy", lambda a: a.astype(np.int32), "expected finite scores"),
    ("data.csc.index.npy", lambda a: np.where(np.arange(len(a)) == 3, np.nan, a).astype(a.dtype), "NaN"),
    ("data.csc.index.npy", lambda a: np.where(np.arange(len(a)) == 3, np.inf, a).astype(a.dtype), "infinite"),
    ("data.csc.index.npy", lambda a: a.reshape(1, -1), "one dimension"),
    ("data.csc.index.npy", lambda a: a.astype(str), "expected numbers"),
    ("indices.csc.index.npy", lambda a: np.where(np.arange(len(a)) == 0, -1, a).astype(a.dtype), "document numbers"),
    ("indices.csc.index.npy", lambda a: np.where(np.arange(len(a)) == 0, 10**6, a).astype(a.dtype),
     "document numbers"),
    ("indices.csc.index.npy", lambda a: a[:-1], "document numbers for"),
    ("indices.csc.index.npy", lambda a: a.astype(np.float32), "expected integers"),
    ("indptr.csc.index.npy", _swap_first, "offsets"),
    ("indptr.csc.index.npy", lambda a: a[:-1], "entries for the"),
    ("indptr.csc.index.npy", lambda a: a + 1, "offsets"),
]


def test_damaged_bm25_arrays_are_found_at_load_naming_the_file(tmp_path, index, respond):
    for name, change, reason in BM25_DAMAGE:
        folder = make_artifact(tmp_path, index=index)
        path = folder / "index" / "bm25" / name
        _npy(path, change)
        with pytest.raises(ArtifactError) as info:
            trace_dspy.load(str(folder), attach_lms=False)
        assert str(path) in str(info.value) and reason in str(info.value), (reason, str(info.value))
    for name, change, reason in (
        ("vocab.index.json", lambda v: {**v, "extra-token": 10**6}, "entries for the"),
        ("vocab.index.json", lambda v: dict.fromkeys(v, 0), "token ids"),
        ("vocab.index.json", lambda v: {k: str(i) for k, i in v.items()}, "token ids"),
        ("params.index.json", lambda p: {**p, "num_docs": "many"}, "num_docs"),
        ("params.index.json", lambda p: {**p, "k1": float("nan")}, "k1"),
        ("params.index.json", lambda p: {**p, "method": "bm25+"}, "method"),
        ("params.index.json", lambda p: {**p, "corpus": ["x"]}, "unknown setting"),
        ("params.index.json", lambda p: [p], "expected a JSON object"),
    ):
        folder = make_artifact(tmp_path, index=index)
        path = folder / "index" / "bm25" / name
        path.write_text(json.dumps(change(json.loads(path.read_text()))))
        with pytest.raises(ArtifactError) as info:
            trace_dspy.load(str(folder), attach_lms=False)
        assert str(path) in str(info.value) and reason in str(info.value), (reason, str(info.value))
    # Through respond: exit 2, one line naming the file, before any model call.
    folder = make_artifact(tmp_path, index=index)
    path = folder / "index" / "bm25" / "indices.csc.index.npy"
    _npy(path, lambda a: a * 1000)
    rc, line, calls = respond("--program", str(folder), "I lost my job today.")
    assert rc == 2 and str(path) in line and "document numbers" in line and calls == [], line
    # An undamaged index still loads and answers.
    program = trace_dspy.load(str(make_artifact(tmp_path, index=index)), attach_lms=False)
    assert program.retriever.search("My dog died yesterday.", emotion="sad", k=2)
