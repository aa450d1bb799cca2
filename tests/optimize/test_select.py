"""The default optimizer, ``select``: candidates scored on a selection set apart from train and dev."""

from __future__ import annotations

import dspy
from dspy.lm15 import Message, Response, TextPart, Usage
from trace_dspy.optimize.metric import EmpathyMetric
from trace_dspy.optimize.optimizers import DEFAULT_OPTIMIZER, OptimizerConfig, compile_program

from trace_dspy import TraceProgram
from trace_dspy.data.sources import load_splits, resolve_source
from trace_dspy.testing.fakes import ScriptedEngine
from trace_dspy.workflows.compiling import selection_set

TRAIN_REPLY = "Oh no, that ring meant so much to you. Did anyone hand it in at the beach office?"


def reply_for(outputs, inputs):
    if "response" in outputs:  # a distinct, on-topic reply per dialogue
        words = inputs["dialogue"].split()[-4:]
        return {"response": f"That sounds hard; {' '.join(words)} what happened next?"}
    return {}


class PastingEngine(ScriptedEngine):
    """A model that, once it sees a demo, answers with the demo's completion verbatim (the collapse users saw)."""

    def complete(self, request):
        shown = [m for m in request.messages if m.role == "assistant"]
        if not shown:
            return super().complete(request)
        text = shown[-1].text or ""
        return Response(id=None, model="pasting", message=Message.assistant([TextPart(text)]), finish_reason="stop",
                        usage=Usage(input_tokens=1, output_tokens=1, total_tokens=2))


def examples(prefix, n):
    return [dspy.Example(dialogue=f"Speaker: I lost my grandmother's ring at the beach on day {i} of {prefix}.",
                         emotion="sad", response=TRAIN_REPLY, sample_id=f"{prefix}{i}").with_inputs("dialogue")
            for i in range(n)]


def test_the_default_optimizer_keeps_the_uncompiled_program_when_demos_get_pasted():
    engine = PastingEngine(responder=reply_for)
    lm = dspy.LM("fake/pasting", engine=engine, cache=False)
    metric = EmpathyMetric(embedder=None, copy_sources=[TRAIN_REPLY])
    assert DEFAULT_OPTIMIZER == "select"
    cfg = OptimizerConfig(max_bootstrapped_demos=1, max_labeled_demos=1, plan_items=0)  # demos only: no plans
    with dspy.context(lm=lm):
        compiled = compile_program(cfg, TraceProgram(), metric, examples("train", 4), examples("val", 3)).program
        reply = compiled(dialogue="Speaker: My cat has been missing since Sunday.").response
    kinds = [c["candidate"] for c in compiled.selection]
    assert kinds == ["uncompiled", "labeled", "bootstrap"]
    chosen = [c for c in compiled.selection if c["chosen"]]
    assert [c["candidate"] for c in chosen] == ["uncompiled"]
    # The pasting candidates score 0 on every selection item (copy guard); the uncompiled one does not.
    scores = {c["candidate"]: c["score"] for c in compiled.selection}
    assert scores["labeled"] == 0.0 and scores["uncompiled"] > 0.0
    assert all(not p.demos for _, p in compiled.named_predictors())
    assert reply != TRAIN_REPLY and "Sunday" in reply
    assert not hasattr(compiled, "candidate_programs")  # the other candidates are not carried into the artifact


def test_the_selection_set_is_seeded_and_apart_from_train_and_dev():
    source = resolve_source(None, announce_seed=False)
    splits = load_splits(source, seed=0, train_size=16, dev_size=14)
    val = selection_set(source, splits.train, 8, seed=0)
    assert len(val) == 8
    val_convs = {e.conversation_id for e in val}
    assert not val_convs & {e.conversation_id for e in splits.train}
    assert not val_convs & {e.conversation_id for e in splits.dev}
    assert [e.sample_id for e in selection_set(source, splits.train, 8, seed=0)] == [e.sample_id for e in val]
    assert [e.sample_id for e in selection_set(source, splits.train, 8, seed=3)] != [e.sample_id for e in val]
    assert selection_set(source, splits.train, 0, seed=0) == []


def test_a_pool_with_nothing_beyond_the_train_sample_scores_candidates_on_train(capsys):
    source = resolve_source(None, announce_seed=False)
    everything = load_splits(source, seed=0).train
    assert selection_set(source, everything, 8, seed=0) == everything
    assert "scored on train" in capsys.readouterr().err


def test_the_selection_size_comes_from_the_flag_or_the_data_table(tmp_path):
    import pytest

    from trace_dspy.cli.compile import config_from_args
    from trace_dspy.core.config import ConfigError

    assert config_from_args(["--no-mlflow"]).data.val == 8
    (tmp_path / "c.toml").write_text("[data]\nval = 3\n")
    assert config_from_args(["--config", str(tmp_path / "c.toml")]).data.val == 3
    assert config_from_args(["--config", str(tmp_path / "c.toml"), "--val", "5"]).data.val == 5
    assert config_from_args(["--no-mlflow"]).record()["data"]["val"] == 8
    with pytest.raises(ConfigError, match="--val"):
        config_from_args(["--val", "-1"])


class HintedEngine(ScriptedEngine):
    """A model whose reply carries a marker once it has seen a demo: a compiled candidate that is slightly better."""

    def complete(self, request):
        response = super().complete(request)
        if any(m.role == "assistant" for m in request.messages) and "Speaker" in str(request.messages[-1].text):
            text = response.message.text or ""
            if "[[ ## response ## ]]" in text:
                text = text.replace("[[ ## response ## ]]\n", "[[ ## response ## ]]\nDEMO ")
                return Response(id=None, model="hinted", message=Message.assistant([TextPart(text)]),
                                finish_reason="stop", usage=Usage(input_tokens=1, output_tokens=1, total_tokens=2))
        return response


def test_select_keeps_the_uncompiled_program_unless_a_candidate_wins_by_the_margin():
    def metric(example, pred, trace=None):  # a demo-fed candidate scores 0.01 more
        return 0.51 if str(pred.response).startswith("DEMO") else 0.50

    def run(margin):
        lm = dspy.LM("fake/hinted", engine=HintedEngine(responder=reply_for), cache=False)
        cfg = OptimizerConfig(max_bootstrapped_demos=1, max_labeled_demos=1, select_margin=margin)
        with dspy.context(lm=lm):
            compiled = compile_program(cfg, TraceProgram(), metric, examples("train", 4), examples("val", 3)).program
        scores = {c["candidate"]: c["score"] for c in compiled.selection}
        return compiled, scores, [c["candidate"] for c in compiled.selection if c["chosen"]]

    compiled, scores, chosen = run(0.02)
    assert scores["uncompiled"] == 0.5 and max(scores.values()) == 0.51  # a candidate did win, by 0.01
    assert chosen == ["uncompiled"] and all(not p.demos for _, p in compiled.named_predictors())
    compiled, scores, chosen = run(0.0)
    assert chosen and chosen[0] != "uncompiled" and any(p.demos for _, p in compiled.named_predictors())


def test_select_margin_is_checked():
    import pytest

    from trace_dspy.core.config import ConfigError

    for bad in (-0.1, 1.5, True, "0.02"):
        with pytest.raises(ConfigError, match="select_margin"):
            OptimizerConfig(select_margin=bad)
    assert OptimizerConfig().settings()["select_margin"] == 0.02
