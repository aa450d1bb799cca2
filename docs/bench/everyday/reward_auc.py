"""How well the shipped reply reward tells the replies a person found sendable from the others.

Every distinct (message, reply) pair in the reading record (reading.json) is scored by the default program's
reply reward, with the plan and emotion its run recorded (no history, so no variety penalty); the record
gives the AUC of sendable against not sendable, and how many of each clear the Best-of-N threshold. Usage
(from the repository root):

    python docs/bench/everyday/reward_auc.py docs/bench/everyday/reward-auc.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).parent


def main(out: str) -> None:
    import dspy
    from trace_dspy import load
    from trace_dspy.optimize.scorers import auc

    reading = json.loads((HERE / "reading.json").read_text(encoding="utf-8"))
    pairs: dict[tuple[str, str], tuple[bool, dict]] = {}
    for name, summary in reading["files"].items():
        rows = [json.loads(line) for line in (HERE / name).read_text(encoding="utf-8").splitlines() if line.strip()]
        for item, row in zip(summary["items"], rows):
            pairs.setdefault((item["message"], item["reply"]), (item["sendable"], row.get("stages") or {}))
    program = load()
    scored = []
    for (message, reply), (sendable, stages) in pairs.items():
        inputs = {"dialogue": f"Speaker: {message}", "emotion": stages.get("emotion", ""),
                  "strategy": stages.get("strategy", "EX"),
                  "secondary_strategy": stages.get("secondary_strategy", "EX"), "exemplars": []}
        scored.append((sendable, float(program.reply_reward(inputs, dspy.Prediction(response=reply)))))
    good = [r for ok, r in scored if ok]
    bad = [r for ok, r in scored if not ok]
    threshold = program.config.best_of_threshold
    record = {"command": f"python docs/bench/everyday/reward_auc.py {out}", "pairs": len(scored),
              "sendable": len(good), "not_sendable": len(bad), "auc": auc(good, bad), "threshold": threshold,
              "sendable_at_threshold": sum(r >= threshold for r in good),
              "not_sendable_at_threshold": sum(r >= threshold for r in bad)}
    Path(out).write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    print(json.dumps(record))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
