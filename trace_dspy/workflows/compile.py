"""Compile the TRACE program: split the data, fit the artifact's components, optimize, evaluate, save, track."""

from __future__ import annotations

import contextlib
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dspy
from dspy.utils.exceptions import DSPyError

from trace_dspy.data.sources import load_splits
from trace_dspy.optimize.metric import DELTA_KEYS
from trace_dspy.optimize.optimizers import OptimizerConfig, compile_program
from trace_dspy.store.tracking import DEFAULT_EXPERIMENT
from trace_dspy.workflows.evaluation import (
    TABLE_KEYS,
    build_metric,
    evaluate_program,
    format_table,
)
from trace_dspy.workflows.loading import not_worse_than_uncompiled
from trace_dspy.workflows.settings import Settings


@dataclass
class CompileConfig:
    """Everything a compile does, resolved from flags over the TOML file."""

    settings: Settings
    optimizer: OptimizerConfig
    data: str | None = None
    # A situations CSV for the emotion prior (trace_dspy.data.situations); None: $TRACE_DSPY_SITUATIONS.
    situations: str | None = None
    train: int = 16
    dev: int = 16
    # Selection set for optimizers that score candidates (select, mipro, gepa): drawn from the training side,
    # apart from the train sample, so that dev stays a held-out before/after comparison.
    val: int = 8
    seed: int = 0
    name: str = "trace-dspy"
    artifacts_dir: str | None = None
    threads: int = 4
    tracking_uri: str | None = None
    experiment: str = DEFAULT_EXPERIMENT
    mlflow: bool = True
    # Dev evaluations as MLflow evaluation runs with one trace per dialogue (needs ``mlflow``); off keeps
    # the run's metrics, its files, the model and the prompts, and writes no traces.
    trace: bool = True
    registered_model: str = "trace-dspy"
    max_failure_rate: float = 0.5
    command: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def record(self) -> dict[str, Any]:
        """The config as recorded in manifests and MLflow: no secrets."""
        return {
            "program": self.settings.program.to_dict(),
            "lm": self.settings.lm.to_dict(),
            "metric": self.settings.raw.get("metric") or {},
            "optimizer": self.optimizer.settings(),
            "data": {"source": self.data, "situations": self.situations, "train": self.train, "dev": self.dev,
                     "val": self.val, "seed": self.seed},
            "run": {"name": self.name, "threads": self.threads, "experiment": self.experiment, "trace": self.trace,
                    "registered_model": self.registered_model, "max_failure_rate": self.max_failure_rate},
        }


@dataclass
class CompileResult:
    before: dict[str, Any]
    after: dict[str, Any]
    artifact: Path
    manifest: dict[str, Any]
    run_id: str | None
    registry_version: int | None
    promoted: bool
    seconds: float

    def table(self) -> str:
        keys = [k for k in TABLE_KEYS if k in self.before or k in self.after]
        return format_table({"before": self.before, "after": self.after}, keys)


