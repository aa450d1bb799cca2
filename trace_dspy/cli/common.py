"""Command-line pieces shared by the ``python -m trace_dspy.*`` commands."""

from __future__ import annotations

import argparse
import dataclasses
import contextlib
import logging
import sys
from pathlib import Path
from typing import Any

from trace_dspy.core.config import WRITER_CHOICES, ConfigError, ProgramConfig, check_tables, read_toml
from trace_dspy.core.console import clear_status_line, escape_logs_and_warnings, out, say, status_line
from trace_dspy.core.stages import REGISTRY
from trace_dspy.lm.specs import LMConfig, offline_litellm
from trace_dspy.store.tracking import DEFAULT_EXPERIMENT
from trace_dspy.workflows.settings import Settings





def add_model_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("model")
    group.add_argument("--config", metavar="TOML", help="config file with [program] and [lm] tables")
    group.add_argument("--lm", metavar="MODEL",
                       help="'local' (embedded SmolLM2, the default), 'local:/path/model.gguf', "
                            "or a dspy.LM model string such as openai/gpt-4o-mini")
    group.add_argument("--api-base", metavar="URL", help="API base URL for the --lm model")
    group.add_argument("--api-key-env", metavar="VAR",
                       help="name of the environment variable that holds the API key (never the key itself)")
    group.add_argument("--analysis-lm", metavar="MODEL", help="model for the emotion, cause and strategy stages")
    group.add_argument("--response-lm", metavar="MODEL", help="model for the reply stage")
    group.add_argument("--judge-lm", metavar="MODEL", help="model for the empathy judge")
    group.add_argument("--writer", choices=WRITER_CHOICES,
                       help="how the program writes: standard (TRACE as published), compact (the small-model "
                            "writer), or auto: compact on the embedded model, standard on others (default: the "
                            "program's [program] writer, auto)")
    group.add_argument("--prompt-lm", metavar="MODEL", help="model that optimizers use to write instructions")
    group.add_argument("--timeout", type=float, metavar="SECONDS",
                       help="seconds to wait for one model request before retrying it (default 60; [lm] timeout)")
    group.add_argument("--trust-artifact-lm", action="store_true",
                       help="use the endpoint (api_base) and key variable that a loaded artifact records; "
                            "without it, such an artifact is refused and you name the endpoint yourself")
    group.add_argument("--allow-unverified-model", action="store_true",
                       help="load a champion, models:/ or runs:/ program whose files have no sha256 record in "
                            "the store (deleted, or logged before records were kept), unchecked, with a warning; "
                            "without it, such a program is refused")


def settings_from_args(args: argparse.Namespace) -> Settings:
    raw: dict[str, Any] = read_toml(args.config) if getattr(args, "config", None) else {}
    check_tables(raw, getattr(args, "config", None))  # before [program] and [lm], so that their errors come after
    program = ProgramConfig.from_dict(raw.get("program"))
    writer = getattr(args, "writer", None)
    if writer:
        program = dataclasses.replace(program, writer=writer)
    lm = LMConfig.from_dict(raw.get("lm")).with_overrides(
        lm=args.lm, api_base=args.api_base, api_key_env=args.api_key_env,
        analysis_lm=args.analysis_lm, response_lm=args.response_lm,
        judge_lm=args.judge_lm, prompt_lm=args.prompt_lm,
    )
    timeout = getattr(args, "timeout", None)
    if timeout is not None:
        if not timeout > 0:
            raise ConfigError(f"--timeout must be a positive number of seconds, not {timeout:g}")
        lm = lm.with_timeout(timeout)
    explicit = "lm" in raw or any(getattr(args, k, None) for k in (
        "lm", "api_base", "api_key_env", "analysis_lm", "response_lm", "judge_lm", "prompt_lm"))
    return Settings(program=program, lm=lm, raw=raw, config_path=getattr(args, "config", None), lm_explicit=explicit,
                    trust_artifact_lm=bool(getattr(args, "trust_artifact_lm", False)), timeout=timeout,
                    allow_unverified_model=bool(getattr(args, "allow_unverified_model", False)), writer=writer)


