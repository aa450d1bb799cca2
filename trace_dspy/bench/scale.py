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

from trace_dspy.core import env as env_vars
from trace_dspy.core.files import MiB, read_text
from trace_dspy.core.tables import markdown_table

KEY_VAR = env_vars.SCALE_FAKE_KEY


def _artifact(root: Path) -> Path:
    from trace_dspy.core.config import ProgramConfig
    from trace_dspy.lm.specs import LMConfig
    from trace_dspy.program.pipeline import TraceProgram
    from trace_dspy.store.artifacts import save_artifact

    config = ProgramConfig(prior_k=0, best_of=1, retrieval={"enabled": False})
    return save_artifact(TraceProgram(config), {"config": {"program": config.to_dict(), "lm": LMConfig().to_dict()}},
                         name="scale-bench", root=root)


def measure_scale(dialogues: Sequence[str], *, latency: float = 0.2, threads: Sequence[int] = (1, 2),
                  master: str = "local[2]", partitions: int | None = None,
                  task_threads: Sequence[int] = (1,)) -> dict[str, Any]:
    """Each plain batch thread count, then one Spark session running the batch once per ``task_threads``
    value (rows one Spark task answers at once, ``TRACE_DSPY_THREADS``)."""
    from trace_dspy.lm.specs import LMConfig, LMSpec
    from trace_dspy.testing.server import FakeChatServer
    from trace_dspy.workflows.batch import respond_batch
    from trace_dspy.workflows.loading import load_for_run
    from trace_dspy.workflows.serving import save_program_model
    from trace_dspy.workflows.settings import Settings
    from trace_dspy.workflows.spark import lm_environment

    os.environ.setdefault(KEY_VAR, "unused")
    result: dict[str, Any] = {"items": len(dialogues), "latency_s": latency, "master": master, "runs": []}
    with tempfile.TemporaryDirectory(prefix="trace-scale-") as tmp, FakeChatServer(latency=latency) as server:
        tmp = Path(tmp)
        folder = _artifact(tmp / "artifacts")
        source = tmp / "in.jsonl"
        # file-audit: writes the bench's own input file in its temporary folder
        source.write_text("".join(json.dumps({"id": f"d{i}", "dialogue": d}) + "\n" for i, d in enumerate(dialogues)))
        lm_config = LMConfig(default=LMSpec(model="openai/fake", api_base=server.api_base, api_key_env=KEY_VAR,
                                            cache=False))
        for n in threads:
            loaded = load_for_run(str(folder), Settings(lm=lm_config, lm_explicit=True))
            before = server.requests
            start = time.perf_counter()
            report = respond_batch(loaded.program, source, tmp / f"plain-{n}.jsonl", threads=n, lm=loaded.lms.default)
            wall = time.perf_counter() - start
            result["runs"].append({"engine": f"plain batch, --threads {n}", "wall_s": wall, "startup_s": 0.0,
                                   "answered": report.answered, "failed": report.failed,
                                   "lm_calls": server.requests - before, "dialogues_per_s": len(dialogues) / wall})
        start = time.perf_counter()
        model_dir = save_program_model(folder, tmp / "model")
        model_save_s = time.perf_counter() - start
        env = lm_environment(lm_config)
        for n in task_threads:
            result["runs"].append(_spark_run(source, tmp / f"spark-{n}.jsonl", model_dir, server, master=master,
                                             env={**env, env_vars.THREADS: str(n)}, partitions=partitions,
                                             model_save_s=model_save_s, items=len(dialogues), task_threads=n))
        plain = _first_row(tmp / f"plain-{threads[0]}.jsonl")
        spark_first = _first_row(tmp / f"spark-{task_threads[0]}.jsonl")
        result["same_first_reply"] = plain.get("response") == spark_first.get("response")
    calls = [r["lm_calls"] / max(1, r["answered"]) for r in result["runs"]]
    result["lm_calls_per_dialogue"] = sum(calls) / len(calls)
    return result


def _first_row(path: Path) -> dict:
    """The first row of an output the bench's own runs wrote (checked and bounded as every read is)."""
    return json.loads(read_text(path, max_bytes=512 * MiB).splitlines()[0])


