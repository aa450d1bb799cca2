"""Talk to the TRACE program in the terminal, one speaker turn at a time.

    python -m trace_dspy.chat                       # the default program (as respond)
    python -m trace_dspy.chat --program trace-dspy@v1 --show-stages

You type the speaker's turns; the program's reply becomes the listener's turn,
and the conversation grows with every exchange. Commands:

    /stages       show or hide every stage's output (emotion, cause, strategy...)
    /save FILE    write the conversation as JSONL in the dataset format
    /reset        start a new conversation
    /help         list the commands
    /quit         leave (so do Ctrl-D and Ctrl-C)

``/save`` writes one record per exchange, as EmpatheticDialogues stores a
conversation: ``turns`` is the dialogue up to that speaker turn, ``reply`` is
the program's answer and ``emotion`` the emotion it recognized (a prediction,
not a human label; correct it before training on the file). The file loads with
``trace_dspy.data.sources.read_jsonl`` and as ``--data``.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
from collections.abc import Callable
from typing import Any

from trace_dspy.cli import common
from trace_dspy.core.config import ConfigError
from trace_dspy.core.console import clear_status_line, out, status_line
from trace_dspy.core.dialogue import DialogueError
from trace_dspy.core.safety import redact, terminal_safe
from trace_dspy.workflows.conversation import ChatSession, TranscriptError

HELP = """commands:
  /stages       show or hide each stage's output
  /save FILE    save the conversation as dataset JSONL
  /reset        forget the conversation and start again
  /help         this list
  /quit         leave (Ctrl-D and Ctrl-C also leave)