def add_trace_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--trace", action="store_true",
                        help="record each answer as an MLflow trace (stage spans, LM calls) in the tracking store "
                             "($MLFLOW_TRACKING_URI, else sqlite:///mlflow.db); also [tracing] enabled = true")


def trace_requested(args: argparse.Namespace, settings: Settings) -> bool:
    return bool(getattr(args, "trace", False)) or settings.tracing.enabled


def enter_tracing(stack: contextlib.ExitStack, args: argparse.Namespace, settings: Settings) -> int | None:
    """Trace inside ``stack`` when ``--trace`` or ``[tracing]`` asks for it; an exit status if the store is not
    usable, else None."""
    try:
        stack.enter_context(traced(trace_requested(args, settings)))
    except Exception as exc:  # noqa: BLE001 - an unusable tracking store
        from trace_dspy.store.tracking import error_line

        return fail(f"--trace: the tracking store is not usable: {error_line(exc)}")
    return None


@contextlib.contextmanager
def traced(enabled: bool):
    """Inside the block the program records MLflow traces (when ``enabled``); on the way out the ids of
    the traces it made are printed to stderr."""
    if not enabled:
        yield
        return
    import dspy

    from trace_dspy.core import spans
    from trace_dspy.store.tracking import prepare_tracing
    from trace_dspy.store.traces import flush_traces, tracing

    prepare_tracing(None, DEFAULT_EXPERIMENT)
    callback = spans.lm_span_callback()
    with tracing(), dspy.context(callbacks=[*dspy.settings.callbacks, callback]):
        try:
            yield
        finally:
            flush_traces()
            trace_id = spans.last_trace_id()
            last = f" (the last one here: {trace_id})" if trace_id else ""
            say(f"traces are in the MLflow experiment {DEFAULT_EXPERIMENT}{last}")


def setup_logging(verbose: bool = False) -> None:
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    for noisy in ("LiteLLM", "litellm", "httpx", "mlflow", "alembic", "bm25s", "py4j"):
        logging.getLogger(noisy).setLevel(logging.WARNING if verbose else logging.ERROR)
    # DSPy's optimizers log each candidate's score at INFO through DSPy's own handler; the compile prints
    # its selection scores itself. -v shows them.
    logging.getLogger("dspy").setLevel(logging.INFO if verbose else logging.WARNING)
    # llama-cpp-python opens /dev/null twice at import and keeps both open for its whole life; when a
    # library turns ResourceWarning on, the interpreter reports them at exit. Nothing to act on.
    import warnings

    warnings.filterwarnings("ignore", category=ResourceWarning, message=r"unclosed file .*name='/dev/null'")
    # A reply capped at its token budget is expected (the reply stage keeps two sentences of it); DSPy
    # warns on every such call, which buried the replies of respond and chat. --verbose shows them.
    lm_log = logging.getLogger("dspy.clients.lm")
    (lm_log.removeFilter if verbose else lm_log.addFilter)(_drop_truncation_warnings)
    from trace_dspy.program.lm_warnings import show_truncation_warnings

    show_truncation_warnings(verbose)  # program calls drop them on their own, unless shown
    # MLflow draws a progress bar for every artifact download (a compile's registration, a models:/ load),
    # even for a few local files; a value the user set wins.
    import os

    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "true" if verbose else "false")
    # Offline by default: MLflow would otherwise send usage telemetry over the network (a value the
    # user set, or DO_NOT_TRACK, still wins).
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    offline_litellm()
    bars_only_on_terminals()
    escape_logs_and_warnings()  # log lines and warnings show control characters as escapes


def _drop_truncation_warnings(record: logging.LogRecord) -> bool:
    return not str(record.getMessage()).startswith("LM response was truncated")