class CompileFailed(RuntimeError):
    """The optimizer could not finish (e.g. too many failed LM calls)."""


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def run_compile(cfg: CompileConfig) -> CompileResult:
    from trace_dspy.data.situations import resolve_situations
    from trace_dspy.lm.specs import LMSet
    from trace_dspy.program.pipeline import TraceProgram
    from trace_dspy.store.artifacts import write_artifact

    started = time.perf_counter()
    situations = resolve_situations(cfg.situations)  # a bad file stops the compile before any work
    splits = load_splits(cfg.data, seed=cfg.seed, train_size=cfg.train, dev_size=cfg.dev)
    source = splits.source
    val = selection_set(source, splits.train, cfg.val, seed=cfg.seed)
    _log(f"data: {source.kind} {source.location}: {len(splits.train)} train, {len(val)} selection, "
         f"{len(splits.dev)} dev examples")
    lms = LMSet(cfg.settings.lm)
    from trace_dspy.data.retrieval import cached_index

    retrieval = cfg.settings.program.retrieval
    retriever = None
    if retrieval.enabled:
        # Exemplars come from the whole training partition (never dev), not just the sampled train set.
        pool = load_splits(source, seed=cfg.seed).train
        retriever = cached_index(pool, retrieval, source.fingerprint)
    prior, prior_record = _fit_prior(cfg, source, situations)
    program = TraceProgram(cfg.settings.program, stage_lms=lms.stage_lms(), retriever=retriever,
                           emotion_prior=prior)
    metric = build_metric(cfg.settings, lms)
    # Training replies are what demos show the model: a dev reply that copies one scores 0.
    metric.add_copy_sources(e.response for e in splits.train)
    prompt_lm = lms.role("prompt")

    with tempfile.TemporaryDirectory(prefix="trace-compile-") as tmp:
        tmp = Path(tmp)
        run_ctx = _mlflow_context(cfg)
        with run_ctx as run:
            _log("1/4 evaluating the uncompiled program on dev")
            before = evaluate_program(program, splits.dev, metric, lm=lms.default, threads=cfg.threads,
                                      results_path=tmp / "dev_before.jsonl", max_failure_rate=cfg.max_failure_rate,
                                      desc="dev before", trace=run is not None and cfg.trace)
            _log(f"2/4 compiling with {cfg.optimizer.name}")
            with dspy.context(lm=lms.default):
                try:
                    compiled = compile_program(cfg.optimizer, program, metric, splits.train, val,
                                               prompt_lm=prompt_lm, log=_log)
                except DSPyError as exc:  # e.g. BootstrapFewShot stops after max_errors failed examples
                    first = next((line for line in str(exc).splitlines() if line.strip()), "")[:300]
                    raise CompileFailed(f"the {cfg.optimizer.name} optimizer stopped: {type(exc).__name__}: "
                                        f"{first}") from exc
            selection = getattr(compiled, "selection", None)
            if selection:
                _log("selection scores: " + ", ".join(
                    f"{c['candidate']} {c['score']:.3f}{' (chosen)' if c['chosen'] else ''}" for c in selection))
            _log("3/4 evaluating the compiled program on dev")
            after = evaluate_program(compiled, splits.dev, metric, lm=lms.default, threads=cfg.threads,
                                     results_path=tmp / "dev_after.jsonl", max_failure_rate=cfg.max_failure_rate,
                                     desc="dev after", reference_dist2=before.summary.get("dist2"),
                                     trace=run is not None and cfg.trace)
            improved = not_worse_than_uncompiled(before.summary, after.summary)
            if after.summary.get("collapsed"):
                _log(f"WARNING: the compiled program's dev replies collapsed ({after.summary['collapse_reason']}); "
                     "it is saved, but it will not become champion")
            elif not improved:
                _log(f"NOTE: the compiled program scores {after.score:.3f} on dev, below the uncompiled "
                     f"program's {before.score:.3f}; it is saved, but it will not become champion, and respond "
                     "and chat keep their default program")
            _log("4/4 saving, logging and registering")
            # The order keeps every crash point consistent: the artifact is complete before MLflow hears of
            # it, the run holds its files before a registry version points at them, and only a registered
            # version can become champion. (tests/test_compile.py kills the command between the steps.)
            run_id = run.info.run_id if run is not None else None
            manifest = {
                "config": cfg.record(),
                "optimizer": {**cfg.optimizer.settings(), **({"selection": selection} if selection else {})},
                "metric": {"name": metric.name, "config": metric.config.to_dict(),
                           "similarity_kind": metric.similarity_kind},
                "scores": {"dev_before": _scalars(before.summary), "dev_after": _scalars(after.summary)},
                "data": {**source.describe(),
                         "situations": situations.describe() if situations is not None else None,
                         "train_ids": [e.sample_id for e in splits.train],
                         "val_ids": [e.sample_id for e in val], "dev_ids": [e.sample_id for e in splits.dev]},
                # The registry version is not known yet: MLflow records it (tag trace_dspy.registry_version).
                "mlflow": {"run_id": run_id, "experiment": cfg.experiment if run is not None else None,
                           "registered_model": cfg.registered_model if run is not None else None},
                "command": cfg.command,
                "retrieval": {**retrieval.to_dict(),
                              "index": retriever.fingerprint if retriever is not None else None,
                              "pool_items": len(retriever.items) if retriever is not None else 0},
                "emotion_prior": prior_record,
                # The scaffolded reply's openers, when this compile fitted them, with the scores they were
                # ranked by (trace_dspy.optimize.openers); loading puts them back on the program.
                "reply_openers": getattr(compiled, "opener_fit", None) or {"openers": None},
                # The further plans a reply is written for, when this compile chose any, with the training
                # table they were chosen by (trace_dspy.optimize.plans); loading puts them back.
                "reply_plans": getattr(compiled, "plan_fit", None) or {"plans": []},
            }
            index_dir = None
            if retriever is not None:
                index_dir = retriever.save(tmp / "index")
            extra_files = {"dev_before.jsonl": tmp / "dev_before.jsonl", "dev_after.jsonl": tmp / "dev_after.jsonl"}
            if prior is not None:
                from trace_dspy.program.emotion_prior import FILE_NAME

                extra_files[FILE_NAME] = prior.save(tmp / FILE_NAME)
            # 1. save
            folder, final_manifest = write_artifact(compiled, manifest, name=cfg.name, root=cfg.artifacts_dir,
                                                    extra_files=extra_files,
                                                    extra_dirs={"index": index_dir} if index_dir else None)
            registry_version, promoted = None, False
            if run is not None:
                import mlflow

                from trace_dspy.store.registry import (
                    promote_if_better,
                    register_version,
                )
                from trace_dspy.store.tracking import wait_for_store

                # A store another process keeps locked: one bounded wait, then an error that names the saved version.
                wait_for_store(cfg.tracking_uri, saved=f"the artifact {cfg.name}@v{final_manifest['version']} is saved "
                                                      f"in {folder}")
                mlflow.set_tags({"trace_dspy.artifact": f"{cfg.name}@v{final_manifest['version']}",
                                 "trace_dspy.collapsed": str(bool(after.summary.get("collapsed")))})
                # 2. log: params, metrics, the artifact's files and the pyfunc model that carries them
                model_info = _log_run(cfg, folder, before.summary, after.summary)
                # 3. register a version whose source is the logged model
                registry_version = register_version(run_id, run.info.artifact_uri, after.score,
                                                    model=cfg.registered_model, tracking_uri=cfg.tracking_uri,
                                                    tags={"artifact_name": cfg.name,
                                                          "artifact_version": str(final_manifest["version"])},
                                                    model_uri=model_info.model_uri, model_id=model_info.model_id)
                mlflow.set_tag("trace_dspy.registry_version", str(registry_version))
                # The dev evaluations as MLflow evaluation runs, and the compiled instructions as prompts
                # (a failure here is reported, and the compile's result stands).
                if cfg.trace:
                    _log_evaluation_runs(cfg, source, before.rows, after.rows, model_info.model_id)
                _register_prompts(cfg, compiled, final_manifest["version"])
                # 4. promote, if it is not worse than the uncompiled program (nor collapsed) and beats the champion
                promoted = improved and promote_if_better(
                    registry_version, after.score, model=cfg.registered_model, tracking_uri=cfg.tracking_uri)
                mlflow.set_tag("trace_dspy.champion", str(promoted))
    return CompileResult(before.summary, after.summary, folder, final_manifest, run_id, registry_version, promoted,
                         time.perf_counter() - started)


