"""The ``trace-dspy`` console script: one entry point whose subcommands are the ``python -m`` commands.

    trace-dspy respond "I failed my driving test again."
    trace-dspy compile --optimizer labeled
    trace-dspy inspect trace-dspy@v1

``trace-dspy NAME ARGS`` imports the command's module (``trace_dspy.cli.<module>``) only once NAME is chosen,
so this module imports no command and commands stay independent, and calls its ``main(ARGS, prog=...)``: every
flag, exit code and output is the command's own, and its usage names it ``trace-dspy NAME``.
``python -m trace_dspy.NAME`` runs the same ``main`` through its launcher, named ``python -m trace_dspy.NAME``.
"""

from __future__ import annotations

import importlib
import sys

from trace_dspy.core.console import out, say

PROG = "trace-dspy"

# name -> (its module in trace_dspy.cli, what it does); a new command is a row here (tests/cli/test_main.py
# fails for a module of trace_dspy.cli with a ``main`` that has none)
COMMANDS: dict[str, tuple[str, str]] = {
    "respond": ("respond", "answer a message, or a JSONL file of dialogues"),
    "chat": ("chat", "talk to the program in the terminal, one turn at a time"),
    "compile": ("compile", "compile the program against the empathy metric; version, track, register"),
    "evaluate": ("evaluate", "evaluate a program on EmpatheticDialogues and log the run to MLflow"),
    "inspect": ("inspect_artifact", "show what a compiled artifact holds, or what changed between two"),
    "fit_prior": ("fit_prior", "refit the emotion prior shipped with the package, or write one elsewhere"),
    "fit_empathy": ("fit_empathy", "refit the learned empathy scorer on EPITOME"),
    "fit_relevance": ("fit_relevance", "refit the metric's learned relevance head"),
    "fit_tone": ("fit_tone", "refit the reply reward's tone head"),
    "metric_validity": ("metric_validity", "the validity study behind the empathy metric's weights"),
    "bench": ("bench", "benchmarks: what the compiled program buys, what it costs, the performance budget"),
    "bench_local": ("bench_local", "measure the embedded model: speed, prefix reuse, parse failures"),
}


def usage() -> str:
    width = max(map(len, COMMANDS))
    rows = "\n".join(f"  {name:<{width}}  {what}" for name, (_, what) in COMMANDS.items())
    return (f"usage: {PROG} COMMAND [ARGS ...]\n\nTRACE empathetic replies as a compiled DSPy program.\n\n"
            f"commands:\n{rows}\n\n'{PROG} COMMAND --help' lists a command's options;\n"
            f"'{PROG} COMMAND ...' is the same as 'python -m trace_dspy.COMMAND ...'.")


def main(argv: list[str] | None = None) -> int:
    """Run ``trace-dspy COMMAND ARGS``; returns the command's exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        (out if argv else say)(usage())
        return 0 if argv else 2
    name, args = argv[0], argv[1:]
    if name not in COMMANDS:
        say(f"{PROG}: unknown command {name!r} (choose from {', '.join(COMMANDS)})\n\n{usage()}")
        return 2
    command = importlib.import_module(f"trace_dspy.cli.{COMMANDS[name][0]}")
    try:
        return _exit_code(command.main(args, prog=f"{PROG} {name}"))
    except SystemExit as done:  # argparse's --help and usage errors, or a command's own sys.exit
        return _exit_code(done.code)


def _exit_code(code) -> int:
    """An exit status as ``sys.exit`` reports it: None is success, a message is printed and fails."""
    if code is None or isinstance(code, int):
        return code or 0
    say(str(code))
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
