"""Compile the TRACE program: split the data, fit the artifact's components, optimize, evaluate, save, track."""

from __future__ import annotations

import contextlib
import random
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dspy
from dspy.utils.exceptions import DSPyError

from trace_dspy.core.config import DataConfig
from trace_dspy.core.console import Progress, heartbeat, say
from trace_dspy.data.sources import load_splits
from trace_dspy.optimize.metric import DELTA_KEYS
from trace_dspy.optimize.optimizers import FitRecords, OptimizerConfig, compile_program
from trace_dspy.program.writers import part_fitter
from trace_dspy.store.manifest import Manifest
from trace_dspy.store.tracking import DEFAULT_EXPERIMENT
from trace_dspy.workflows.evaluation import (
    TABLE_KEYS,
    FailureRateExceeded,
    build_metric,
    evaluate_program,
    format_table,
)
from trace_dspy.workflows.finetuning import finetune_compile
from trace_dspy.workflows.finetuning import preflight as preflight_finetune
from trace_dspy.workflows.loading import not_worse_than_uncompiled
from trace_dspy.workflows.settings import Settings


@dataclass
class CompileConfig:
    """Everything a compile does, resolved from flags over the TOML file."""

    settings: Settings
    optimizer: OptimizerConfig
    # The data source and the split sizes, resolved: the source as given (None: $TRACE_DSPY_DATA, else the
    # seed set), the train and dev samples, and the selection set for optimizers that score candidates
    # (select, mipro, gepa), drawn from the training side apart from the train sample, so that dev stays a
    # held-out before/after comparison.
    data: DataConfig = field(default_factory=DataConfig)
    # A situations CSV for the emotion prior (trace_dspy.data.situations); None: $TRACE_DSPY_SITUATIONS.
    situations: str | None = None
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
            "data": {"source": self.data.source, "situations": self.situations, "train": self.data.train,
                     "dev": self.data.dev, "val": self.data.val, "seed": self.seed},
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
    say(message, sys.stderr)


@dataclass
class _Prepared:
    """What the prepare phase made: the one split, the program with its fitted parts, its LMs and metric."""

    source: Any
    situations: Any
    pool_train: list
    train: list
    val: list
    dev: list
    lms: Any
    metric: Any
    program: Any

    def dev_fingerprint(self) -> str:
        """The dev items and the metric they are scored under: two scores compare only when this is equal."""
        import hashlib
        import json

        key = [self.source.fingerprint, sorted(str(e.sample_id) for e in self.dev), self.metric.signature]
        return "dev:" + hashlib.sha256(json.dumps(key).encode()).hexdigest()[:16]


@dataclass
class _Evaluated:
    """What the optimize-and-evaluate phase found: both dev evaluations, the compiled program and the records of
    its fits, the champion."""

    before: Any
    after: Any
    compiled: Any
    fits: FitRecords
    selection: list | None
    improved: bool
    champion: dict[str, Any] | None = None


def run_compile(cfg: CompileConfig) -> CompileResult:
    """Compile in four phases: prepare, optimize and evaluate, persist, track (see each ``_phase``).

    Every phase that can take long reports its progress on stderr (trace_dspy.core.console.Progress)."""
    started = time.perf_counter()
    with contextlib.ExitStack() as stack:
        with heartbeat("prepare") as phase:
            prep = _prepare(cfg, phase)
            phase.note("opening the MLflow run")
            tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="trace-compile-")))
            run = stack.enter_context(_mlflow_context(cfg))
        evaluated = _optimize_and_evaluate(cfg, prep, tmp, run)
        _log("4/4 saving, logging and registering")
        # The order keeps every crash point consistent: the artifact is complete before MLflow hears of
        # it, the run holds its files before a registry version points at them, and only a registered
        # version can become champion. (tests/workflows/test_compile_order.py kills the command between the steps.)
        with heartbeat("saving and logging") as phase:
            phase.note("saving the artifact")
            folder, manifest = _persist(cfg, prep, evaluated, tmp, run)
            registry_version, promoted = _track(cfg, prep, evaluated, folder, manifest, run, phase) if run \
                else (None, False)
            phase.note("closing the MLflow run")
            stack.close()  # the run ends (its traces flushed) and the temporary folder goes
    return CompileResult(evaluated.before.summary, evaluated.after.summary, folder, manifest.to_dict(),
                         manifest.mlflow.get("run_id"), registry_version, promoted, time.perf_counter() - started)


