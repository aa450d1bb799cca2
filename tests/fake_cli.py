"""Run a ``python -m trace_dspy.<command>`` with every model replaced by a scripted fake.

    python tests/fake_cli.py trace_dspy.cli.chat --program default

Used by the tests that drive commands as a person would (through a pty or a
pipe), where monkeypatching in the test process cannot reach. The fake echoes
the speaker's last turn as the reply; a turn containing "boom" makes the model
call fail, and one containing "slow" makes it hang for two minutes, so that a
test can interrupt it.
"""

from __future__ import annotations

import os
import runpy
import sys
import time
from pathlib import Path

from trace_dspy.lm import specs as lms
from trace_dspy.testing.fakes import fake_lm


def responder(outputs, inputs):
    dialogue = inputs.get("dialogue", "")
    last = dialogue.splitlines()[-1] if dialogue else ""
    if "boom" in last:
        raise RuntimeError("backend exploded")
    if "response" in outputs:
        if "slow" in last:
            marker = os.environ.get("TRACE_FAKE_SLOW_MARKER")
            if marker:  # tells a test that the model call is under way
                Path(marker).write_text("sleeping")
            time.sleep(120)
        return {"response": "heard: " + last.split(": ", 1)[-1]}
    return {}


if __name__ == "__main__":
    checkout = os.environ.get("TRACE_TESTS_CHECKOUT_ARTIFACTS")
    if checkout:  # the suite's copy of the checkout's artifacts/, as the repository ships it (conftest.py)
        from trace_dspy.store import artifacts

        artifacts.CHECKOUT_ROOT = Path(checkout)
    lm, _ = fake_lm(responder)
    lms.build_lm = lambda spec: lm
    module = sys.argv[1]
    sys.argv = [module, *sys.argv[2:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