def _spark_run(source: Path, output: Path, model_dir, server, *, master: str, env: dict[str, str],
               partitions: int | None, model_save_s: float, items: int, task_threads: int) -> dict[str, Any]:
    """One Spark session answering ``source``, timed from its start.

    The thread count travels in the executor environment, which is fixed when a session starts: one
    session per ``task_threads`` value.
    """
    from trace_dspy.workflows.spark import respond_spark, spark_session

    started = time.perf_counter()
    spark = spark_session(master, executor_env=env)
    session_s = time.perf_counter() - started
    slots = partitions or spark.sparkContext.defaultParallelism
    try:
        before = server.requests
        start_job = time.perf_counter()
        report = respond_spark(source, output, str(model_dir), spark=spark, partitions=partitions)
        done = time.perf_counter()
    finally:
        spark.stop()
    n = task_threads
    return {
        "engine": f"Spark {master}, {n} thread{'s' if n > 1 else ''} per task",
        "wall_s": done - started + model_save_s, "startup_s": session_s + model_save_s,
        "model_save_s": model_save_s, "session_start_s": session_s, "job_s": done - start_job,
        "answered": report.answered, "failed": report.failed, "lm_calls": server.requests - before,
        "slots": slots, "task_threads": n,
        "dialogues_per_s": items / (done - started + model_save_s),
        "dialogues_per_s_after_startup": items / (done - start_job)}


def project(result: dict[str, Any], *, hosted_latency_s: float = 1.0, executors: Sequence[int] = (1, 4, 16, 64),
            slots_per_executor: int = 2, rate_limits_rpm: Sequence[int] = (500, 10_000)) -> list[dict[str, Any]]:
    """Throughput on paper for N executors against a hosted LM with a requests-per-minute limit.

    Inputs: the measured LM calls per dialogue; the measured efficiency of the fastest Spark run (its
    rate after startup over the rate its concurrency would reach if only the LM's wait counted: slots x
    threads / (calls x latency)); and an assumed hosted latency per call (an input, recorded with the
    rows, not a measurement). An executor with ``slots_per_executor`` cores runs slots x threads
    dialogues at once; the provider's limit caps the whole cluster at ``rpm / 60 / calls`` dialogues
    per second, however many executors there are.
    """
    calls = result["lm_calls_per_dialogue"]
    spark_runs = [r for r in result["runs"] if r.get("slots")]
    if not spark_runs:
        return []
    best = max(spark_runs, key=lambda r: r["dialogues_per_s_after_startup"])
    ideal = best["slots"] * best["task_threads"] / (calls * result["latency_s"])
    efficiency = min(1.0, best["dialogues_per_s_after_startup"] / ideal)
    per_executor = slots_per_executor * best["task_threads"] * efficiency / (calls * hosted_latency_s)
    rows = []
    for n in executors:
        for rpm in rate_limits_rpm:
            compute = n * per_executor
            cap = rpm / 60.0 / calls
            rows.append({"executors": n, "slots_per_executor": slots_per_executor,
                         "task_threads": best["task_threads"], "efficiency": efficiency, "rate_limit_rpm": rpm,
                         "assumed_latency_s": hosted_latency_s, "lm_calls_per_dialogue": calls,
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
        p = projection[0]
        lines += [f"On paper: {p['slots_per_executor']} task slots per executor, {p['task_threads']} threads per "
                  f"task, {p['assumed_latency_s']:g} s per hosted LM call (assumed), {p['lm_calls_per_dialogue']:.1f} "
                  f"calls per dialogue and {p['efficiency']:.0%} efficiency (measured, fastest Spark run):", ""]
    paper = [[str(p["executors"]), str(p["rate_limit_rpm"]), f"{p['unlimited_dialogues_per_s']:.1f}",
              f"{p['dialogues_per_s']:.1f}", p["bound"]] for p in projection]
    if paper:
        lines.append(markdown_table(["executors", "LM limit (requests/min)", "dialogues/s without the limit",
                                     "dialogues/s", "bound by"], paper))
    return "\n".join(lines)


__all__ = ["measure_scale", "project", "scale_markdown"]