def selection_set(source, train: list, size: int, *, seed: int = 0) -> list:
    """``size`` seeded examples from the training side of ``source`` that are not in ``train``.

    Optimizers that score candidates (select, mipro, gepa) score them here,
    never on dev. When the training side has no other conversations (a tiny
    pool), the train sample itself is returned, and the log says so.
    """
    import random

    if size <= 0:
        return []
    taken = {e.conversation_id for e in train}
    rest = [e for e in load_splits(source, seed=seed).train if e.conversation_id not in taken]
    if not rest:
        _log("selection: no training conversations beyond the train sample; candidates are scored on train")
        return list(train)
    picked = sorted(random.Random(seed + 1).sample(range(len(rest)), min(size, len(rest))))
    return [rest[i] for i in picked]


def _fit_prior(cfg: CompileConfig, source, situations):
    """The emotion prior for this compile (see :mod:`trace_dspy.workflows.prior`) and its manifest record."""
    from trace_dspy.program.emotion_prior import MIN_TRAIN, cached_prior_path
    from trace_dspy.workflows.prior import choose_prior

    if cfg.settings.program.prior_k != 0 and len(source.pool) >= MIN_TRAIN:
        cached = cached_prior_path(source, situations=situations, seed=cfg.seed).is_file()
        extra = f" and {len(situations)} situations" if situations is not None else ""
        _log(f"emotion prior: {'reusing the cached fit' if cached else 'fitting'} on the training side of "
             f"{len(source.pool)} pool samples{extra}")
    choice = choose_prior(source, situations=situations, seed=cfg.seed, prior_k=cfg.settings.program.prior_k)
    _log(choice.summary())
    return choice.prior, choice.record()


