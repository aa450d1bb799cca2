"""Measure the embedded model: speed, prefix reuse, parse failures, raw llama.cpp.

    python -m trace_dspy.bench_local --data ../shared/data/empathetic_dialogues --limit 100

1. Runs the program on ``--limit`` ED test dialogues (TRACE view, seeded) with
   the embedded model: seconds per dialogue, generated tokens/s, stage calls
   that failed to parse (first attempt and final).
2. Runs the first ``--reuse-limit`` of them again with prefix reuse switched
   off, for the with/without comparison.
3. Replays the exact prompts of step 1 through llama-cpp-python directly
   (``Llama.create_completion`` on the same rendered prompt, the same number of
   generated tokens, no grammar, no state restore): the raw llama.cpp baseline.

Prints a markdown table and writes JSON with ``--output``. The measurements are
:mod:`trace_dspy.bench.embedded`.
"""

from __future__ import annotations

import sys

from trace_dspy.cli.common import run_embedded_command


def main(argv: list[str] | None = None, prog: str = "python -m trace_dspy.bench_local") -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    return run_embedded_command(argv, prog, __doc__.split("\n\n")[0])


if __name__ == "__main__":
    sys.exit(main())
