"""Progress off a terminal: a plain line on stderr at least every interval while a phase runs, a heartbeat
for phases that count nothing, stopped when the phase ends or raises; never on stdout."""

from __future__ import annotations

import io
import re
import sys
import threading
import time

import dspy
import pytest

from trace_dspy.core import console
from trace_dspy.core.console import Progress, counting_dspy_calls, heartbeat, progress
from trace_dspy.testing.fakes import fake_lm
from conftest import FAST_CONFIG, echo_reply, offline_workdir

INTERVAL = 0.1
# Any line a phase writes: "plans: 7/24 dialogues, 41 s", "emotion prior: fitting, 3 s", "... done after 9 s".
PHASE_LINE = re.compile(r"^[\w /.-]+: .*\b\d+ s$")


class Stamped(io.TextIOBase):
    """A non-terminal stream that keeps each line with the time it was written."""

    def __init__(self):
        self.lines: list[tuple[float, str]] = []
        self._lock = threading.Lock()

    def write(self, text: str) -> int:
        with self._lock:
            for line in text.splitlines():
                if line.strip():
                    self.lines.append((time.monotonic(), line))
        return len(text)

    def isatty(self) -> bool:
        return False

    def texts(self) -> list[str]:
        return [line for _, line in self.lines]


@pytest.fixture
def short_interval(monkeypatch):
    monkeypatch.setattr(console, "INTERVAL", INTERVAL)
    yield INTERVAL
    assert console._ACTIVE == []  # every phase a test opened was closed


def slow(responder, seconds: float):
    def answer(outputs, inputs):
        time.sleep(seconds)
        return responder(outputs, inputs)
    return answer


def test_a_slow_fit_prints_its_count_at_every_interval(short_interval, monkeypatch):
    """The plan fit, the phase that was silent for 441 s, on a scripted LM slowed to 20 ms a call."""
    from trace_dspy.compact.plan_fit import fit_plans

    from trace_dspy import TraceProgram
    from trace_dspy.core.config import ProgramConfig

    stream = Stamped()
    monkeypatch.setattr(sys, "stderr", stream)
    lm, _ = fake_lm(slow(echo_reply, 0.02))
    train = [dspy.Example(dialogue=f"Speaker: I lost my ring at the beach, day {i}.", emotion="sad",
                          response="Oh no, did you find it?").with_inputs("dialogue") for i in range(5)]
    program = TraceProgram(ProgramConfig(prior_k=0, best_of=1))
    metric = lambda example, pred, trace=None: len(pred.response) % 7 / 7  # noqa: E731 - no scorer to load
    started = time.monotonic()
    with dspy.context(lm=lm):
        fit_plans(program, train, metric)
    ended = time.monotonic()
    lines = [(t, text) for t, text in stream.lines if text.startswith("plans: ")]
    assert all(re.fullmatch(r"plans: \d/5 dialogues, \d+ s", text) for _, text in lines[:-1]), lines
    assert re.fullmatch(r"plans: 5/5 dialogues, done after \d+ s", lines[-1][1])
    # At the promised interval: never a pause much longer than it, from the start to the end of the phase.
    stamps = [started, *(t for t, _ in lines), ended]
    assert len(lines) >= (ended - started) / INTERVAL / 3
    assert max(b - a for a, b in zip(stamps, stamps[1:])) < 4 * INTERVAL


def test_the_heartbeat_stops_when_the_phase_raises(short_interval):
    stream = Stamped()
    with pytest.raises(RuntimeError, match="L-BFGS diverged"):
        with heartbeat("emotion prior", stream=stream) as phase:
            phase.note("fitting")
            time.sleep(4 * INTERVAL)
            raise RuntimeError("L-BFGS diverged")
    assert not phase._thread.is_alive()
    texts = stream.texts()
    assert texts[:-1] and all(re.fullmatch(r"emotion prior: fitting, \d+ s", t) for t in texts[:-1])
    assert re.fullmatch(r"emotion prior: fitting, stopped \(RuntimeError\) after \d+ s", texts[-1])
    time.sleep(3 * INTERVAL)
    assert stream.texts() == texts  # nothing after the raise