def _scalars(summary: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in summary.items() if k != "distributions"}


class _NoRun:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def _mlflow_context(cfg: CompileConfig):
    if not cfg.mlflow:
        return _NoRun()
    import mlflow

    from trace_dspy.store.tracking import mlflow_run

    ctx = mlflow_run(tracking_uri=cfg.tracking_uri, experiment=cfg.experiment,
                     run_name=f"compile {cfg.name} {cfg.optimizer.name}",
                     tags={"trace_dspy.kind": "compile", "trace_dspy.optimizer": cfg.optimizer.name})
    # log_evals off: the optimizer's candidate evaluations would each be an unnamed child run (eval_0, ...)
    # with one unnamed metric; their scores are the compile's "selection" (printed, and in the manifest).
    mlflow.dspy.autolog(log_compiles=True, log_evals=False, log_traces_from_compile=False, log_traces=False,
                        silent=True)
    return _traced_run(ctx)


@contextlib.contextmanager
def _traced_run(ctx):
    """The compile run, with MLflow's traces going to its experiment."""
    import mlflow

    with ctx as run:
        mlflow.set_experiment(experiment_id=run.info.experiment_id)
        yield run


def _log_evaluation_runs(cfg: CompileConfig, source, before_rows: list, after_rows: list, model_id: str) -> None:
    """Child runs ``dev before`` and ``dev after``: MLflow evaluation runs over the dev traces."""
    import mlflow

    from trace_dspy.store.evaluations import log_evaluation
    from trace_dspy.store.tracking import mlflow_run

    dataset = {**source.describe(), "split": "dev", "view": "longest", "seed": cfg.seed}
    mlflow.flush_trace_async_logging()  # once for both (each flush waits on the writer's one-second poll)
    for name, rows, linked in (("dev before", before_rows, None), ("dev after", after_rows, model_id)):
        try:
            with mlflow_run(tracking_uri=cfg.tracking_uri, experiment=cfg.experiment, run_name=f"{cfg.name} {name}",
                            tags={"trace_dspy.kind": "compile-evaluation"}, nested=True):
                log_evaluation(rows, dataset=dataset, model_id=linked, flush=False)
        except Exception as exc:  # noqa: BLE001 - the compile itself is saved and registered
            _log(f"WARNING: the {name} evaluation run was not logged ({type(exc).__name__}: {exc})")


def _register_prompts(cfg: CompileConfig, compiled, version: int) -> None:
    """Each stage's compiled instruction as a version of the prompt ``<name>.<stage>`` in MLflow's registry."""
    import mlflow

    for stage, predictor in compiled.named_predictors():
        try:
            mlflow.genai.register_prompt(
                name=f"{cfg.name}.{stage}".replace("@", "-"), template=predictor.signature.instructions,
                commit_message=f"{cfg.name}@v{version}, {cfg.optimizer.name}",
                tags={"artifact_version": f"{cfg.name}@v{version}", "demos": str(len(predictor.demos)),
                      "optimizer": cfg.optimizer.name})
        except Exception as exc:  # noqa: BLE001 - as above
            _log(f"WARNING: the {stage} prompt was not registered ({type(exc).__name__}: {exc})")
            return


def _log_run(cfg: CompileConfig, folder: Path, before: dict, after: dict):
    """Log the run's params, metrics and files, and the program as an MLflow pyfunc model; its ModelInfo."""
    import mlflow

    from trace_dspy.store.tracking import log_params, numeric_metrics
    from trace_dspy.workflows.serving import log_program_model

    log_params(cfg.record())
    metrics = {**numeric_metrics(before, "dev_before"), **numeric_metrics(after, "dev_after")}
    for key in DELTA_KEYS:
        if key in before and key in after:
            metrics[f"dev_delta/{key}"] = after[key] - before[key]
    mlflow.log_metrics(metrics)
    mlflow.log_artifacts(str(folder), artifact_path="artifact")
    return log_program_model(folder)