anything else is your next turn as the speaker."""

PROMPT = "you> "
REPLY = "trace> "






def format_stage_lines(stages: dict[str, Any]) -> list[str]:
    from trace_dspy.workflows.batch import stage_text

    return [f"  {key:<20} {stage_text(key, value)}" for key, value in stages.items()]


class Repl:
    """Reads lines, runs commands, prints replies. ``read`` raises EOFError at the end."""

    def __init__(self, session: ChatSession, *, read: Callable[[str], str] = input,
                 write: Callable[[str], None] | None = None, interactive: bool = False):
        self.session = session
        self.read = read
        # Model output and echoed input may hold terminal escape sequences: they are shown, never obeyed (the
        # console escapes what it writes; another writer gets the escaped text).
        self.write = out if write is None else (lambda text: write(terminal_safe(text)))
        self.interactive = interactive

    def run(self) -> int:
        try:
            while True:
                try:
                    line = self.read(PROMPT if self.interactive else "")
                except EOFError:
                    break
                if not self.handle(line):
                    break
        except KeyboardInterrupt:  # Ctrl-C at the prompt or while the program thinks
            self.write("")
        self.write("bye")
        return 0

    def handle(self, line: str) -> bool:
        """Run one input line; False means leave."""
        text = line.strip()
        if not text:
            return True
        if text.startswith("/"):
            return self.command(text)
        self.turn(text)
        return True

    def command(self, text: str) -> bool:
        name, _, arg = text.partition(" ")
        arg = arg.strip()
        if name in ("/quit", "/exit", "/q"):
            return False
        if name == "/help":
            self.write(HELP)
        elif name == "/stages":
            self.session.show_stages = not self.session.show_stages
            self.write(f"(stages {'on' if self.session.show_stages else 'off'})")
        elif name == "/reset":
            self.session.reset()
            self.write("(new conversation)")
        elif name == "/save":
            self.save(arg)
        else:
            self.write(f"unknown command {name}; /help lists the commands")
        return True

    def save(self, arg: str) -> None:
        if not arg:
            self.write("usage: /save FILE")
        elif not self.session.exchanges:
            self.write("nothing to save yet: say something first")
        else:
            try:
                path = self.session.save(arg)
            except OSError as exc:
                self.write(f"error: cannot write {arg}: {exc.strerror or exc}")
            except TranscriptError as exc:  # not a transcript of ours, or another run is writing it
                self.write(f"error: {exc}")
            else:
                n = len(self.session.exchanges)
                self.write(f"(saved {n} exchange{'s' * (n != 1)} to {path})")

    def turn(self, text: str) -> None:
        if self.interactive:
            status_line("  (thinking...)", sys.stdout)
        dropped = self.session.dropped
        try:
            exchange = self.session.say(text)
        except DialogueError as exc:
            self._clear_thinking()
            self.write(f"error: {exc}")
            return
        except Exception as exc:  # noqa: BLE001  (a failed model call must not end the conversation)
            self._clear_thinking()
            self.write(f"error: the model call failed ({type(exc).__name__}: {_first_line(exc)}). "
                       "Your message was not added; send it again to retry.")
            return
        self._clear_thinking()
        if self.session.dropped and not dropped:  # said once, when the oldest exchanges first stop fitting
            self.write(_dropped_notice())
        if self.session.show_stages:
            for line in format_stage_lines(exchange.stages):
                self.write(line)
        self.write(REPLY + exchange.reply)

    def _clear_thinking(self) -> None:
        if self.interactive:
            clear_status_line(sys.stdout)


def _dropped_notice() -> str:
    """What the chat says when the conversation outgrows the dialogue limit: it goes on with the newest turns."""
    from trace_dspy.core.dialogue import MAX_DIALOGUE_CHARS

    return (f"(the conversation is past {MAX_DIALOGUE_CHARS:,} characters: from here on the program reads only "
            "its newest exchanges that fit, the oldest first left out; /save still keeps them all, /reset starts "
            "over)")


def _first_line(exc: BaseException) -> str:
    text = redact(str(exc)).strip()
    return (text.splitlines() or [""])[0][:300]


# ---------------------------------------------------------------- CLI


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    parser = common.command_parser("chat", __doc__, prog, epilog=HELP,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--program", default=None,
                        help="the program to talk to (default: as respond, the newest artifact not worse than "
                             "the uncompiled program on its dev set, else the uncompiled one); 'default' "
                             "(uncompiled), NAME@vN, an artifact folder, champion, models:/..., runs:/...")
    parser.add_argument("--show-stages", action="store_true", help="start with the stage display on")
    parser.add_argument("--data", help="pool for retrieved exemplars of the uncompiled program "
                                       "(default: $TRACE_DSPY_DATA, else the seed set)")
    parser.add_argument("-v", "--verbose", action="store_true")
    common.add_trace_arg(parser)
    common.add_model_args(parser)
    return parser


def _load(ref: str | None, settings, data):
    from trace_dspy.workflows.loading import load_for_run

    # None: as respond (default_reference)
    return load_for_run(ref, settings, data=data, announce_seed=False, remember_openings=True)


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    args = build_parser(prog).parse_args(argv)
    common.setup_logging(args.verbose)
    try:
        from trace_dspy.core import env
        from trace_dspy.workflows.preflight import check_environment

        check_environment(env.CACHE)  # before the model and the indexes load (a PreflightError is one line)
        settings = common.settings_from_args(args)
        loaded = _load(args.program, settings, settings.data_source(args.data))
        lm = loaded.lms.default
    except (ConfigError, RuntimeError, ImportError, ValueError) as exc:
        return common.fail(str(exc))
    except KeyboardInterrupt:
        out("\nbye")
        return 0

    interactive = sys.stdin.isatty() and sys.stdout.isatty()
    if interactive:
        # Ctrl-C must leave even when the shell that started us ignores SIGINT
        # (a background job without job control inherits SIG_IGN).
        signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            import readline  # noqa: F401  (line editing and history for input())
        except ImportError:
            pass
        program = loaded.label
        out(f"trace-dspy chat: program {program}, model {settings_model(loaded)}")
        out("Type the speaker's turn and press Enter; /help lists the commands, Ctrl-D leaves.")
    session = ChatSession(loaded.program, lm, show_stages=args.show_stages)
    with contextlib.ExitStack() as stack:
        code = common.enter_tracing(stack, args, settings)
        if code is not None:
            return code
        return Repl(session, interactive=interactive).run()


def settings_model(loaded) -> str:
    return loaded.lms.config.default.model


if __name__ == "__main__":
    sys.exit(main())
