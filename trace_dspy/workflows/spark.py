"""Distributed batch on Apache Spark: the compiled program's MLflow pyfunc model through ``spark_udf``.

Each Spark Python worker loads the model once (MLflow's ``spark_udf`` caches
it per process) and keeps its own LM: the embedded engine, or a client of the
endpoint that the environment names (``TRACE_DSPY_LM``, ``TRACE_DSPY_API_BASE``,
``TRACE_DSPY_API_KEY_ENV``; see :mod:`trace_dspy.workflows.serving`). A row
that fails comes back with its ``error`` column set; its partition goes on.

Two ways in:

- :func:`respond_dataframe` adds the output columns to any Spark DataFrame
  with a ``dialogue`` column, on any cluster;
- :func:`respond_spark` is ``respond --input/--output`` on Spark: the same
  JSONL files, resumable, rows written as they come back, input order kept.

pyspark is the optional ``spark`` extra; Spark needs Java 17 or newer.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from trace_dspy.core.extras import install_hint
from trace_dspy.workflows.batch import BatchReport
from trace_dspy.workflows.serving import (
    ENV_API_BASE,
    ENV_CACHE,
    ENV_KEY_ENV,
    ENV_LM,
    ENV_TIMEOUT,
    OUTPUT_COLUMNS,
)

RESULT_DDL = ", ".join(f"{c} string" for c in OUTPUT_COLUMNS)
MISSING_SPARK = f'the Spark engine needs the "spark" extra ({install_hint("spark")}) and Java 17 or newer'


class SparkUnavailable(ImportError):
    """pyspark or Java is missing."""


def lm_environment(lm_config) -> dict[str, str]:
    """The serving variables that carry a user-chosen default LM to the workers (names, never keys)."""
    if lm_config is None:
        return {}
    spec = lm_config.default
    env = {ENV_LM: spec.model, ENV_TIMEOUT: repr(float(spec.timeout)), ENV_CACHE: "1" if spec.cache else "0"}
    if spec.api_base:
        env[ENV_API_BASE] = spec.api_base
    if spec.api_key_env:
        env[ENV_KEY_ENV] = spec.api_key_env
    return env


def spark_session(master: str = "local[2]", *, executor_env: dict[str, str] | None = None, app: str = "trace-dspy"):
    """A Spark session for the batch: no web UI, loopback driver in local mode, the LM variables set on executors.

    ``spark.executorEnv.*`` carries ``executor_env`` to the Python workers, in local mode and on a
    cluster alike (the key itself must already be in the executors' environment: only its variable's
    name travels). This process's own environment is left as it was.
    """
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        raise SparkUnavailable(MISSING_SPARK + " (no java on PATH and no JAVA_HOME)")
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        raise SparkUnavailable(MISSING_SPARK) from None
    env = dict(executor_env or {})
    builder = (SparkSession.builder.master(master).appName(app)
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.execution.arrow.pyspark.enabled", "true")
               .config("spark.python.worker.reuse", "true"))
    local = master.startswith("local")
    if local:
        builder = builder.config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
    for name, value in env.items():
        builder = builder.config(f"spark.executorEnv.{name}", value)
    import warnings

    # The JVM reads SPARK_LOCAL_IP when it starts (else it warns that it picked an interface); set it for
    # that moment only.
    saved = os.environ.get("SPARK_LOCAL_IP")
    if local and saved is None:
        os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*does not yet fully support pandas.*")
            spark = builder.getOrCreate()
    finally:
        if local and saved is None:
            os.environ.pop("SPARK_LOCAL_IP", None)
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def trace_udf(spark, model_uri: str):
    """The model as a Spark UDF from a ``dialogue`` column to a struct of the output columns."""
    import logging
    import warnings

    import mlflow.pyfunc

    # env_manager="local" is the point here (the workers share this environment), so MLflow's advice to
    # rebuild a conda environment does not apply; pyspark's notice about pandas 3 needs no action either.
    pyfunc_logger = logging.getLogger("mlflow.pyfunc")
    level = pyfunc_logger.level
    pyfunc_logger.setLevel(logging.ERROR)
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*does not yet fully support pandas.*")
            return mlflow.pyfunc.spark_udf(spark, model_uri, result_type=RESULT_DDL, env_manager="local")
    finally:
        pyfunc_logger.setLevel(level)


def respond_dataframe(spark, df, model_uri: str | None = None, *, column: str = "dialogue", udf=None):
    """``df`` with the model's output columns (emotion ... reply, stages, error) added, row for row.

    Give ``model_uri``, or a ``udf`` from :func:`trace_udf` to reuse one across DataFrames."""
    from pyspark.sql import functions as F

    if udf is None:
        if model_uri is None:
            raise ValueError("respond_dataframe needs a model_uri or a udf")
        udf = trace_udf(spark, model_uri)
    out = df.withColumn("__trace", udf(F.col(column)))
    return out.select(*[F.col(c) for c in df.columns], *[F.col(f"__trace.{c}").alias(c) for c in OUTPUT_COLUMNS])


def model_uri_for(ref: str | None, *, workdir: Path, allow_unverified: bool = False) -> str:
    """A pyfunc model directory under ``workdir`` for a program reference, whose code file is the
    installed trace-dspy's: a registry or run reference (``champion``, ``models:/...``, ``runs:/...``)
    contributes only its artifact folder, after its files were checked against the digests recorded when
    it was logged (``fetch_artifact``); a local artifact (``NAME@vN``, ``NAME@latest``, a folder; the
    default program when ``ref`` is None) is used as it is. The code file logged with a model never runs.
    ``allow_unverified``: a registry or run reference without a digest record is used unchecked (else refused)."""
    from trace_dspy.store.artifacts import ArtifactError, resolve_local
    from trace_dspy.workflows.loading import default_reference
    from trace_dspy.workflows.serving import export_model, save_program_model

    if ref and (ref == "champion" or ref.startswith(("models:/", "runs:/"))):
        return str(export_model(ref, workdir / "model", allow_unverified=allow_unverified))
    ref = ref or default_reference()
    if ref == "default":
        raise ArtifactError("the Spark engine runs a compiled artifact or a registered model; there is none yet "
                            "(run python -m trace_dspy.compile, or name one with --program)")
    return str(save_program_model(resolve_local(ref), workdir / "model"))


def respond_spark(input_path: str | os.PathLike, output_path: str | os.PathLike, model_uri: str, *,
                  spark=None, master: str = "local[2]", partitions: int | None = None,
                  executor_env: dict[str, str] | None = None, on_row=None, chunk: int | None = None) -> BatchReport:
    """``respond --input/--output`` on Spark, with the plain batch's guarantees (``respond_batch``): an
    earlier answer is kept only for the dialogue it answered, failed and changed lines are asked again,
    earlier rows the input no longer asks for are moved to ``<output>.stale.jsonl``, and the file is
    rewritten in input order at the end.

    The dialogues go to Spark in chunks (default: 16 per partition, at least 64), each one job spread over
    ``partitions`` tasks; a chunk's rows are on disk before the next chunk starts, so an interrupted run
    loses at most the chunk in flight."""
    from trace_dspy.workflows.batch import (
        run_resumable,  # the plain batch's resume rules
    )

    def answer_all(plan, write) -> None:
        rows = _spark_rows(plan, write, Path(input_path))
        if not rows:
            return
        session = spark if spark is not None else spark_session(master, executor_env=executor_env)
        try:
            _answer_on_spark(session, model_uri, plan, rows, write, partitions=partitions, chunk=chunk)
        finally:
            if spark is None:
                session.stop()

    return run_resumable(input_path, output_path, answer_all, on_row=on_row)


def _spark_rows(plan, write, input_path: Path) -> list[tuple[int, str]]:
    """(position in ``plan.todo``, canonical dialogue) for Spark; lines that are not dialogues fail here,
    without a trip to Spark."""
    from trace_dspy.core.dialogue import DialogueError, normalize_dialogue

    rows = []
    for n, (item_id, dialogue, line) in enumerate(plan.todo):
        text = plan.canonical[item_id]
        if text is not None:
            rows.append((n, text))
            continue
        if not isinstance(dialogue, Exception):
            try:
                normalize_dialogue(dialogue)
            except DialogueError as exc:
                dialogue = exc
        write(plan.row(item_id, line, error=f"{input_path}:{line}: {dialogue}"))
    return rows


def _answer_on_spark(spark, model_uri: str, plan, rows: list[tuple[int, str]], write, *, partitions: int | None,
                     chunk: int | None) -> None:
    """Answer ``rows`` in chunks, each one Spark job; a chunk's rows are written before the next starts."""
    slices = partitions or spark.sparkContext.defaultParallelism
    size = chunk or max(64, 16 * slices)
    udf = trace_udf(spark, model_uri)
    for start in range(0, len(rows), size):
        part = rows[start:start + size]
        df = spark.createDataFrame(spark.sparkContext.parallelize(part, max(1, min(slices, len(part)))),
                                   "row long, dialogue string")
        for row in sorted(respond_dataframe(spark, df, udf=udf).collect(), key=lambda r: r["row"]):
            item_id, _, line = plan.todo[row["row"]]
            if row["error"]:
                write(plan.row(item_id, line, error=row["error"]))
            else:
                write(plan.row(item_id, line, dialogue=row["dialogue"], response=row["reply"],
                               stages=json.loads(row["stages"])))


def temporary_workdir() -> tempfile.TemporaryDirectory:
    return tempfile.TemporaryDirectory(prefix="trace-spark-")


__all__ = ["RESULT_DDL", "SparkUnavailable", "lm_environment", "model_uri_for", "respond_dataframe", "respond_spark",
           "spark_session", "temporary_workdir", "trace_udf"]
