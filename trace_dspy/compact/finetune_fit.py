"""``compile --optimizer finetune``: train the compact writer's reply stage into a LoRA adapter, and the program
that runs it.

The compile workflow reaches this module through ``trace_dspy.program.writers.finetune_writer``. Here:

1. the base model is the reply stage's LM, which must be the embedded model (its ``finetuning_model``:
   ``local`` or ``local:/path/model.gguf``);
2. the training examples of the mix (``trace_dspy.compact.finetune``): ``human``, the first listener reply of
   each pool conversation on the training side of the compile's split (never dev), planned by the EPITOME
   scorer; ``program``, the replies the uncompiled program writes for those conversations' first turns (the
   speaker's opening message alone, as the human mix sees it) that the metric passes, with the emotion and
   plan its earlier stages gave; at most ``finetune_limit`` conversations each, drawn with the seed;
3. the adapter is trained by the embedded model's provider, whose checkpoints (under
   ``$TRACE_DSPY_CACHE/finetune``) let a compile that was stopped resume, and a finished one be reused;
4. the result is the program as a fine-tuned writer runs it (``tuned_config``) with the ``writer_adapter``
   part, and the record of the training for the manifest.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import dspy

from trace_dspy.compact.finetune import (FinetuneConfig, HumanExamples, ReplyFloors, human_examples,
                                        program_examples, train_writer, tuned_config)
from trace_dspy.core.config import ConfigError
from trace_dspy.core.console import progress as progress_bar
from trace_dspy.lm.local_settings import is_local_model, parse_local_model

Log = Callable[[str], None]


@dataclass(frozen=True)
class FinetuneFit:
    """A trained writer: the program that runs it, the manifest record of its training, and its loss curve."""

    program: Any
    record: dict[str, Any]
    losses: list[float]


def finetune_config(opt) -> FinetuneConfig:
    """The FinetuneConfig of an ``OptimizerConfig``: its mix, limit, floors and seed, and the LoRA rank, epochs and
    learning rate where set (a rank set alone keeps the default alpha/rank scale)."""
    lora = dict(FinetuneConfig().lora)
    if opt.finetune_rank is not None:
        lora["alpha"] = lora["alpha"] / lora["rank"] * opt.finetune_rank
        lora["rank"] = opt.finetune_rank
    if opt.finetune_epochs is not None:
        lora["epochs"] = opt.finetune_epochs
    if opt.finetune_learning_rate is not None:
        lora["learning_rate"] = float(opt.finetune_learning_rate)
    floors = ReplyFloors(*opt.finetune_floors) if opt.finetune_floors is not None else ReplyFloors()
    return FinetuneConfig(mix=opt.finetune_mix, limit=opt.finetune_limit, seed=opt.seed, floors=floors, lora=lora)


def base_model(program) -> str:
    """The model string of the embedded model the reply stage runs on (``local`` or ``local:PATH``)."""
    lm = program.lm_for("generate_response")
    model = getattr(lm, "finetuning_model", None)
    if not is_local_model(model):
        raise ConfigError(f"compile --optimizer finetune trains a LoRA adapter for the embedded model; the reply "
                          f"stage runs on {getattr(lm, 'model', None)!r:.80} (use --lm local or local:PATH)")
    return model


def _scorer():
    from trace_dspy.core.extras import install_hint
    from trace_dspy.optimize.empathy import shared_scorer

    scorer = shared_scorer()
    if scorer is None:
        raise ConfigError("the human mix plans each reply with the EPITOME scorer, which needs the 'embed' "
                          f"extra: {install_hint('embed')}")
    return scorer


def _relevance(floors):
    """The metric's relevance head, which the floors read each human reply with (None: no relevance floor)."""
    if floors.relevance <= 0:
        return None
    from trace_dspy.optimize.relevance import shared_relevance

    return shared_relevance()  # the 'embed' extra is there: _scorer() was asked first


def first_turns(samples: Sequence[Any], limit: int | None, seed: int) -> list[dspy.Example]:
    """Each conversation's first exchange as an example: its speaker's first turn, with the listener's first
    reply as the gold, from the pool ``samples`` (``Sample``; a conversation may be held whole or as every
    prefix); ``limit`` of them drawn with ``seed``. The exchanges the human mix learns from, found and cleaned
    as it finds them (``opening_exchanges``), so that both sources teach the same input."""
    from trace_dspy.data.listener_replies import opening_exchanges
    from trace_dspy.data.samples import Sample

    chosen = sorted(opening_exchanges(samples), key=lambda o: o.conv_id)  # the draw's order: ids as text
    if limit is not None and limit < len(chosen):
        chosen = [chosen[i] for i in sorted(random.Random(seed).sample(range(len(chosen)), limit))]
    return [Sample(o.conv_id, o.conv_id, (o.speaker,), o.emotion, o.reply, o.raw_situation).to_example()
            for o in chosen]