def _prepare(cfg: CompileConfig, phase: Progress) -> _Prepared:
    """Split the data once (the train sample, the selection set, the dev sample and the exemplar pool all come
    from it, and the prior is fitted on the same partition), fit the parts, build the program and the metric."""
    from trace_dspy.data.retrieval import cached_index
    from trace_dspy.data.situations import resolve_situations
    from trace_dspy.lm.specs import LMSet
    from trace_dspy.program.parts import FittedParts
    from trace_dspy.program.pipeline import TraceProgram
    from trace_dspy.workflows.prior import DEV_FRACTION

    preflight_finetune(cfg)  # --optimizer finetune: its extras and its model, before any work
    phase.note("reading the data")
    situations = resolve_situations(cfg.situations)  # a bad file stops the compile before any work
    full = load_splits(cfg.data.source, seed=cfg.seed, dev_fraction=DEV_FRACTION)
    rng = random.Random(cfg.seed)  # the train sample, then the dev sample (as load_splits draws them)
    train, dev = _sample(full.train, cfg.data.train, rng), _sample(full.dev, cfg.data.dev, rng)
    source = full.source
    val = selection_set(source, train, cfg.data.val, seed=cfg.seed, pool=full.train)
    _log(f"data: {source.kind} {source.location}: {len(train)} train, {len(val)} selection, "
         f"{len(dev)} dev examples")
    lms = LMSet(cfg.settings.lm)
    retrieval = cfg.settings.program.retrieval
    # Exemplars come from the whole training partition (never dev), not just the sampled train set.
    phase.note("the retrieval index")
    retriever = cached_index(full.train, retrieval, source.fingerprint) if retrieval.enabled else None
    phase.note("the emotion prior")
    prior, prior_record = _fit_prior(cfg, source, situations)
    parts = FittedParts({"retrieval": retriever, "emotion_prior": prior}, {"emotion_prior": prior_record})
    phase.note("the program and the metric")
    program = TraceProgram(cfg.settings.program, stage_lms=lms.stage_lms(), parts=parts)
    metric = build_metric(cfg.settings, lms)
    # Training replies are what demos show the model: a dev reply that copies one scores 0.
    metric.add_copy_sources(e.response for e in train)
    return _Prepared(source, situations, full.train, train, val, dev, lms, metric, program)


def _sample(items: list, n: int | None, rng: random.Random) -> list:
    """``n`` of ``items`` in their order, drawn with ``rng`` (all of them when ``n`` is None or not smaller)."""
    if n is None or n >= len(items):
        return list(items)
    return [items[i] for i in sorted(rng.sample(range(len(items)), n))]


def _evaluate(cfg: CompileConfig, prep: _Prepared, program, path: Path, desc: str, *, trace: bool,
              reference_dist2: float | None = None):
    return evaluate_program(program, prep.dev, prep.metric, lm=prep.lms.default, threads=cfg.threads,
                            results_path=path, max_failure_rate=cfg.max_failure_rate, desc=desc,
                            reference_dist2=reference_dist2, trace=trace)