def test_the_prior_heartbeat_stops_when_the_fit_raises(short_interval, monkeypatch):
    """The real phase: choose_prior's fit, made slow and then failing."""
    import trace_dspy.program.emotion_prior as ep
    from trace_dspy.data.sources import resolve_source
    from trace_dspy.workflows import prior

    def diverging(*args, **kwargs):
        time.sleep(4 * INTERVAL)
        raise MemoryError("no room for the word pairs")

    stream = Stamped()
    monkeypatch.setattr(sys, "stderr", stream)
    monkeypatch.setattr(ep, "cached_prior", diverging)
    monkeypatch.setattr(ep, "MIN_TRAIN", 1)
    source = resolve_source(None, announce_seed=False)
    with pytest.raises(MemoryError):
        prior.choose_prior(source)
    texts = stream.texts()
    assert texts and texts[-1].startswith("emotion prior: ") and "stopped (MemoryError)" in texts[-1]
    time.sleep(3 * INTERVAL)
    assert stream.texts() == texts and not [t for t in threading.enumerate() if t.name.startswith("progress:")]


def test_only_the_innermost_phase_speaks_and_a_quick_one_says_nothing(short_interval):
    stream = Stamped()
    with heartbeat("prepare", stream=stream) as outer:
        outer.note("the emotion prior")
        with progress(desc="dev before", total=3, unit="dialogues", stream=stream) as inner:
            for _ in inner.track(range(3)):
                time.sleep(2 * INTERVAL)
        with progress(desc="quick", total=1, stream=stream) as quick:
            quick.update(1)
    texts = stream.texts()
    assert not [t for t in texts if t.startswith("quick")]
    inner_lines = [i for i, t in enumerate(texts) if t.startswith("dev before: ")]
    assert inner_lines and not [t for t in texts[inner_lines[0]:inner_lines[-1]] if t.startswith("prepare")]
    assert re.fullmatch(r"dev before: 3/3 dialogues, done after \d+ s", texts[inner_lines[-1]])


def test_a_terminal_gets_a_bar_and_no_plain_lines(short_interval):
    stream = io.StringIO()
    with progress(desc="respond", total=3, unit="dialogues", stream=stream, terminal=True) as bar:
        for _ in range(3):
            bar.update(1)
            time.sleep(INTERVAL)
    with heartbeat("emotion prior", stream=stream, terminal=True):
        time.sleep(3 * INTERVAL)
    text = stream.getvalue()
    assert re.search(r"respond: 100%\|.*\| 3/3", text) and "emotion prior: 00:00" in text
    assert not re.search(r"\d+ s\n", text)


def test_dspy_loops_report_lm_calls_and_evaluations(short_interval):
    lm, _ = fake_lm(echo_reply)
    program = dspy.Predict("dialogue -> response")
    devset = [dspy.Example(dialogue=f"I lost it {i}", response="oh no").with_inputs("dialogue") for i in range(3)]
    with dspy.context(lm=lm), Progress("optimizer", total=1, unit="candidates scored", stream=Stamped()) as phase, \
            counting_dspy_calls(phase):
        dspy.Evaluate(devset=devset, metric=lambda g, p, t=None: 1.0, num_threads=1)(program)
    assert phase.n == 1 and phase.detail == "3 LM calls"


def test_compile_progress_goes_to_stderr_and_stdout_keeps_only_the_result(short_interval, tmp_path, monkeypatch,
                                                                         capsys):
    from trace_dspy.cli.compile import main

    lm, _ = fake_lm(slow(echo_reply, 0.02))  # each phase outlasts the interval twice over
    offline_workdir(tmp_path, monkeypatch, lm)
    # the compact writer (in the field layout the fake LM answers), whose plans the compile fits in a phase
    (tmp_path / "fast.toml").write_text(FAST_CONFIG + 'writer = "compact"\nreply_format = "fields"\n')
    assert main(["--train", "4", "--dev", "3", "--val", "3", "--plan-items", "4", "--threads", "1",
                 "--no-mlflow", "--config", "fast.toml"]) == 0
    out, err = capsys.readouterr()
    assert not [line for line in out.splitlines() if PHASE_LINE.match(line)], out
    assert "| empathy |" in out and "artifact: " in out
    for phase in ("dev before", "plans", "optimizer select", "dev after"):
        assert re.search(rf"^{phase}: .*done after \d+ s$", err, re.MULTILINE), (phase, err)
    # DSPy's own loop: the candidates BootstrapFewShotWithRandomSearch scores, and its LM calls.
    assert re.search(r"^optimizer select: [0-3]/3 candidates scored, \d+ LM calls, \d+ s$", err, re.MULTILINE)
