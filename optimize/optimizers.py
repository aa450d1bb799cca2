"""A small registry: optimizer name -> how to compile a program with it.

Each entry builds the DSPy optimizer from an ``OptimizerConfig`` and compiles
against the empathy metric. Budgets are explicit and small by default so that
every optimizer finishes on the embedded model; raise them for a real model.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

import dspy

from trace_dspy.core.config import ConfigError, from_table
from trace_dspy.core.console import Progress, counting_dspy_calls, heartbeat, progress
from trace_dspy.core.extras import install_hint

# The optimizers of prompts and demos (compile_program).
OPTIMIZERS = ("select", "labeled", "bootstrap", "mipro", "gepa", "simba")
# Every optimizer a compile takes: those, and finetune, which trains the compact writer's reply stage into a LoRA
# adapter for the embedded model through the compile workflow (trace_dspy.workflows.finetuning).
COMPILE_OPTIMIZERS = (*OPTIMIZERS, "finetune")
# finetune: what the fine-tuned writer learns from (trace_dspy.compact.finetune): the pool's human listener replies,
# the program's own replies that the metric passes, or both.
FINETUNE_MIXES = ("human", "program", "human+program")
# "select" keeps the uncompiled program among its candidates, so a compile cannot ship a program that scored
# worse on the selection set; plain bootstrapping collapsed to one copied demo reply on the seed set
# (docs/results/compiling.md); the main jobs with select are recorded in docs/bench/main_job.json (v0002) and main_job_v0003.json.
DEFAULT_OPTIMIZER = "select"


@dataclass(frozen=True)
class ReplyFloors:
    """What a human reply must reach to be learned from, read by the metric's own models: ``relevance``, the
    relevance head's P(fits) for that speaker; ``empathy``, the mean of the EPITOME scorer's three expected
    levels (0 to 2). ED's listeners also wrote replies that fit nobody ("They do love to surprise ya, do not
    they?" to a spider in the bathtub) or show no care ("That will be no fun."); this is the metric's pass,
    as BootstrapFinetune keeps only the traces its metric passes. 0 and 0 keep every reply."""

    relevance: float = 0.6
    empathy: float = 0.35

    @staticmethod
    def in_range(relevance: float, empathy: float) -> bool:
        """Relevance is a probability (0 to 1), empathy a mean EPITOME level (0 to 2)."""
        return 0.0 <= relevance <= 1.0 and 0.0 <= empathy <= 2.0

    def __post_init__(self) -> None:
        if not self.in_range(self.relevance, self.empathy):
            raise ConfigError(f"reply floors out of range: relevance {self.relevance} (0 to 1), "
                              f"empathy {self.empathy} (0 to 2)")

    def passes(self, relevance: float | None, levels: dict[str, float]) -> bool:
        """Whether a reply with this relevance (None: not read) and these EPITOME levels is learned from."""
        empathy = (levels["ER"] + levels["IP"] + levels["EX"]) / 3
        return empathy >= self.empathy and (relevance is None or relevance >= self.relevance)


@dataclass(frozen=True)
class OptimizerConfig:
    name: str = DEFAULT_OPTIMIZER
    # labeled, bootstrap, mipro: demos per predictor
    max_bootstrapped_demos: int = 2
    max_labeled_demos: int = 2
    max_rounds: int = 1
    # select: shuffled bootstrap candidates beyond the three fixed ones (uncompiled, labeled, bootstrapped)
    select_candidates: int = 0
    # select: a compiled candidate must beat the uncompiled one by this much on the selection set to be kept.
    # On the 8-item seed selection set, bootstrap won by 0.005 (0.541 against 0.536) and then scored
    # 0.496 against 0.541 on dev (docs/bench/main_job_3a739ae.json); labeled had won by 0.042 and held on dev.
    select_margin: float = 0.02
    # mipro
    mipro_candidates: int = 3
    mipro_trials: int = 4
    # gepa
    gepa_max_metric_calls: int = 60
    gepa_minibatch: int = 3
    # simba
    simba_steps: int = 2
    simba_candidates: int = 2
    simba_bsize: int = 4
    # every optimizer, when the reply is scaffolded: rank the openers of each mechanism by the metric on this
    # many training dialogues before compiling (trace_dspy.compact.opener_fit); 0 keeps the stock openers. Off by
    # default: on 200 ED test items a compile with 32 scored -0.0015 [-0.0098, +0.0065] against the stock
    # openers, and on the seed set it cost the main job minutes and lowered dev (docs/results/compiling.md,
    # "Fitted openers").
    opener_items: int = 0
    # every optimizer: choose the further reply plans on this many training dialogues before compiling
    # (trace_dspy.compact.plan_fit): a reply is then written for the LM's plan and for each chosen plan, and the
    # one with the best reply reward is kept. 0: the LM's plan only. On for the default compile: on 24 ED
    # training dialogues it chose EX+EX (training score 0.622 -> 0.661) and dev rose 0.536 -> 0.572, at about
    # 1.7x the LM calls per dialogue on 200 ED test items (docs/results/compiling.md, "Further reply plans").
    plan_items: int = 16
    # finetune (compile --optimizer finetune: a LoRA adapter for the embedded model's reply stage, see
    # trace_dspy.workflows.finetuning): the training data (FINETUNE_MIXES), the pool conversations drawn for it
    # (None: all), the floors a human reply must reach to be learned from (relevance, mean EPITOME level; None:
    # ReplyFloors' defaults, 0.6 and 0.35, above), and the LoRA rank, epochs and learning rate (None:
    # trace_dspy.compact.finetune's defaults).
    finetune_mix: str = "human"
    finetune_limit: int | None = None
    finetune_floors: tuple[float, float] | None = None
    finetune_rank: int | None = None
    finetune_epochs: int | None = None
    finetune_learning_rate: float | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if self.name not in COMPILE_OPTIMIZERS:
            raise ConfigError(f"optimizer {self.name!r}: choose from {', '.join(COMPILE_OPTIMIZERS)}")
        _check_finetune(self)
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, int) and f.name != "seed" and value < 0:
                raise ConfigError(f"optimizer setting {f.name} must be >= 0, got {value}")
        if isinstance(self.select_margin, bool) or not isinstance(self.select_margin, (int, float)) \
                or not 0 <= self.select_margin <= 1:
            raise ConfigError(f"optimizer setting select_margin must be a number in [0, 1], got {self.select_margin!r}")

    def settings(self) -> dict[str, Any]:
        """Only the settings this optimizer uses (for manifests and MLflow params)."""
        if self.name == "finetune":  # no demos, no part fits: the writer is trained, the prompts stay
            return {"name": self.name, "seed": self.seed, **self.finetune_settings()}
        used = {
            "select": ("max_bootstrapped_demos", "max_labeled_demos", "max_rounds", "select_candidates",
                       "select_margin"),
            "labeled": ("max_labeled_demos",),
            "bootstrap": ("max_bootstrapped_demos", "max_labeled_demos", "max_rounds"),
            "mipro": ("max_bootstrapped_demos", "max_labeled_demos", "mipro_candidates", "mipro_trials"),
            "gepa": ("gepa_max_metric_calls", "gepa_minibatch"),
            "simba": ("simba_steps", "simba_candidates", "simba_bsize", "max_bootstrapped_demos"),
        }[self.name]
        return {"name": self.name, "seed": self.seed, **{k: getattr(self, k) for k in used},
                **({"opener_items": self.opener_items} if self.opener_items else {}),
                **({"plan_items": self.plan_items} if self.plan_items else {})}

    def finetune_settings(self) -> dict[str, Any]:
        """The finetune settings: the mix and the limit always, the LoRA settings where they are set."""
        lora = {k: getattr(self, k) for k in ("finetune_floors", "finetune_rank", "finetune_epochs",
                                              "finetune_learning_rate") if getattr(self, k) is not None}
        return {"finetune_mix": self.finetune_mix, "finetune_limit": self.finetune_limit, **lora}

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> OptimizerConfig:
        return from_table(cls, data, "optimizer")


def _check_finetune(cfg: OptimizerConfig) -> None:
    """The finetune settings' types and bounds (ConfigError naming the setting)."""
    if cfg.finetune_mix not in FINETUNE_MIXES:
        raise ConfigError(f"optimizer setting finetune_mix must be one of {', '.join(FINETUNE_MIXES)}, "
                          f"not {cfg.finetune_mix!r:.40}")
    for name in ("finetune_limit", "finetune_rank", "finetune_epochs"):
        value = getattr(cfg, name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ConfigError(f"optimizer setting {name} must be a whole number >= 1, got {value!r:.40}")
    floors = cfg.finetune_floors
    if floors is not None:
        numbers = [x for x in (floors if isinstance(floors, (list, tuple)) else ())
                   if isinstance(x, (int, float)) and not isinstance(x, bool)]
        if len(numbers) != 2 or len(floors) != 2 or not ReplyFloors.in_range(*numbers):
            raise ConfigError("optimizer setting finetune_floors must be two numbers, relevance in [0, 1] and "
                              f"empathy in [0, 2], got {floors!r:.60}")
        object.__setattr__(cfg, "finetune_floors", (float(numbers[0]), float(numbers[1])))  # a TOML list too
    rate = cfg.finetune_learning_rate
    if rate is not None and (isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 < rate <= 1):
        raise ConfigError(f"optimizer setting finetune_learning_rate must be a number in (0, 1], got {rate!r:.40}")


Compiler = Callable[..., dspy.Module]


@dataclass(frozen=True)
class FitRecords:
    """The manifest records of what a compile fitted before optimizing (None: not fitted).

    ``reply_openers``: the openers' fit (trace_dspy.compact.opener_fit); ``reply_plans`` and
    ``first_plan``: the plans' fit and its first-plan race (trace_dspy.compact.plan_fit). The
    artifact writes them with the fitted parts they describe.
    """

    reply_openers: dict[str, Any] | None = None
    reply_plans: dict[str, Any] | None = None
    first_plan: dict[str, Any] | None = None
    writer_adapter: dict[str, Any] | None = None  # the fine-tuned writer's training (trace_dspy.workflows.finetuning)


@dataclass(frozen=True)
class PreFit:
    """What a part fit before optimizing gives: the program with the parts, their manifest records, and the
    parts by attribute name (set again on the compiled program)."""

    program: dspy.Module
    fits: FitRecords
    parts: dict[str, Any]


@dataclass(frozen=True)
class CompiledProgram:
    """What :func:`compile_program` returns: the compiled program, and the records of its fits apart from it."""

    program: dspy.Module
    fits: FitRecords = FitRecords()


def _labeled(cfg, program, metric, trainset, valset, prompt_lm):
    return dspy.LabeledFewShot(k=cfg.max_labeled_demos).compile(program, trainset=trainset, sample=True)


def _bootstrap(cfg, program, metric, trainset, valset, prompt_lm):
    optimizer = dspy.BootstrapFewShot(metric=metric, max_bootstrapped_demos=cfg.max_bootstrapped_demos,
                                      max_labeled_demos=cfg.max_labeled_demos, max_rounds=cfg.max_rounds)
    return optimizer.compile(program, trainset=trainset)


def _select(cfg, program, metric, trainset, valset, prompt_lm):
    """DSPy's BootstrapFewShotWithRandomSearch: score each candidate on ``valset``, keep the best.

    The candidates are the uncompiled program, labeled demos only, bootstrapped
    demos, and ``select_candidates`` more bootstraps from shuffled training
    sets. The best is kept only if it beats the uncompiled program by
    ``select_margin``; otherwise the uncompiled program is. Every candidate's
    score is kept on the result as ``selection``.
    """
    import contextlib
    import sys

    # The optimizer reports its progress with print(), from its constructor on; stdout is the command's
    # result table. The compile prints the candidates' scores itself, so the optimizer's own lines show only
    # with -v (DSPy at INFO).
    import io
    import logging

    chatter = sys.stderr if logging.getLogger("dspy").isEnabledFor(logging.INFO) else io.StringIO()
    with contextlib.redirect_stdout(chatter):
        optimizer = dspy.BootstrapFewShotWithRandomSearch(
            metric=metric, max_bootstrapped_demos=cfg.max_bootstrapped_demos,
            max_labeled_demos=cfg.max_labeled_demos, max_rounds=cfg.max_rounds,
            num_candidate_programs=cfg.select_candidates, num_threads=1)
        best = optimizer.compile(program, trainset=trainset, valset=valset or trainset)
    # -3 is the program as given: uncompiled, or with the openers this compile fitted and no demos
    fitted = getattr(program, "reply_openers", None) or getattr(program, "reply_plans", None)
    kinds = {-3: "no demos" if fitted else "uncompiled", -2: "labeled",
             -1: "bootstrap"}
    candidates = sorted(getattr(best, "candidate_programs", []), key=lambda c: c["seed"])
    if hasattr(best, "candidate_programs"):
        del best.candidate_programs  # every candidate program: not part of the compiled artifact
    winner = next((c for c in candidates if c["program"] is best), None)
    uncompiled = next((c for c in candidates if c["seed"] == -3), None)
    if winner is not None and uncompiled is not None and winner is not uncompiled \
            and float(winner["score"]) - float(uncompiled["score"]) < 100.0 * cfg.select_margin:
        kept = uncompiled["program"]
    else:
        kept = best
    kept.selection = [{"candidate": kinds.get(c["seed"], f"bootstrap-shuffled-{c['seed']}"),
                       "score": round(float(c["score"]) / 100.0, 4), "chosen": c["program"] is kept}
                      for c in candidates]
    return kept


def _mipro(cfg, program, metric, trainset, valset, prompt_lm):
    try:
        import optuna  # noqa: F401
    except ImportError:
        raise ConfigError(f'MIPROv2 needs optuna: {install_hint("mipro")}') from None
    optimizer = dspy.MIPROv2(metric=metric, prompt_model=prompt_lm, auto=None, num_candidates=cfg.mipro_candidates,
                             max_bootstrapped_demos=cfg.max_bootstrapped_demos,
                             max_labeled_demos=cfg.max_labeled_demos, seed=cfg.seed, verbose=False,
                             num_threads=1)
    return optimizer.compile(program, trainset=trainset, valset=valset, num_trials=cfg.mipro_trials,
                             minibatch=False, requires_permission_to_run=False)


def _gepa(cfg, program, metric, trainset, valset, prompt_lm):
    if prompt_lm is None:
        raise ConfigError("GEPA needs a reflection LM: set [lm.prompt] or --prompt-lm")
    optimizer = dspy.GEPA(metric=metric, reflection_lm=prompt_lm, max_metric_calls=cfg.gepa_max_metric_calls,
                          reflection_minibatch_size=cfg.gepa_minibatch, seed=cfg.seed, track_stats=False)
    return optimizer.compile(program, trainset=trainset, valset=valset)


def _simba(cfg, program, metric, trainset, valset, prompt_lm):
    if len(trainset) < cfg.simba_bsize:
        raise ConfigError(f"SIMBA needs at least bsize={cfg.simba_bsize} training examples, got {len(trainset)}")
    optimizer = dspy.SIMBA(metric=metric, bsize=cfg.simba_bsize, num_candidates=cfg.simba_candidates,
                           max_steps=cfg.simba_steps, max_demos=cfg.max_bootstrapped_demos,
                           prompt_model=prompt_lm, num_threads=1)
    return optimizer.compile(program, trainset=trainset, seed=cfg.seed)


COMPILERS: dict[str, Compiler] = {
    "select": _select, "labeled": _labeled, "bootstrap": _bootstrap, "mipro": _mipro, "gepa": _gepa, "simba": _simba,
}


def optimizer_progress(cfg: OptimizerConfig) -> Progress:
    """The optimizer's phase: DSPy's loops report through it (counting_dspy_calls). ``select`` scores a
    known number of candidates (each a ``dspy.Evaluate``); the others' loops are counted in LM calls."""
    if cfg.name == "select":
        return progress(desc="optimizer select", total=3 + cfg.select_candidates, unit="candidates scored")
    return heartbeat(f"optimizer {cfg.name}")


def compile_program(cfg: OptimizerConfig, program: dspy.Module, metric, trainset: Sequence[dspy.Example],
                    valset: Sequence[dspy.Example], *, prompt_lm: dspy.LM | None = None,
                    log: Callable[[str], None] | None = None,
                    fit_parts: Callable[..., PreFit | None] | None = None) -> CompiledProgram:
    """Compile ``program`` with the configured optimizer; the program's stage LMs carry over.

    ``fit_parts(program, trainset, log)``, where given, fits parts of the program before the optimizer runs
    (the compact writer's openers and plans: ``trace_dspy.program.writers.part_fitter``); the optimizer then
    compiles the program that has them, the compiled program carries them, and the result's ``fits`` holds
    their records (for the manifest).
    """
    if not trainset:
        raise ConfigError("the training set is empty")
    if cfg.name not in COMPILERS:  # finetune trains the writer's weights: trace_dspy.workflows.finetuning
        raise ConfigError(f"the {cfg.name} optimizer runs through the compile workflow (compile --optimizer "
                          f"{cfg.name}), not compile_program")
    prefit = fit_parts(program, list(trainset), log or (lambda message: None)) if fit_parts else None
    if prefit is not None:
        program = prefit.program
    with optimizer_progress(cfg) as phase, counting_dspy_calls(phase):
        compiled = COMPILERS[cfg.name](cfg, program, metric, list(trainset), list(valset), prompt_lm)
    for name, value in (prefit.parts if prefit is not None else {}).items():
        setattr(compiled, name, value)  # an optimizer that rebuilds the program must not lose them
    # Optimizers reset predictor LMs; TraceProgram keeps stage LMs outside its predictors,
    # but a foreign module may not: put them back if the copy lost them.
    if hasattr(program, "stage_lms") and hasattr(compiled, "set_stage_lms") and not compiled.stage_lms:
        compiled.set_stage_lms(program.stage_lms)
    return CompiledProgram(compiled, prefit.fits if prefit is not None else FitRecords())
