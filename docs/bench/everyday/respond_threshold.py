"""``respond`` with the loaded program's Best-of-N threshold replaced: how the replies read when the reply stage
keeps sampling until a candidate's reward reaches THRESHOLD (the shipped programs stop at 0.6). Usage (from the
repository root; the other arguments are respond's):

    python docs/bench/everyday/respond_threshold.py 0.7 --input docs/bench/everyday/messages-3.jsonl \
        --output replies.jsonl
"""

from __future__ import annotations

import dataclasses
import sys


def main(argv: list[str]) -> int:
    if not argv:
        sys.exit(__doc__)
    threshold = float(argv[0])
    import trace_dspy.workflows.loading as loading
    from trace_dspy.respond import main as respond

    build = loading.build_program

    def with_threshold(config, state, **kwargs):
        return build(dataclasses.replace(config, best_of_threshold=threshold), state, **kwargs)

    loading.build_program = with_threshold
    return respond(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