def _isatty(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def bars_only_on_terminals() -> None:
    """Keep every tqdm bar, DSPy's included, out of files, pipes and logs.

    DSPy's optimizers draw their own bars (BootstrapFewShot on stderr, the
    parallel evaluator on stdout) whatever the stream is. Commands replace
    ``tqdm.tqdm`` with a subclass that switches a bar off when its stream is
    not a terminal; on a terminal nothing changes.
    """
    import tqdm

    if getattr(tqdm.tqdm, "_trace_dspy_quiet", False):
        return
    base = tqdm.tqdm

    class TerminalOnlyTqdm(base):
        _trace_dspy_quiet = True

        def __init__(self, *args, **kwargs):
            if not _isatty(kwargs.get("file") or sys.stderr):
                kwargs["disable"] = True
            super().__init__(*args, **kwargs)

    tqdm.tqdm = TerminalOnlyTqdm


def failure_rate(text: str) -> float:
    """argparse type for --max-failure-rate: a share from 0 to 1."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number from 0 to 1, not {text!r}") from None
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"expected a share from 0 to 1 (0.5 = half the examples), not {text}")
    return value


def price(text: str) -> float:
    """argparse type for --price-input and --price-output: USD per million tokens, a finite number >= 0."""
    from trace_dspy.core.pricing import PriceError, check_price

    try:
        return check_price(text, "the price")
    except PriceError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_pricing_args(parser: argparse.ArgumentParser) -> None:
    """--price-input and --price-output: what 1,000 dialogues would cost on a hosted LM at these prices."""
    from trace_dspy.core.pricing import DEFAULT_INPUT_PRICE, DEFAULT_OUTPUT_PRICE

    group = parser.add_argument_group(
        "cost on a hosted LM", "the cost per 1,000 dialogues of the tokens the run used, at these prices (the "
        "record states them; the defaults are an example price of a small hosted model)")
    group.add_argument("--price-input", type=price, default=DEFAULT_INPUT_PRICE, metavar="USD",
                       help=f"USD per million input (prompt) tokens (default {DEFAULT_INPUT_PRICE})")
    group.add_argument("--price-output", type=price, default=DEFAULT_OUTPUT_PRICE, metavar="USD",
                       help=f"USD per million output (completion) tokens (default {DEFAULT_OUTPUT_PRICE})")


def pricing_from_args(args: argparse.Namespace):
    """The Pricing of --price-input and --price-output."""
    from trace_dspy.core.pricing import Pricing

    return Pricing(args.price_input, args.price_output)


def output_dir(text: str) -> Path:
    """argparse type for --output-dir: a folder, or a path where one can be made."""
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} exists and is not a folder")
    blocking = next((p for p in path.parents if p.exists() and not p.is_dir()), None)
    if blocking is not None:
        raise argparse.ArgumentTypeError(f"{text}: {blocking} is a file, so no folder can be made there")
    from trace_dspy.workflows.preflight import folder_problem

    problem = folder_problem(path)  # a folder, or its nearest existing parent, that cannot be written
    if problem:
        raise argparse.ArgumentTypeError(f"{text} {problem}")
    return path


class CommandParser(argparse.ArgumentParser):
    """argparse for the commands: its usage, help and error messages go through the console, escaped, since
    they quote what the user typed ("unrecognized arguments: ...")."""

    def _print_message(self, message: str, file=None) -> None:
        if message:
            try:
                (say if file is sys.stderr else out)(message.rstrip("\n"))
            except OSError:  # a closed pipe (--help | head), as argparse itself ignores
                pass


def command_parser(module: str, doc: str, prog: str | None = None, **kwargs: Any) -> argparse.ArgumentParser:
    """The parser of the command ``python -m trace_dspy.<module>``, described by the first paragraph of ``doc``
    (its module docstring). ``prog`` is the name its usage shows: ``trace-dspy NAME`` when the console script
    runs it (``cli/main.py`` passes it to the command's ``main``), else (None) ``python -m trace_dspy.<module>``."""
    return CommandParser(prog=prog or f"python -m trace_dspy.{module}", description=doc.split("\n\n")[0], **kwargs)


def command_line(module: str, argv: list[str]) -> str:
    """How a command was run, for its records: ``python -m trace_dspy.<module> ARGS``, with credentials
    (a password in an --api-base URL) masked."""
    import shlex

    from trace_dspy.core.safety import redact

    return redact(f"python -m trace_dspy.{module} {shlex.join(argv)}", limit=None)


def fail(message: str, code: int = 2) -> int:
    """Print one ``error:`` line (credentials masked, control characters escaped); return the exit code."""
    from trace_dspy.core.safety import redact

    say(f"error: {redact(message)}")
    return code




# What a status line says while each stage runs.
STAGE_WORDS = {s.name: s.status for s in REGISTRY}


class TerminalStatus:
    """One self-overwriting status line on a terminal's stderr; silent when stderr is piped or redirected."""

    def __init__(self, stream=None):
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = bool(getattr(self.stream, "isatty", lambda: False)())
        self.shown = False
        self.text = None  # what the line says now

    def show(self, text: str) -> None:
        # The same words again (a reply written for a second plan, a further candidate) leave the line as it is.
        if self.enabled and not (self.shown and text == self.text):
            status_line(text, self.stream)
            self.shown = True
            self.text = text

    def clear(self) -> None:
        if self.shown:
            clear_status_line(self.stream)
            self.shown = False
            self.text = None


def stage_status_callback(program, status: TerminalStatus):
    """A DSPy callback that shows which stage of ``program`` is running on ``status``."""
    from dspy.utils.callback import BaseCallback

    names = {id(p): n for n, p in program.named_predictors()}

    class _StageStatus(BaseCallback):
        def on_module_start(self, call_id, instance, inputs):
            name = names.get(id(instance))
            if name:
                status.show(f"thinking: {STAGE_WORDS.get(name, name)}...")

    return _StageStatus()


def warm_up_with_status(lm, status: TerminalStatus) -> None:
    """Load an embedded model before the first stage, saying so on the terminal."""
    engine = getattr(lm, "engine", None)
    if hasattr(engine, "warm_up"):
        status.show("loading the model...")
        engine.warm_up()


def existing_file(value: str) -> Path:
    path = Path(value)
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"no such file: {value}")
    return path


def add_data_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("data")
    group.add_argument("--data", help="data source: ED CSV folder, JSONL file or folder, or hf:<id> "
                                      "(default: $TRACE_DSPY_DATA, else the built-in seed set)")
    group.add_argument("--seed", type=int, default=0, help="seed for splits and sampling (default 0)")


def add_situations_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--situations", metavar="CSV",
                        help="labelled situation prompts the emotion prior also learns from (situation,emotion "
                             "columns; default: $TRACE_DSPY_SITUATIONS, else none; 'none' ignores the variable)")


