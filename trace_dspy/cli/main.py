"""The ``trace-dspy`` console script: one entry point whose subcommands are the ``python -m`` commands.

    trace-dspy respond "I failed my driving test again."
    trace-dspy compile --optimizer labeled
    trace-dspy inspect trace-dspy@v1

``trace-dspy NAME ARGS`` runs the launcher module ``python -m trace_dspy.NAME ARGS`` would run, as its
``__main__``, with the same arguments: every flag, exit code and output is the command's own. The launchers
are run by name rather than imported, so this module imports no command (commands stay independent).
"""

from __future__ import annotations

import runpy
import sys

from trace_dspy.core.console import out, say

PROG = "trace-dspy"

# name -> (the launcher module ``python -m`` runs, what the command does)
COMMANDS: dict[str, tuple[str, str]] = {
    "respond": ("trace_dspy.respond", "answer a message, or a JSONL file of dialogues"),
    "chat": ("trace_dspy.chat", "talk to the program in the terminal, one turn at a time"),
    "compile": ("trace_dspy.compile", "compile the program against the empathy metric; version, track, register"),
    "evaluate": ("trace_dspy.evaluate", "evaluate a program on EmpatheticDialogues and log the run to MLflow"),
    "inspect": ("trace_dspy.inspect", "show what a compiled artifact holds, or what changed between two"),
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
    saved = sys.argv
    sys.argv = [f"{PROG} {name}", *args]
    try:
        runpy.run_module(COMMANDS[name][0], run_name="__main__", alter_sys=True)
    except SystemExit as done:
        return _exit_code(done.code)
    finally:
        sys.argv = saved
    return 0


def _exit_code(code) -> int:
    """``SystemExit.code`` as ``sys.exit`` reports it: None is success, a message is printed and fails."""
    if code is None or isinstance(code, int):
        return code or 0
    say(str(code))
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