def program_traces(program, examples: Sequence[dspy.Example], metric, log: Log) -> list[tuple[dict, str]]:
    """(reply stage inputs, reply) of the program's replies to ``examples`` that the metric passes."""
    kept: list[tuple[dict, str]] = []
    failed = 0
    with progress_bar(desc="finetune: the program's replies", total=len(examples), unit="dialogues") as phase:
        for example in phase.track(examples):
            try:
                pred = program(dialogue=example.dialogue)
            except Exception:  # noqa: BLE001 - a failed call is one reply less to learn from, counted below
                failed += 1
                continue
            if metric(example, pred, trace=[]):
                inputs = {"dialogue": pred.dialogue, "emotion": pred.emotion, "strategy": pred.strategy,
                          "secondary_strategy": pred.secondary_strategy}
                kept.append((inputs, pred.response))
    log(f"finetune: the metric passed {len(kept)} of the program's {len(examples) - failed} replies"
        + (f" ({failed} calls failed)" if failed else ""))
    return kept


def training_data(cfg: FinetuneConfig, program, signature, source, metric,
                  log: Log) -> tuple[dict[str, list], dict[str, Any]]:
    """The training examples of each source of the mix, and what the record says of the data."""
    from trace_dspy.data.listener_replies import listener_replies

    examples: dict[str, list] = {}
    facts: dict[str, Any] = {}
    sources = cfg.mix.split("+")
    if "human" in sources:
        scorer = _scorer()  # refused before any reply is read
        replies = listener_replies(source, limit=cfg.limit, seed=cfg.seed)
        human = human_examples(replies.items, scorer, signature, relevance=_relevance(cfg.floors),
                               floors=cfg.floors) if len(replies) else HumanExamples([], 0)
        examples["human"] = human.examples
        facts["pool"] = {**replies.counts.as_dict(), "below_floors": human.below_floors}
        facts["floors"] = asdict(cfg.floors)
        log(f"finetune: {len(replies)} human listener replies from the training side of {replies.location}, "
            f"{human.below_floors} below the floors (relevance {cfg.floors.relevance}, empathy "
            f"{cfg.floors.empathy}) left out")
    if "program" in sources:
        turns = first_turns(source.pool, cfg.limit, cfg.seed)
        traces = program_traces(program, turns, metric, log)
        examples["program"] = program_examples(traces, signature)
        facts["program_replies"] = {"dialogues": len(turns), "passed": len(traces)}
    return examples, facts


def _record(cfg: FinetuneConfig, model: str, trained, facts: dict[str, Any]) -> dict[str, Any]:
    from trace_dspy.lm.model_files import default_model_path

    named = parse_local_model(model)[0]
    result = trained.result
    return {"base_model": Path(named).name if named else default_model_path().name, "base_lm": model,
            "mix": cfg.mix, "limit": cfg.limit, "seed": cfg.seed, "examples": dict(trained.counts), **facts,
            "lora": result.settings.identity(), "float16": cfg.float16, "steps": result.steps,
            "tokens": result.tokens, "seconds": round(result.seconds, 1),
            "final_loss": round(result.losses[-1], 4) if result.losses else None,
            "resumed_from": result.resumed_from, "truncated": result.truncated}


def fit_writer(opt, program, source, metric, log: Log,
               progress: Callable[[Any], None] | None = None) -> FinetuneFit:
    """Train the writer (see the module docstring): the tuned program, the record and the loss curve.

    ``source``: the data source whose pool gives the conversations trained on (the compile passes its training
    side): their first listener replies for the human mix, their first turns for the program to answer for the
    program mix."""
    from trace_dspy.core import env

    cfg = finetune_config(opt)
    model = base_model(program)
    tuned = type(program)(tuned_config(program.config), stage_lms=program.stage_lms, parts=program.parts)
    examples, facts = training_data(cfg, program, tuned.generate_response.signature, source, metric, log)
    counts = ", ".join(f"{len(v)} {k}" for k, v in sorted(examples.items()))
    log(f"finetune: training the reply stage's LoRA adapter on {counts} examples from {model}; checkpoints in "
        f"{env.cache_dir('finetune')} (a compile stopped and run again resumes there)")
    trained = train_writer(cfg, examples, model=model, progress=progress)
    result = trained.result
    if result.resumed_from and result.resumed_from >= result.steps:
        log(f"finetune: reused the finished training of these examples and settings ({trained.adapter.name})")
    elif result.resumed_from:
        log(f"finetune: resumed at step {result.resumed_from} of {result.steps} from the checkpoint")
    program_out = tuned.with_parts(writer_adapter=trained.adapter)
    return FinetuneFit(program_out, _record(cfg, model, trained, facts), list(result.losses))


def training_side(source, trainset: Sequence[dspy.Example]):
    """``source`` with only the pool conversations of ``trainset`` (the compile's training side): the human
    replies of dev conversations are never trained on."""
    keep = {str(e.get("conversation_id")) for e in trainset}
    return replace(source, pool=[s for s in source.pool if s.conversation_id in keep])


__all__ = ["FinetuneFit", "base_model", "finetune_config", "first_turns", "fit_writer", "program_traces",
           "training_data", "training_side"]