def _optimize_and_evaluate(cfg: CompileConfig, prep: _Prepared, tmp: Path, run) -> _Evaluated:
    """Score the uncompiled program on dev, compile it, score the result on the same items; then the champion."""
    traced = run is not None and cfg.trace
    _log("1/4 evaluating the uncompiled program on dev")
    before = _evaluate(cfg, prep, prep.program, tmp / "dev_before.jsonl", "dev before", trace=traced)
    _log(f"2/4 compiling with {cfg.optimizer.name}")
    with dspy.context(lm=prep.lms.default):
        try:
            result = finetune_compile(cfg, prep, run, _log) if cfg.optimizer.name == "finetune" else \
                compile_program(cfg.optimizer, prep.program, prep.metric, prep.train, prep.val,
                                prompt_lm=prep.lms.role("prompt"), log=_log,
                                fit_parts=part_fitter(cfg.optimizer, prep.metric))
        except DSPyError as exc:  # e.g. BootstrapFewShot stops after max_errors failed examples
            first = next((line for line in str(exc).splitlines() if line.strip()), "")[:300]
            raise CompileFailed(f"the {cfg.optimizer.name} optimizer stopped: {type(exc).__name__}: "
                                f"{first}") from exc
    compiled = result.program
    selection = getattr(compiled, "selection", None)
    if selection:
        _log("selection scores: " + ", ".join(
            f"{c['candidate']} {c['score']:.3f}{' (chosen)' if c['chosen'] else ''}" for c in selection))
    _log("3/4 evaluating the compiled program on dev")
    after = _evaluate(cfg, prep, compiled, tmp / "dev_after.jsonl", "dev after", trace=traced,
                      reference_dist2=before.summary.get("dist2"))
    improved = not_worse_than_uncompiled(before.summary, after.summary)
    if after.summary.get("collapsed"):
        _log(f"WARNING: the compiled program's dev replies collapsed ({after.summary['collapse_reason']}); "
             "it is saved, but it will not become champion")
    elif not improved:
        _log(f"NOTE: the compiled program scores {after.score:.3f} on dev, below the uncompiled "
             f"program's {before.score:.3f}; it is saved, but it will not become champion, and respond "
             "and chat keep their default program")
    evaluated = _Evaluated(before, after, compiled, result.fits, selection, improved)
    if run is not None and improved:
        evaluated.champion = _compare_with_champion(cfg, prep, after.score, tmp)
    return evaluated


def _compare_with_champion(cfg: CompileConfig, prep: _Prepared, score: float, tmp: Path) -> dict | None:
    """The current champion's score on this compile's dev items under its metric: the recorded one when it was
    scored on the same items, else scored here. None when there is no champion."""
    from trace_dspy.store.errors import ArtifactError
    from trace_dspy.store.registry import champion_record
    from trace_dspy.workflows.loading import load_for_run
    from trace_dspy.workflows.settings import Settings

    current = champion_record(cfg.registered_model, tracking_uri=cfg.tracking_uri)
    if current is None:
        return None
    here = prep.dev_fingerprint()
    record = {"version": current["version"], "recorded_score": current["score"],
              "dev_fingerprint": current["dev_fingerprint"], "new_score": score, "new_dev_fingerprint": here,
              "rescored": current["dev_fingerprint"] != here}
    if not record["rescored"]:
        return {**record, "score": current["score"]}
    _log(f"champion: version {current['version']} was scored on other dev items or under another metric; "
         "scoring it on this compile's dev set")
    try:
        with heartbeat("champion") as phase:
            phase.note(f"loading version {current['version']}")
            loaded = load_for_run(f"models:/{cfg.registered_model}/{current['version']}",
                                  Settings(lm=cfg.settings.lm, lm_explicit=True,
                                           allow_unverified_model=cfg.settings.allow_unverified_model),
                                  tracking_uri=cfg.tracking_uri)
            phase.note(f"scoring version {current['version']}")
            theirs = _evaluate(cfg, prep, loaded.program, tmp / "dev_champion.jsonl", "dev champion", trace=False)
    except (ArtifactError, FailureRateExceeded) as exc:
        _log(f"WARNING: the champion could not be scored here ({exc}); a program that runs replaces it")
        return {**record, "score": None, "error": str(exc)[:500]}
    _log(f"champion: version {current['version']} scores {theirs.score:.3f} on this dev set "
         f"(recorded {current['score']:.3f} on its own); this compile scores {score:.3f}")
    return {**record, "score": theirs.score}


