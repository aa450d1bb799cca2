"""Answer a respond-style JSONL of messages with trace-dspy@v6's stages and a fine-tuned writer.

    python docs/bench/finetune/tuned_replies.py ADAPTER.gguf INPUT.jsonl OUTPUT.jsonl [plain|bestof|asks|race]

The emotion, cause and plan come from trace-dspy@v6 on the embedded model as they do in ``respond``; the reply
stage runs on the same model with the LoRA adapter, in the briefed layout (``trace_dspy.compact.finetune``):
``plain`` writes one reply for the plan (no plan race, no Best-of-N); ``bestof`` writes it for the planner's
plan with v6's Best-of-N (the greedy reply, then up to three samples while the guarded reward is under v6's
threshold) and no plan race; ``asks``: ``bestof`` where each candidate keeps a second sentence only when it asks
(``reply_second = "question"``); ``race`` keeps v6's plan race and Best-of-N around the tuned writer. Rows are
written as ``respond --input`` writes them (id, dialogue, response).
"""

import dataclasses
import json
import sys
import time

import trace_dspy
from trace_dspy.compact.finetune import tuned_config
from trace_dspy.core.dialogue import normalize_dialogue
from trace_dspy.lm.specs import local_lm


VARIANTS = ("plain", "bestof", "asks", "race")


def variant_config(config, variant: str):
    """The tuned ``config`` as ``variant`` runs it (see the module docstring), and whether v6's plan race goes
    (its ``reply_plans`` and ``first_plan`` parts left out). ``make_tuned.py`` builds its artifacts with it."""
    if variant not in VARIANTS:
        raise SystemExit(f"variant must be {', '.join(VARIANTS[:-1])} or {VARIANTS[-1]}, not {variant!r}")
    if variant == "plain":
        config = dataclasses.replace(config, best_of=1)
    if variant == "asks":
        config = dataclasses.replace(config, reply_second="question")
    return config, variant != "race"


def tuned_program(adapter: str, variant: str):
    program = trace_dspy.load("trace-dspy@v6")
    program.config, no_race = variant_config(tuned_config(program.config), variant)
    if no_race:
        program = program.with_parts(reply_plans=(), first_plan=None)
    base = local_lm()
    stages = {stage: base for stage in ("recognize_emotion", "analyze_cause", "plan_strategy")}
    return program.set_stage_lms({**stages, "generate_response": local_lm(adapter=adapter)}).remember_openings()


def main(adapter: str, source: str, target: str, variant: str = "plain") -> None:
    program = tuned_program(adapter, variant)
    with open(source) as fh:  # file-audit: a measurement script's input
        rows = [json.loads(line) for line in fh if line.strip()]
    started = time.time()
    with open(target, "w") as out:  # file-audit: a measurement script's own output
        for number, row in enumerate(rows, 1):
            dialogue = normalize_dialogue(row.get("turns") or row.get("dialogue"))
            pred = program(dialogue=dialogue)
            out.write(json.dumps({"id": row.get("id", f"line-{number}"), "dialogue": dialogue,
                                  "response": pred.response, "emotion": pred.emotion,
                                  "strategy": pred.strategy, "secondary_strategy": pred.secondary_strategy}) + "\n")
    print(f"{len(rows)} dialogues, {(time.time() - started) / len(rows):.2f} s per dialogue")


if __name__ == "__main__":
    main(*sys.argv[1:])
