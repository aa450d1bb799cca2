"""How far Dist-2 can rise while the replies keep the scaffold: Dist-2 of the 200 replies as they are, with the
stock question's words ("How are you feeling about", and "your"/"the" after it) taken out, and of their first
sentences alone. Usage (from the repository root):

    python docs/bench/tone/dist2_ceiling.py docs/bench/tone/rows/v6-questions.jsonl docs/bench/tone/dist2-ceiling.json
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from trace_dspy.core.text import split_sentences
from trace_dspy.optimize.scorers import distinct_n

STOCK_QUESTION = re.compile(r"How are you feeling about (?:your |the )?")


def main(rows_file: str, out: str) -> None:
    rows = [json.loads(line) for line in Path(rows_file).read_text(encoding="utf-8").splitlines() if line.strip()]
    replies = [row["prediction"]["response"] for row in rows]
    record = {
        "command": f"python docs/bench/tone/dist2_ceiling.py {rows_file} {out}",
        "replies": len(replies),
        "dist2": round(distinct_n(replies, 2), 2),
        "dist2_without_stock_question": round(distinct_n([STOCK_QUESTION.sub("", r) for r in replies], 2), 2),
        "dist2_first_sentences": round(distinct_n([(split_sentences(r) or [r])[0] for r in replies], 2), 2),
        "stock_questions": sum(bool(STOCK_QUESTION.search(r)) for r in replies),
    }
    Path(out).write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    print(json.dumps(record, indent=1))


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