def _persist(cfg: CompileConfig, prep: _Prepared, ev: _Evaluated, tmp: Path, run):
    """Save the compiled program, its fitted parts and its manifest as a new version: (folder, Manifest)."""
    from trace_dspy.store import artifacts

    run_id = run.info.run_id if run is not None else None
    manifest = Manifest(
        name=cfg.name,
        # The program's config as compiled: the settings', or a fine-tuned writer's (trace_dspy.compact.finetune).
        config={**cfg.record(), "program": ev.compiled.config.to_dict()},
        optimizer={**cfg.optimizer.settings(), **({"selection": ev.selection} if ev.selection else {})},
        metric={"name": prep.metric.name, "config": prep.metric.config.to_dict(),
                "similarity_kind": prep.metric.similarity_kind},
        scores={"dev_before": _scalars(ev.before.summary), "dev_after": _scalars(ev.after.summary)},
        data={**prep.source.describe(),
              "situations": prep.situations.describe() if prep.situations is not None else None,
              "train_ids": [e.sample_id for e in prep.train], "val_ids": [e.sample_id for e in prep.val],
              "dev_ids": [e.sample_id for e in prep.dev], "dev_fingerprint": prep.dev_fingerprint()},
        # The registry version is not known yet: MLflow records it (tag trace_dspy.registry_version).
        mlflow={"run_id": run_id, "experiment": cfg.experiment if run is not None else None,
                "registered_model": cfg.registered_model if run is not None else None},
        command=cfg.command,
        champion=ev.champion,
    )
    # The openers, plans and first plan the optimizer fitted come with the records of their fits
    # (trace_dspy.compact.opener_fit, .plans), a fine-tuned writer with its training's; the index, the prior and
    # the writer's adapter are saved as files.
    fitted = ev.compiled.parts.with_records(reply_openers=ev.fits.reply_openers, reply_plans=ev.fits.reply_plans,
                                            first_plan=ev.fits.first_plan, writer_adapter=ev.fits.writer_adapter)
    extra_files = {"dev_before.jsonl": tmp / "dev_before.jsonl", "dev_after.jsonl": tmp / "dev_after.jsonl"}
    return artifacts.write_artifact(ev.compiled, manifest, name=cfg.name, root=cfg.artifacts_dir, parts=fitted,
                                    extra_files=extra_files)


def _track(cfg: CompileConfig, prep: _Prepared, ev: _Evaluated, folder: Path, manifest: Manifest, run,
           phase: Progress):
    """Log the run, register a version, log the evaluations and prompts, and promote: (version, promoted)."""
    from trace_dspy.store import registry, tracking

    label = manifest.label
    phase.note("logging the MLflow run")
    # A store another process keeps locked: one bounded wait, then an error that names the saved version.
    tracking.wait_for_store(cfg.tracking_uri, saved=f"the artifact {label} is saved in {folder}")
    tracking.set_tags({"trace_dspy.artifact": label,
                       "trace_dspy.collapsed": str(bool(ev.after.summary.get("collapsed")))})
    model_info = _log_run(cfg, folder, ev.before.summary, ev.after.summary)
    phase.note("registering the model")
    version = registry.register_version(run.info.run_id, run.info.artifact_uri, ev.after.score,
                                        model=cfg.registered_model, tracking_uri=cfg.tracking_uri,
                                        tags={"artifact_name": cfg.name, "artifact_version": str(manifest.version),
                                              **registry.comparison_tags(prep.dev_fingerprint(), ev.champion)},
                                        model_uri=model_info.model_uri, model_id=model_info.model_id)
    tracking.set_tags({"trace_dspy.registry_version": str(version)})
    # The dev evaluations as MLflow evaluation runs, and the compiled instructions as prompts
    # (a failure here is reported, and the compile's result stands).
    if cfg.trace:
        phase.note("logging the dev evaluation runs")
        _log_evaluation_runs(cfg, prep.source, ev.before.rows, ev.after.rows, model_info.model_id)
    phase.note("registering the prompts")
    _register_prompts(cfg, ev.compiled, manifest.version)
    # Promote only if it is not worse than the uncompiled program (nor collapsed) and beats the champion
    # on the same dev items under the same metric.
    promoted = ev.improved and registry.promote_if_better(
        version, ev.after.score, model=cfg.registered_model, tracking_uri=cfg.tracking_uri,
        dev_fingerprint=prep.dev_fingerprint(), comparison=ev.champion)
    tracking.set_tags({"trace_dspy.champion": str(promoted)})
    return version, promoted


