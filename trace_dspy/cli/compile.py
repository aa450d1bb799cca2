"""Compile the TRACE program against the empathy metric; version, track, register.

    python -m trace_dspy.compile                      # offline, embedded model, defaults
    python -m trace_dspy.compile --optimizer gepa --prompt-lm openai/gpt-4o --train 64 --dev 32
    python -m trace_dspy.compile --optimizer finetune --finetune-mix human   # a LoRA-tuned writer (CPU, long)

A compile evaluates the uncompiled program on dev, compiles (by default
``select``: the uncompiled, labeled-demo and bootstrapped programs are scored
on a selection set drawn apart from train and dev, and the best is kept),
evaluates the
compiled program on the same dev set, saves ``artifacts/<name>/vNNNN/``, logs
an MLflow run (params, before/after metrics, artifacts), registers a model
version, and moves the ``champion`` alias when the dev score beats the
current champion's. It ends with the before/after table.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

from trace_dspy.cli.common import (
    add_run_args, command_line, command_parser, fail, failure_rate, settings_from_args, setup_logging)
from trace_dspy.core import env
from trace_dspy.core.config import ConfigError
from trace_dspy.core.console import out, say
from trace_dspy.data.sources import DataError
from trace_dspy.optimize.optimizers import COMPILE_OPTIMIZERS, FINETUNE_MIXES
from trace_dspy.workflows.compiling import CompileConfig, CompileFailed, run_compile
from trace_dspy.workflows.evaluation import FailureRateExceeded
from trace_dspy.workflows.preflight import PreflightError, check_output_folder, check_run_settings


def floors_arg(text: str) -> tuple[float, float]:
    """``--finetune-floors RELEVANCE,EMPATHY`` as two numbers (their ranges are the optimizer config's check)."""
    try:
        relevance, empathy = (float(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected two numbers as RELEVANCE,EMPATHY (e.g. 0.6,0.35), "
                                         f"not {text!r:.40}") from None
    return relevance, empathy


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    parser = command_parser("compile", __doc__, prog)
    opt = parser.add_argument_group("optimizer")
    opt.add_argument("--optimizer", choices=COMPILE_OPTIMIZERS, help="default: select (the best of the uncompiled, labeled and bootstrapped programs "
                                                          "on a selection set; see docs/results/compiling.md)")
    opt.add_argument("--max-demos", type=int, dest="max_bootstrapped_demos", help="bootstrapped demos per stage")
    opt.add_argument("--max-labeled", type=int, dest="max_labeled_demos", help="labeled demos per stage")
    opt.add_argument("--max-rounds", type=int, help="bootstrap rounds")
    opt.add_argument("--select-candidates", type=int, help="select: extra shuffled bootstrap candidates (default 0)")
    opt.add_argument("--select-margin", type=float,
                     help="select: how much a compiled candidate must beat the uncompiled one by on the selection "
                          "set (composite, default 0.02)")
    opt.add_argument("--mipro-candidates", type=int, help="MIPROv2 instruction/demo candidates")
    opt.add_argument("--mipro-trials", type=int, help="MIPROv2 trials")
    opt.add_argument("--gepa-max-metric-calls", type=int, help="GEPA budget in metric calls")
    opt.add_argument("--gepa-minibatch", type=int, help="GEPA reflection minibatch size")
    opt.add_argument("--simba-steps", type=int, help="SIMBA steps")
    opt.add_argument("--simba-candidates", type=int, help="SIMBA candidates per step")
    opt.add_argument("--simba-bsize", type=int, help="SIMBA minibatch size")
    opt.add_argument("--opener-items", type=int,
                     help="scaffolded replies: training dialogues the openers are ranked on before compiling "
                          "(default 0: the stock openers; measured in docs/results/compiling.md, \"Fitted openers\")")
    opt.add_argument("--plan-items", type=int,
                     help="training dialogues the further reply plans are chosen on before compiling (0: the LM's "
                          "plan only; docs/results/compiling.md, \"Further reply plans\")")
    opt.add_argument("--finetune-mix", choices=FINETUNE_MIXES,
                     help="finetune: what the writer's LoRA adapter learns from: the pool's human listener replies "
                          "(default), the program's replies the metric passes, or both")
    opt.add_argument("--finetune-limit", type=int,
                     help="finetune: pool conversations drawn for training (default: all of the training side)")
    opt.add_argument("--finetune-floors", type=floors_arg, metavar="RELEVANCE,EMPATHY",
                     help="finetune: the least relevance (0-1) and mean EPITOME level (0-2) a human reply needs to "
                          "be learned from (default 0.6,0.35; 0,0 keeps every reply)")
    opt.add_argument("--finetune-rank", type=int, help="finetune: LoRA rank (default 16)")
    opt.add_argument("--finetune-epochs", type=int, help="finetune: passes over the training examples (default 1)")
    opt.add_argument("--finetune-lr", type=float, dest="finetune_learning_rate",
                     help="finetune: learning rate (default 5e-4)")
    parser.add_argument("--train", type=int, help="training examples (default 16)")
    parser.add_argument("--dev", type=int, help="dev examples for before/after (default 16)")
    parser.add_argument("--val", type=int, help="selection examples, from the training side, apart from the train "
                                                "sample (default 8)")
    parser.add_argument("--name", help="artifact name (default trace-dspy)")
    parser.add_argument("--artifacts-dir", help="artifact root (default $TRACE_DSPY_ARTIFACTS or ./artifacts)")
    parser.add_argument("--threads", type=int, help="parallel evaluation calls (default 4)")
    parser.add_argument("--registered-model", help="MLflow registered model (default trace-dspy)")
    parser.add_argument("--max-failure-rate", type=failure_rate, help="stop when more dev examples fail (default 0.5)")
    parser.add_argument("--trace", action=argparse.BooleanOptionalAction, default=True,
                        help="log the dev evaluations before and after as MLflow evaluation runs, one trace per "
                             "dialogue (default on; --no-trace keeps the run's metrics and writes no traces)")
    add_run_args(parser, situations=True)
    return parser


def config_from_args(argv: list[str], prog: str | None = None) -> CompileConfig:
    """Flags win over the TOML file ([optimizer] and [data] tables), which win over defaults."""
    args = build_parser(prog).parse_args(argv)
    settings = settings_from_args(args)
    flags = {key: getattr(args, key) for key in (
        "max_bootstrapped_demos", "max_labeled_demos", "max_rounds", "select_candidates", "select_margin",
        "mipro_candidates", "mipro_trials", "gepa_max_metric_calls", "gepa_minibatch", "simba_steps",
        "simba_candidates", "simba_bsize", "opener_items", "plan_items", "finetune_mix", "finetune_limit",
        "finetune_floors", "finetune_rank", "finetune_epochs", "finetune_learning_rate")}
    optimizer = settings.optimizer(**flags, name=args.optimizer or None,
                                   seed=(settings.raw.get("optimizer") or {}).get("seed", args.seed))
    default = {f.name: f.default for f in dataclasses.fields(CompileConfig)}
    cfg = CompileConfig(
        settings=settings,
        optimizer=optimizer,
        data=dataclasses.replace(settings.data, source=settings.data_source(args.data),
                                 **{size: getattr(args, size) for size in ("train", "dev", "val")
                                    if getattr(args, size) is not None}),
        situations=args.situations,
        seed=args.seed,
        name=args.name or default["name"],
        artifacts_dir=args.artifacts_dir,
        threads=args.threads or default["threads"],
        tracking_uri=args.tracking_uri,
        experiment=args.experiment,
        mlflow=not args.no_mlflow,
        trace=args.trace,
        registered_model=args.registered_model or default["registered_model"],
        max_failure_rate=(args.max_failure_rate if args.max_failure_rate is not None
                          else default["max_failure_rate"]),
        command=command_line("compile", argv),
        extra={"verbose": args.verbose},
    )
    if cfg.data.train < 1 or cfg.data.dev < 1:
        raise ConfigError("--train and --dev must be at least 1")
    if cfg.data.val < 0:
        raise ConfigError("--val must be at least 0")
    return cfg


def preflight(cfg: CompileConfig) -> None:
    """The settings a compile reads and the places it writes, checked before anything is fitted
    (``PreflightError``): a compile takes minutes to hours, and its artifact is written last."""
    from trace_dspy.store.artifacts import artifacts_root

    check_run_settings(cfg.tracking_uri, tracked=cfg.mlflow)
    named = ("--artifacts-dir" if cfg.artifacts_dir else f"${env.ARTIFACTS}" if env.value(env.ARTIFACTS)
             else "the folder")
    check_output_folder(artifacts_root(cfg.artifacts_dir), named)


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        cfg = config_from_args(argv, prog)
        preflight(cfg)
    except (ConfigError, PreflightError) as exc:
        return fail(str(exc))
    setup_logging(cfg.extra.get("verbose", False))
    try:
        result = run_compile(cfg)
    except (ConfigError, DataError, ValueError, ImportError) as exc:
        return fail(str(exc))
    except FailureRateExceeded as exc:  # its rows lived in a temporary folder: nothing to resume
        return fail(f"{exc.reason} No artifact version was written.", code=1)
    except CompileFailed as exc:
        return fail(f"{exc} No artifact version was written.", code=1)
    except KeyboardInterrupt as exc:  # a fine-tune says at which step it stopped and where it resumes
        said = f"{exc}; " if str(exc) else ""
        say(f"\ninterrupted: {said}no artifact version was written (versions appear only when complete)")
        return 130
    out(result.table())
    if result.after.get("collapsed"):
        out(f"\nCOLLAPSED: {result.after['collapse_reason']}")
    out(f"\nartifact: {result.artifact}")
    if result.run_id:
        out(f"mlflow run: {result.run_id}; registered {cfg.registered_model} version {result.registry_version}"
            + ("; now champion" if result.promoted else "; champion unchanged"))
    out(f"load it: trace_dspy.load('{cfg.name}@v{result.manifest['version']}')  ({result.seconds:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["build_parser", "config_from_args", "main"]
