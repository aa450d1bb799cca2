"""How often the reply reward's dialogue guards fire: on the human listener replies of an EmpatheticDialogues
split (each reply against the turns before it) and on the program's replies in quality runs' rows. Usage
(from the repository root; the last argument is the record written):

    python docs/bench/tone/guard_rates.py ../shared/data/empathetic_dialogues/test.csv \
        docs/bench/tone/rows/v6-questions.jsonl docs/bench/tone/rows/v6-whole-questions.jsonl \
        docs/bench/tone/guard-rates.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(split: str, rows_paths: list[str], out: str) -> None:
    from trace_dspy.core.dialogue import parse_dialogue
    from trace_dspy.data.ed_csv import read_ed_csv
    from trace_dspy.compact.guards import brings_in_relative, takes_theirs

    def fired(reply: str, turns: list[str], speaker: list[str]) -> dict[str, str | None]:
        return {"brings_in_relative": brings_in_relative(reply, turns), "takes_theirs": takes_theirs(reply, speaker)}

    human = []
    for sample in read_ed_csv(split):
        turns = list(sample.turns)
        human.append(fired(sample.response, turns, turns[::-1][::2]))  # the other person's turns, last first
    program: dict[str, list[dict]] = {}
    for rows_path in rows_paths:
        found = program[rows_path] = []
        for line in Path(rows_path).read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            turns = parse_dialogue(row["dialogue"])
            found.append(fired(row["prediction"]["response"], [t.text for t in turns],
                               [t.text for t in turns if t.role != "listener"]))

    def summary(found: list[dict]) -> dict:
        return {"replies": len(found),
                **{guard: {"fires": sum(f[guard] is not None for f in found),
                           "examples": sorted({f[guard] for f in found if f[guard]})[:10]}
                   for guard in ("brings_in_relative", "takes_theirs")}}

    record = {"command": f"python docs/bench/tone/guard_rates.py {split} {' '.join(rows_paths)} {out}",
              "human_listener_replies": summary(human),
              "program_replies": {path: summary(found) for path, found in program.items()}}
    Path(out).write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    print(json.dumps({k: v for k, v in record.items() if k != "command"}))


if __name__ == "__main__":
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2:-1], sys.argv[-1])