def add_tracking_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("tracking")
    group.add_argument("--tracking-uri", help="MLflow tracking URI (default sqlite:///mlflow.db in the working dir)")
    group.add_argument("--experiment", default=DEFAULT_EXPERIMENT, help=f"MLflow experiment (default {DEFAULT_EXPERIMENT})")
    group.add_argument("--no-mlflow", action="store_true", help="do not log to MLflow")


def add_run_args(parser: argparse.ArgumentParser, *, situations: bool = False, model: bool = True,
                 pricing: bool = False) -> None:
    """The flags a command that runs over a data source and logs to MLflow ends with, in this order: ``-v``,
    the data source (:func:`add_data_args`), with ``situations`` :func:`add_situations_arg`, with ``model``
    :func:`add_model_args`, :func:`add_tracking_args`, and with ``pricing`` :func:`add_pricing_args`."""
    parser.add_argument("-v", "--verbose", action="store_true")
    add_data_args(parser)
    if situations:
        add_situations_arg(parser)
    if model:
        add_model_args(parser)
    add_tracking_args(parser)
    if pricing:
        add_pricing_args(parser)


def add_refit_args(parser: argparse.ArgumentParser) -> None:
    """--output, --json and --check of a head's refit command (``--json`` lands in ``json_path``, the name of
    the refit's keyword)."""
    parser.add_argument("--output", type=Path, help="where to write the weights (default: the packaged file)")
    parser.add_argument("--json", type=Path, dest="json_path", metavar="JSON",
                        help="also write the dev table and settings as JSON")
    parser.add_argument("--check", action="store_true",
                        help="refit without writing; exit 1 unless the dev table matches the weights at --output")


