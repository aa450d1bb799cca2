"""Throughput of the plain batch command against Spark local mode, on the same items and the same
latency-bound fake LM server, so that the LM's wait (not its compute) is what each engine has to hide.

The program is the uncompiled four-stage program without the emotion prior, Best-of-N or retrieval
(each of which would add CPU work on this machine's two cores), saved as an artifact and, for Spark,
as the MLflow pyfunc model that ``compile`` logs. DSPy's answer cache is off on both sides.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trace_dspy.core.tables import markdown_table

KEY_VAR = "TRACE_DSPY_SCALE_FAKE_KEY"


def _artifact(root: Path) -> Path:
    from trace_dspy.core.config import ProgramConfig
    from trace_dspy.lm.specs import LMConfig
    from trace_dspy.program.pipeline import TraceProgram
    from trace_dspy.store.artifacts import save_artifact

    config = ProgramConfig(prior_k=0, best_of=1, retrieval={"enabled": False})
    return save_artifact(TraceProgram(config), {"config": {"program": config.to_dict(), "lm": LMConfig().to_dict()}},
                         name="scale-bench", root=root)


def measure_scale(dialogues: Sequence[str], *, latency: float = 0.2, threads: Sequence[int] = (1, 2),
                  master: str = "local[2]", partitions: int | None = None) -> dict[str, Any]:
    from trace_dspy.lm.specs import LMConfig, LMSpec
    from trace_dspy.store.artifacts import load_folder
    from trace_dspy.testing.server import FakeChatServer
    from trace_dspy.workflows.batch import respond_batch
    from trace_dspy.workflows.serving import save_program_model
    from trace_dspy.workflows.spark import lm_environment, respond_spark, spark_session

    os.environ.setdefault(KEY_VAR, "unused")
    result: dict[str, Any] = {"items": len(dialogues), "latency_s": latency, "master": master, "runs": []}
    with tempfile.TemporaryDirectory(prefix="trace-scale-") as tmp, FakeChatServer(latency=latency) as server:
        tmp = Path(tmp)
        folder = _artifact(tmp / "artifacts")
        source = tmp / "in.jsonl"
        source.write_text("".join(json.dumps({"id": f"d{i}", "dialogue": d}) + "\n" for i, d in enumerate(dialogues)))
        lm_config = LMConfig(default=LMSpec(model="openai/fake", api_base=server.api_base, api_key_env=KEY_VAR,
                                            cache=False))
        for n in threads:
            loaded = load_folder(folder, lm_config=lm_config)
            before = server.requests
            start = time.perf_counter()
            report = respond_batch(loaded.program, source, tmp / f"plain-{n}.jsonl", threads=n, lm=loaded.lms.default)
            wall = time.perf_counter() - start
            result["runs"].append({"engine": f"plain batch, --threads {n}", "wall_s": wall, "startup_s": 0.0,
                                   "answered": report.answered, "failed": report.failed,
                                   "lm_calls": server.requests - before, "dialogues_per_s": len(dialogues) / wall})
        start = time.perf_counter()
        model_dir = save_program_model(folder, tmp / "model")
        started_model = time.perf_counter()
        spark = spark_session(master, executor_env=lm_environment(lm_config))
        session_s = time.perf_counter() - started_model
        try:
            before = server.requests
            start_job = time.perf_counter()
            first: list[float] = []
            report = respond_spark(source, tmp / "spark.jsonl", str(model_dir), spark=spark, partitions=partitions,
                                   on_row=lambda rec: first or first.append(time.perf_counter()))
            done = time.perf_counter()
        finally:
            spark.stop()
        result["runs"].append({
            "engine": f"Spark {master}", "wall_s": done - start, "startup_s": started_model - start + session_s,
            "model_save_s": started_model - start, "session_start_s": session_s,
            "first_row_s": (first[0] - start_job) if first else None, "job_s": done - start_job,
            "answered": report.answered, "failed": report.failed, "lm_calls": server.requests - before,
            "dialogues_per_s": len(dialogues) / (done - start),
            "dialogues_per_s_after_startup": len(dialogues) / (done - start_job)})
        plain = json.loads((tmp / f"plain-{threads[0]}.jsonl").read_text().splitlines()[0])
        spark_first = json.loads((tmp / "spark.jsonl").read_text().splitlines()[0])
        result["same_first_reply"] = plain.get("response") == spark_first.get("response")
    calls = [r["lm_calls"] / max(1, r["answered"]) for r in result["runs"]]
    result["lm_calls_per_dialogue"] = sum(calls) / len(calls)
    return result


def project(result: dict[str, Any], *, hosted_latency_s: float = 1.0, executors: Sequence[int] = (1, 4, 16, 64),
            slots_per_executor: int = 4, rate_limits_rpm: Sequence[int] = (500, 10_000)) -> list[dict[str, Any]]:
    """Throughput on paper for N executors against a hosted LM with a requests-per-minute limit.

    Inputs: the measured LM calls per dialogue, and an assumed hosted latency per call (an input,
    recorded with the rows, not a measurement). Each task slot runs one dialogue at a time, so it
    finishes one every ``calls x latency`` seconds; the provider's limit caps the whole cluster at
    ``rpm / 60 / calls`` dialogues per second.
    """
    calls, latency = result["lm_calls_per_dialogue"], hosted_latency_s
    per_slot = 1.0 / (calls * latency)
    rows = []
    for n in executors:
        for rpm in rate_limits_rpm:
            compute = n * slots_per_executor * per_slot
            cap = rpm / 60.0 / calls
            rows.append({"executors": n, "slots": n * slots_per_executor, "rate_limit_rpm": rpm,
                         "assumed_latency_s": latency, "lm_calls_per_dialogue": calls,
                         "unlimited_dialogues_per_s": compute, "dialogues_per_s": min(compute, cap),
                         "bound": "LM rate limit" if cap < compute else "executors"})
    return rows


def scale_markdown(result: dict[str, Any]) -> str:
    rows = []
    for r in result["runs"]:
        rows.append([r["engine"], f"{r['wall_s']:.1f}", f"{r['startup_s']:.1f}", f"{r['dialogues_per_s']:.2f}",
                     f"{r.get('dialogues_per_s_after_startup', r['dialogues_per_s']):.2f}",
                     str(r["answered"]), str(r["failed"]), str(r["lm_calls"])])
    table = markdown_table(["engine", "wall s", "startup s", "dialogues/s", "dialogues/s after startup", "answered",
                            "failed", "LM calls"], rows)
    lines = [table, "", f"{result['items']} dialogues, fake server latency {result['latency_s']} s per call, "
             f"{result['lm_calls_per_dialogue']:.1f} LM calls per dialogue; same first reply on both engines: "
             f"{result['same_first_reply']}.", ""]
    projection = result.get("projection") or []
    if projection:
        lines += [f"On paper: 4 task slots per executor, {projection[0]['assumed_latency_s']:g} s per hosted LM call "
                  f"(assumed), {projection[0]['lm_calls_per_dialogue']:.1f} calls per dialogue (measured):", ""]
    paper = [[str(p["executors"]), str(p["rate_limit_rpm"]), f"{p['unlimited_dialogues_per_s']:.1f}",
              f"{p['dialogues_per_s']:.1f}", p["bound"]] for p in projection]
    if paper:
        lines.append(markdown_table(["executors", "LM limit (requests/min)", "dialogues/s without the limit",
                                     "dialogues/s", "bound by"], paper))
    return "\n".join(lines)


__all__ = ["measure_scale", "project", "scale_markdown"]