def selection_set(source, train: list, size: int, *, seed: int = 0, pool: list | None = None) -> list:
    """``size`` seeded examples from the training side of ``source`` that are not in ``train``.

    ``pool``: that training side when already split (else it is split here).
    Optimizers that score candidates (select, mipro, gepa) score them here,
    never on dev. When the training side has no other conversations (a tiny
    pool), the train sample itself is returned, and the log says so.
    """
    if size <= 0:
        return []
    taken = {e.conversation_id for e in train}
    pool = load_splits(source, seed=seed).train if pool is None else pool
    rest = [e for e in pool if e.conversation_id not in taken]
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


def _mlflow_context(cfg: CompileConfig):
    """The compile's MLflow run (traces and DSPy's autolog of the optimizer go to it); None without MLflow."""
    if not cfg.mlflow:
        return contextlib.nullcontext()
    from trace_dspy.store import tracking

    ctx = tracking.traced_run(tracking_uri=cfg.tracking_uri, experiment=cfg.experiment,
                              run_name=f"compile {cfg.name} {cfg.optimizer.name}",
                              tags={"trace_dspy.kind": "compile", "trace_dspy.optimizer": cfg.optimizer.name})
    tracking.autolog_compiles()
    return ctx


def _log_evaluation_runs(cfg: CompileConfig, source, before_rows: list, after_rows: list, model_id: str) -> None:
    """Child runs ``dev before`` and ``dev after``: MLflow evaluation runs over the dev traces."""
    from trace_dspy.store.evaluations import log_evaluation
    from trace_dspy.store.tracking import mlflow_run
    from trace_dspy.store.traces import flush_traces

    dataset = {**source.describe(), "split": "dev", "view": "longest", "seed": cfg.seed}
    flush_traces()  # once for both
    for name, rows, linked in (("dev before", before_rows, None), ("dev after", after_rows, model_id)):
        try:
            with mlflow_run(tracking_uri=cfg.tracking_uri, experiment=cfg.experiment, run_name=f"{cfg.name} {name}",
                            tags={"trace_dspy.kind": "compile-evaluation"}, nested=True):
                log_evaluation(rows, dataset=dataset, model_id=linked, flush=False)
        except Exception as exc:  # noqa: BLE001 - the compile itself is saved and registered
            _log(f"WARNING: the {name} evaluation run was not logged ({type(exc).__name__}: {exc})")


def _register_prompts(cfg: CompileConfig, compiled, version: int) -> None:
    """Each stage's compiled instruction as a version of the prompt ``<name>.<stage>`` in MLflow's registry."""
    from trace_dspy.store.tracking import register_prompt

    for stage, predictor in compiled.named_predictors():
        try:
            register_prompt(
                f"{cfg.name}.{stage}".replace("@", "-"), predictor.signature.instructions,
                commit_message=f"{cfg.name}@v{version}, {cfg.optimizer.name}",
                tags={"artifact_version": f"{cfg.name}@v{version}", "demos": str(len(predictor.demos)),
                      "optimizer": cfg.optimizer.name})
        except Exception as exc:  # noqa: BLE001 - as above
            _log(f"WARNING: the {stage} prompt was not registered ({type(exc).__name__}: {exc})")
            return


def _log_run(cfg: CompileConfig, folder: Path, before: dict, after: dict):
    """Log the run's params, metrics and files, and the program as an MLflow pyfunc model; its ModelInfo."""
    from trace_dspy.store.tracking import (
        log_artifacts,
        log_metrics,
        log_params,
        numeric_metrics,
    )
    from trace_dspy.store.registry import ARTIFACT_SUBDIR, record_run_files
    from trace_dspy.workflows.serving import log_program_model

    log_params(cfg.record())
    metrics = {**numeric_metrics(before, "dev_before"), **numeric_metrics(after, "dev_after")}
    for key in DELTA_KEYS:
        if key in before and key in after:
            metrics[f"dev_delta/{key}"] = after[key] - before[key]
    log_metrics(metrics)
    log_artifacts(folder, artifact_path=ARTIFACT_SUBDIR)
    record_run_files(folder)  # the sha256 a runs:/RUN_ID load checks the logged folder against
    return log_program_model(folder)