def ed_refit_parser(module: str, doc: str, prog: str | None, *, seed_help: str) -> argparse.ArgumentParser:
    """The parser of the refit command ``module`` of a head fitted on the ED pool (``--data``, ``--seed``
    described by ``seed_help``, ``--limit``, then :func:`add_refit_args`); see :func:`command_parser` for
    ``doc`` and ``prog``."""
    parser = command_parser(module, doc, prog)
    parser.add_argument("--data", help="ED folder with valid.csv and test.csv (default: $TRACE_DSPY_DATA)")
    parser.add_argument("--seed", type=int, default=0, help=seed_help)
    parser.add_argument("--limit", type=int, help="fit on a seeded sample of about this many pool rows")
    add_refit_args(parser)
    return parser


def refit_main(argv: list[str] | None, parser: argparse.ArgumentParser, module: str, refit) -> int:
    """A refit command: parse ``argv`` (None: the process's), call ``refit`` (a ``workflows.fits`` refit) with
    the flags as keywords (the parser's names are its keywords) and the recorded ``command``, print it; the
    exit code. The recorded command leaves out ``--check``."""
    import shlex

    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    setup_logging()
    command = f"python -m trace_dspy.{module} " + shlex.join(a for a in argv if a != "--check")
    try:
        result = refit(**vars(args), command=command)
    except ValueError as exc:
        return fail(str(exc))
    return print_refit(result)


def print_refit(refit) -> int:
    """Print a head's refit (a ``workflows.fits.Refit``): its table, then where the weights went or, for
    ``--check``, whether the table matches the recorded one; returns the exit code (1: it differs)."""
    out(refit.text)
    if refit.matches is None:
        out(f"weights: {refit.output}")
        return 0
    out(("matches " if refit.matches else "DIFFERS from ") + str(refit.output))
    return 0 if refit.matches else 1


def add_embedded_args(parser: argparse.ArgumentParser) -> None:
    """The flags of the embedded-model bench (``bench_local``, ``bench embedded``)."""
    parser.add_argument("--data", help="data source (default: $TRACE_DSPY_DATA, else the seed set)")
    parser.add_argument("--limit", type=int, default=100)
    parser.add_argument("--reuse-limit", type=int, default=20, help="dialogues for the no-reuse run")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-raw", action="store_true", help="skip the raw llama.cpp replay")
    parser.add_argument("--no-reuse-run", action="store_true", help="skip the prefix-reuse-off run")
    parser.add_argument("--best-of", type=lambda v: [int(x) for x in v.split(",")], metavar="N,N,...",
                        help="only measure Best-of-N on the reply stage for these N (the first is the baseline)")
    parser.add_argument("--threads", type=int, help="llama.cpp threads (default: the engine's)")
    parser.add_argument("--batching", action="store_true",
                        help="only measure decode steps with 1-8 sequences per llama.cpp batch")
    parser.add_argument("--guard", action="store_true",
                        help="only compare the loop guard off and on (with retrieval from the data's pool)")
    parser.add_argument("--profile", action="store_true",
                        help="only time prompt reading against generation (with retrieval from the data's pool)")
    parser.add_argument("--batch-logits", action="store_true",
                        help="only check whether batched logits equal one-token-at-a-time logits")
    parser.add_argument("--output", type=Path, help="write the results as JSON")


def run_embedded_command(argv: list[str], prog: str, description: str) -> int:
    """Parse the embedded-model bench's flags, measure, print the table; the exit code."""
    from trace_dspy.bench.embedded import EmbeddedOptions, run_embedded

    parser = CommandParser(prog=prog, description=description)
    add_embedded_args(parser)
    args = parser.parse_args(argv)
    setup_logging()
    from trace_dspy.core import env
    from trace_dspy.workflows.preflight import PreflightError, check_environment, check_output_file

    try:  # before the model loads and the measuring starts
        check_environment(env.CACHE)
        check_output_file(args.output, "--output")
    except PreflightError as exc:
        return fail(str(exc))
    options = EmbeddedOptions(**vars(args), command="python -m trace_dspy.bench_local " + " ".join(argv))
    out(run_embedded(options))
    return 0
