"""A program called from Python keeps DSPy's "LM response was truncated" warnings to itself, as respond does."""

from __future__ import annotations

import logging

import dspy
import pytest
from conftest import Collect

import trace_dspy
from trace_dspy import TraceProgram
from trace_dspy.program.lm_warnings import show_truncation_warnings
from trace_dspy.testing.fakes import fake_lm

TRUNCATED = "LM response was truncated due to exceeding max_tokens=120."


@pytest.fixture
def seen():
    logger = logging.getLogger("dspy.clients.lm")
    handler, level, filters = Collect(), logger.level, list(logger.filters)
    # A command run earlier in the process (setup_logging) filters the warning for the whole process; what is
    # tested here is the filter of program calls alone.
    logger.filters = []
    logger.addHandler(handler)
    logger.setLevel(logging.WARNING)
    show_truncation_warnings(False)
    try:
        yield handler.messages
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        logger.filters = filters
        show_truncation_warnings(False)


def capped_reply(outputs, inputs):
    """Answers like DSPy's LM on a reply cut at max_tokens: the warning comes from inside the LM call."""
    logging.getLogger("dspy.clients.lm").warning(TRUNCATED)
    if "response" in outputs:
        logging.getLogger("dspy.clients.lm").warning("LM call failed: connection refused")
        return {"response": "That sounds hard; how are you holding up?"}
    return {}


def test_program_calls_drop_truncation_warnings_and_nothing_else(seen):
    lm, _ = fake_lm(capped_reply)
    program = TraceProgram()
    with dspy.context(lm=lm):
        pred = program(dialogue="Speaker: I failed my driving test again.")
        assert pred.response == "That sounds hard; how are you holding up?"
        assert seen == ["LM call failed: connection refused"]
        seen.clear()
        program.recognize("Speaker: I failed my driving test again.")
        assert seen == []
        # outside a program call the warning is DSPy's as usual
        lm("hello")
        assert TRUNCATED in seen
        seen.clear()
        show_truncation_warnings(True)  # respond -v
        program(dialogue="Speaker: I failed my driving test again.")
        assert TRUNCATED in seen


def test_a_loaded_program_is_quiet_too(seen):
    lm, _ = fake_lm(capped_reply)
    program = trace_dspy.load(attach_lms=False)
    with dspy.context(lm=lm):
        program(dialogue="Speaker: I failed my driving test again.")
    assert TRUNCATED not in seen and "LM call failed: connection refused" in seen
