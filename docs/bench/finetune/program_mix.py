"""What the ``program`` mix would teach: the program's own replies to pool conversations' opening messages, the
share the metric passes, and how templated the passed ones are; beside it, the same of the ``human`` mix's replies
to the same conversations.

    python docs/bench/finetune/program_mix.py ../shared/data/empathetic_dialogues 150 \
        docs/bench/finetune/program_mix.json [--program trace-dspy@v6]

The conversations are drawn as ``compile --optimizer finetune --finetune-mix program --finetune-limit N`` draws
them (the training side of the seeded split, each conversation's first exchange, seed 0), the replies are kept
by the same test (``program_traces``: the default metric passes them), and the kept replies go through the
blind reading's template checks ("How are you feeling about", the most that share one word 3-gram) and Dist-2.
The human side: the first listener replies of the same conversations that pass the default floors, as
``--finetune-mix human`` keeps them. The record holds every program reply, kept or not, so that they can be read
(no timings: a second run is served from DSPy's cache).
"""

import argparse
import json
import sys

import trace_dspy
from trace_dspy.bench.blind import template_checks
from trace_dspy.compact.finetune import FinetuneConfig, human_examples, tuned_config
from trace_dspy.compact.finetune_fit import first_turns, program_traces, training_side
from trace_dspy.core.config import ProgramConfig
from trace_dspy.data.listener_replies import listener_replies
from trace_dspy.data.sources import load_splits
from trace_dspy.optimize.empathy import shared_scorer
from trace_dspy.optimize.relevance import shared_relevance
from trace_dspy.optimize.scorers import distinct_n
from trace_dspy.program.pipeline import stage_signature
from trace_dspy.workflows.evaluation import build_metric
from trace_dspy.workflows.settings import Settings


def human_side(source, conversations: set[str]) -> dict:
    """The human mix's replies of ``conversations``: how many pass the default floors (``human_examples``, as the
    compile keeps them), and their templates."""
    items = [r for r in listener_replies(source).items if r.conv_id in conversations]
    signature = stage_signature("generate_response", tuned_config(ProgramConfig()))
    human = human_examples(items, shared_scorer(), signature, relevance=shared_relevance(),
                           floors=FinetuneConfig().floors)
    kept = [example["messages"][-1]["content"] for example in human.examples]  # the reply each one learns
    return {"conversations": len(items), "passed": len(kept), "passed_templates": template_checks(kept),
            "passed_dist2": round(distinct_n(kept, 2), 1)}


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("data")
    parser.add_argument("limit", type=int)
    parser.add_argument("record")
    parser.add_argument("--program", default="trace-dspy@v6")
    args = parser.parse_args(argv)
    splits = load_splits(args.data, seed=0)
    source = training_side(splits.source, splits.train)
    turns = first_turns(source.pool, args.limit, 0)
    program = trace_dspy.load(args.program)
    metric = build_metric(Settings())
    replies: list[dict] = []

    class _Recording:  # the program, with every reply it writes kept for the record
        def __call__(self, dialogue):
            pred = program(dialogue=dialogue)
            replies.append({"dialogue": dialogue, "response": pred.response, "emotion": pred.emotion,
                            "strategy": pred.strategy})
            return pred

    kept = program_traces(_Recording(), turns, metric, print)
    passed = {reply for _, reply in kept}
    for row in replies:
        row["passed"] = row["response"] in passed
    texts = [reply for _, reply in kept]
    out = {"command": "python docs/bench/finetune/program_mix.py " + " ".join(argv), "program": args.program,
           "dialogues": len(turns), "written": len(replies), "passed": len(kept),
           "passed_templates": template_checks(texts), "passed_dist2": round(distinct_n(texts, 2), 1),
           "all_templates": template_checks([r["response"] for r in replies]),
           "human": human_side(source, {str(e.conversation_id) for e in turns}), "replies": replies}
    with open(args.record, "w") as fh:  # file-audit: a measurement script's own output
        json.dump(out, fh, indent=1)
    print(json.dumps({k: v for k, v in out.items() if k != "replies"}, indent=1))


if __name__ == "__main__":
    main(sys.argv[1:])
