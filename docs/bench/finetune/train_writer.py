"""Train the fine-tuned writer's adapter on the data pool's first listener replies and record the run.

    TRACE_DSPY_CACHE=... python docs/bench/finetune/train_writer.py ../shared/data/empathetic_dialogues 1400 \
        docs/bench/finetune/training.json --floors 0,0
    TRACE_DSPY_CACHE=... python docs/bench/finetune/train_writer.py ../shared/data/empathetic_dialogues all \
        docs/bench/finetune2/training.json --epochs 2

    TRACE_DSPY_CACHE=... python docs/bench/finetune/train_writer.py ../shared/data/empathetic_dialogues all \
        docs/bench/finetune3/training.json --epochs 2 --asks

LIMIT is a number of pool conversations or ``all``; ``--floors RELEVANCE,EMPATHY`` sets the human replies
learned from (``ReplyFloors``; the default is FinetuneConfig's, ``0,0`` keeps every reply); ``--epochs N``;
``--asks`` (an experiment of this script, not a compile setting) keeps only replies of five words or more that
end in a question, a reaction then a question, the shape the plan in the briefed layout asks for.

The examples are those ``compile --optimizer finetune`` builds (``trace_dspy.compact.finetune``); the provider
keeps the adapter and its checkpoint under ``$TRACE_DSPY_CACHE/finetune``, so a second run with the same data and
settings reuses them. The record holds the data counts, the settings, the loss of every step, tokens, seconds and
the adapter's sha256.
"""

import argparse
import hashlib
import json
import sys
import time
from dataclasses import asdict

from trace_dspy.compact.finetune import FinetuneConfig, ReplyFloors, human_examples, train_writer, tuned_config
from trace_dspy.core.config import ProgramConfig
from trace_dspy.data.listener_replies import listener_replies
from trace_dspy.optimize.empathy import shared_scorer
from trace_dspy.optimize.relevance import shared_relevance
from trace_dspy.program.pipeline import stage_signature


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("data")
    parser.add_argument("limit")
    parser.add_argument("record")
    parser.add_argument("--floors", default=None)
    parser.add_argument("--epochs", type=int, default=None)
    parser.add_argument("--asks", action="store_true")
    args = parser.parse_args(argv)
    base = FinetuneConfig()
    floors = ReplyFloors(*map(float, args.floors.split(","))) if args.floors else base.floors
    lora = {**base.lora, **({"epochs": args.epochs} if args.epochs else {})}
    cfg = FinetuneConfig(limit=None if args.limit == "all" else int(args.limit), floors=floors, lora=lora)
    replies = listener_replies(args.data, limit=cfg.limit, seed=cfg.seed)
    signature = stage_signature("generate_response", tuned_config(ProgramConfig()))
    relevance = shared_relevance() if floors.relevance > 0 else None
    items = replies.items
    if args.asks:
        items = [r for r in items if r.reply.rstrip().endswith("?") and len(r.reply.split()) >= 5]
    human = human_examples(items, shared_scorer(), signature, relevance=relevance, floors=floors)
    examples = human.examples
    started = time.time()

    def show(p):
        if p.step % 5 == 0 or p.step == p.total:
            print(f"step {p.step}/{p.total} loss {p.loss:.3f} {p.tokens_per_second:.0f} tokens/s", flush=True)

    writer = train_writer(cfg, {"human": examples}, progress=show)
    result = writer.result
    with open(writer.adapter, "rb") as fh:  # file-audit: a measurement script's own output
        digest = hashlib.sha256(fh.read()).hexdigest()
    out = {"command": "python docs/bench/finetune/train_writer.py " + " ".join(argv),
           "data": {"pool_conversations": replies.counts.conversations, "kept": replies.counts.kept,
                    "sampled": replies.counts.sampled, "short_reply": replies.counts.short_reply,
                    "floors": asdict(floors), "below_floors": human.below_floors,
                    **({"asks_only": True, "not_asking": len(replies.items) - len(items)} if args.asks else {}),
                    "examples": writer.counts},
           "settings": {**cfg.train_kwargs(), "target_modules": list(cfg.lora["target_modules"])},
           "steps": result.steps, "tokens": result.tokens, "training_seconds": round(result.seconds, 1),
           "tokens_per_second": round(result.tokens_per_second, 1), "resumed_from": result.resumed_from,
           "truncated": result.truncated, "losses": [round(x, 4) for x in result.losses],
           "wall_seconds_this_run": round(time.time() - started, 1),
           "adapter": {"file": writer.adapter.name, "bytes": writer.adapter.stat().st_size, "sha256": digest}}
    with open(args.record, "w") as fh:  # file-audit: a measurement script's own output
        json.dump(out, fh, indent=1)
    print(json.dumps({k: v for k, v in out.items() if k != "losses"}, indent=1))


if __name__ == "__main__":
    main(sys.argv[1:])
