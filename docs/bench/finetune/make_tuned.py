"""Write trace-dspy@v6 with a fine-tuned writer as an artifact of its own, for ``evaluate`` and ``respond``.

    python docs/bench/finetune/make_tuned.py ADAPTER.gguf TRAINING.json ROOT [plain|bestof|asks|race]

The new version (``trace-dspy-tuned@vN`` under ROOT) keeps v6's instructions, demos, exemplar index and emotion
prior; its config is the fine-tuned writer's (``trace_dspy.compact.finetune.TUNED_PROGRAM``), its reply stage
runs on the embedded model with the adapter (the ``writer_adapter`` part, whose record takes the training
record's counts and settings). ``plain``: one reply for the planner's plan (v6's plan race and Best-of-N off);
``bestof``: v6's Best-of-N for the planner's plan, no plan race; ``asks``: ``bestof`` keeping a second sentence
only where it asks (``reply_second = "question"``); ``race``: v6's plans and Best-of-N kept around
the tuned writer.
"""

import json
import sys

import trace_dspy
from trace_dspy.compact.finetune import tuned_config
from trace_dspy.program.adapter_part import WriterAdapter
from trace_dspy.store import artifacts
from trace_dspy.store.artifacts import read_manifest
from tuned_replies import variant_config  # the variants' one home, beside this script


def main(adapter: str, training: str, root: str, variant: str = "plain") -> None:
    program = trace_dspy.load("trace-dspy@v6", attach_lms=False)
    config, no_race = variant_config(tuned_config(program.config), variant)
    plans = {"reply_plans": (), "first_plan": None} if no_race else {}
    program.config = config
    with open(training) as fh:  # file-audit: a measurement script's input
        record = json.load(fh)
    part = WriterAdapter.of(adapter)
    program = program.with_parts(writer_adapter=part, **plans)
    v6 = read_manifest(artifacts.version_dir(None, "trace-dspy", 6))
    adapter_record = {"base_model": "SmolLM2-135M-Instruct.Q4_1.gguf", "examples": record["data"]["examples"],
                      **({"floors": record["data"]["floors"]} if "floors" in record["data"] else {}),
                      "seed": record["settings"]["seed"], "lora": record["settings"], "steps": record["steps"],
                      "tokens": record["tokens"], "seconds": record["training_seconds"],
                      "final_loss": record["losses"][-1]}
    manifest = {"config": {**v6.config, "program": config.to_dict()}, "optimizer": {"name": "finetune"},
                "metric": v6.metric, "scores": {}, "data": v6.data, "mlflow": {},
                "command": "python docs/bench/finetune/make_tuned.py " + " ".join(sys.argv[1:])}
    records = {"writer_adapter": adapter_record, **({"reply_plans": None, "first_plan": None} if plans else {})}
    folder, _ = artifacts.write_artifact(program, manifest, name="trace-dspy-tuned", root=root,
                                         parts=program.parts.with_records(**records))
    print(folder)


if __name__ == "__main__":
    main(*sys.argv[1:])
