"""respond --engine spark: the program's MLflow model through spark_udf in Spark local mode, against a
latency-bound fake OpenAI-compatible server with injected faults."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from conftest import compile_fast, echo_reply
from trace_dspy.testing.fakes import ScriptedEngine
from trace_dspy.testing.server import FakeChatServer

pytestmark = pytest.mark.slow

N = 60
FAULTY = {11, 37}  # the server refuses these rows' requests
EMPTY = {23}  # not a dialogue: refused before Spark


def _skip_without_spark():
    pytest.importorskip("pyspark", reason="the spark extra is not installed")
    if shutil.which("java") is None:
        pytest.skip("no Java on PATH")


def _input(path):
    lines = []
    for i in range(N):
        if i in EMPTY:
            turns = []
        elif i in FAULTY:
            turns = [f"This one carries a FAULT marker, row {i}."]
        else:
            turns = [f"I finally finished the garden shed, row {i}."]
        lines.append(json.dumps({"id": f"r{i:02d}", "turns": turns}))
    path.write_text("\n".join(lines) + "\n")


def test_a_spark_batch_keeps_every_row_in_order_with_error_rows(tmp_path, monkeypatch):
    _skip_without_spark()
    from trace_dspy.cli.respond import main

    compile_fast(tmp_path, monkeypatch, trace=False)
    for var in ("TRACE_DSPY_LM", "TRACE_DSPY_API_BASE", "TRACE_DSPY_API_KEY_ENV", "TRACE_DSPY_TIMEOUT",
                "TRACE_DSPY_LM_CACHE", "SPARK_LOCAL_IP"):
        monkeypatch.delenv(var, raising=False)
    _input(tmp_path / "in.jsonl")
    monkeypatch.setenv("FAKE_SPARK_KEY", "unused")
    with FakeChatServer(latency=0.02, engine=ScriptedEngine(responder=echo_reply), fail_marker="FAULT") as server:
        argv = ["--engine", "spark", "--spark-master", "local[2]", "--partitions", "4",
                "--program", str(tmp_path / "artifacts/trace-dspy/v0001"), "--input", "in.jsonl",
                "--output", "out.jsonl", "--lm", "openai/fake", "--api-base", server.api_base,
                "--api-key-env", "FAKE_SPARK_KEY"]
        assert main(argv) == 1  # some rows failed, and the exit status says so
        rows = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
        assert [r["id"] for r in rows] == [f"r{i:02d}" for i in range(N)]  # every row, in input order
        for i, row in enumerate(rows):
            if i in EMPTY:
                assert "dialogue is empty" in row["error"] and "response" not in row
            elif i in FAULTY:
                assert "refused" in row["error"] and "response" not in row
            else:
                # Each reply carries its own row's words: no row got another row's answer.
                assert "error" not in row and f"row {i}." in row["response"], row
                assert row["stages"]["emotion"] and row["dialogue"].startswith("Speaker: ")
        assert server.refused >= len(FAULTY) and set(server.authorizations) == {"Bearer unused"}
        calls_before = server.requests + server.refused
        # The LM settings reached the workers through Spark's executor environment, not this process's.
        assert not {"TRACE_DSPY_LM", "TRACE_DSPY_API_BASE", "TRACE_DSPY_TIMEOUT", "SPARK_LOCAL_IP"} & set(os.environ)

        # A rerun keeps the answered rows and asks only the failed ones again.
        assert main(argv) == 1
        again = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
        assert again == rows
        asked = server.requests + server.refused - calls_before
        assert len(FAULTY) <= asked <= len(FAULTY) * 4  # the failed rows only (retried, refused again)
