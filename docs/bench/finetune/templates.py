"""Template checks of reply files: how many ask "How are you feeling about", and the most that share a 3-gram.

    python docs/bench/finetune/templates.py docs/bench/finetune/templates.json docs/bench/finetune/replies-*.jsonl
"""

import json
import sys
from pathlib import Path

from trace_dspy.bench.blind import read_replies, template_checks


def main(record: str, *files: str) -> None:
    out = {"command": "python docs/bench/finetune/templates.py " + " ".join([record, *files])}
    for name in files:
        replies = read_replies(Path(name))
        out[Path(name).stem] = template_checks([response for _, response in replies.rows.values()])
    with open(record, "w") as fh:  # file-audit: a measurement script's own output
        json.dump(out, fh, indent=1)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main(*sys.argv[1:])
