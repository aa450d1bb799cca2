"""``compile --optimizer finetune`` end to end on a tiny setup: a fake LM whose fine-tuning base is a stand-in
file that trains the tiny Llama (tests/lm/test_finetune_provider.py), a fake EPITOME scorer, the seed set. The
artifact gets the adapter and its record, MLflow the loss curve, and a second compile reuses the training."""

from __future__ import annotations

import hashlib
import json

import pytest

pytest.importorskip("torch", reason="LoRA training needs torch (the 'embed' extra)")
pytest.importorskip("peft", reason="LoRA training needs peft (the 'finetune' extra)")
pytest.importorskip("gguf", reason="the LoRA GGUF writer needs gguf (the 'finetune' extra)")

from conftest import FAST_CONFIG, compile_reply, offline_workdir  # noqa: E402

import trace_dspy  # noqa: E402
import trace_dspy.compact.finetune_fit as finetune_fit  # noqa: E402
from trace_dspy.cli.compile import main  # noqa: E402
from trace_dspy.lm.finetune import lora as lora_module  # noqa: E402
from trace_dspy.store.artifacts import read_artifact  # noqa: E402
from trace_dspy.testing.fakes import fake_lm  # noqa: E402
from trace_dspy.testing.tiny_lm import tiny_causal_lm  # noqa: E402
from trace_dspy.workflows.finetuning import SHA_TAG  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")
ARGS = ["--optimizer", "finetune", "--finetune-limit", "4", "--finetune-rank", "4", "--finetune-epochs", "2",
        "--finetune-lr", "0.01", "--train", "4", "--dev", "2", "--threads", "1", "--config", "fast.toml",
        "--no-trace"]


def _reply(outputs, inputs):
    """compile_reply, also for the briefed chat layout, whose reply call carries the speaker's message."""
    if "response" in outputs:
        words = (inputs.get("dialogue") or inputs.get("message") or "").split()[-3:]
        return {"response": f"Losing that sounds awful; {' '.join(words)} how are you holding up?"}
    return compile_reply(outputs, inputs)


class _Scorer:
    """The EPITOME scorer's interface: ER strongest, then EX, for every reply."""

    def score_batch(self, seekers, replies):
        return [{"ER": 2.0, "IP": 0.5, "EX": 1.0} for _ in replies]


class _Relevance:
    """The relevance head's interface: every reply fits its speaker."""

    def score_batch(self, speakers, lasts, replies):
        return [0.9 for _ in replies]


@pytest.fixture
def tiny_compile(tmp_path, monkeypatch):
    """A working directory whose every LM is a fake that fine-tunes a stand-in base file into the tiny Llama;
    returns the tracking URI."""
    lm, _ = fake_lm(_reply)
    base = tmp_path / "base.gguf"
    base.write_bytes(b"GGUF stand-in")
    lm.finetuning_model = f"local:{base}"
    offline_workdir(tmp_path, monkeypatch, lm)
    monkeypatch.setattr(lora_module, "load_base_for_training", lambda path: tiny_causal_lm())
    monkeypatch.setattr(finetune_fit, "_scorer", lambda: _Scorer())  # the training data's planner
    monkeypatch.setattr(finetune_fit, "_relevance", lambda floors: _Relevance())  # and the floors' reader
    (tmp_path / "fast.toml").write_text(FAST_CONFIG)
    return f"sqlite:///{tmp_path / 'mlflow.db'}"


def test_compile_finetune_saves_the_adapter_records_it_and_logs_the_loss_curve(tiny_compile, tmp_path, capsys):
    from mlflow import MlflowClient

    assert main([*ARGS, "--tracking-uri", tiny_compile]) == 0
    folder = tmp_path / "artifacts/trace-dspy/v0001"
    manifest = json.loads((folder / "manifest.json").read_text())
    record, sha = manifest["writer_adapter"], hashlib.sha256((folder / "writer_adapter.gguf").read_bytes()).hexdigest()
    assert record["sha256"] == sha and record["bytes"] == (folder / "writer_adapter.gguf").stat().st_size
    assert (record["base_model"], record["mix"], record["limit"], record["examples"]) == (
        "base.gguf", "human", 4, {"human": 4})
    assert (record["lora"]["rank"], record["lora"]["alpha"], record["lora"]["epochs"]) == (4, 8.0, 2)
    assert record["steps"] == 2 and record["resumed_from"] == 0 and record["pool"]["sampled"] == 4
    assert manifest["optimizer"] == {"name": "finetune", "seed": 0, "finetune_mix": "human", "finetune_limit": 4,
                                     "finetune_rank": 4, "finetune_epochs": 2, "finetune_learning_rate": 0.01}
    program = manifest["config"]["program"]
    assert (program["writer"], program["reply_format"], program["reply_exemplars"]) == ("compact", "briefed", False)
    assert read_artifact(folder).parts["writer_adapter"].sha256 == sha
    loaded = trace_dspy.load(str(folder), attach_lms=False)  # built with the config it was trained for
    assert loaded.config.reply_format == "briefed" and loaded.parts["writer_adapter"].sha256 == sha
    client = MlflowClient(tracking_uri=tiny_compile)
    run = client.get_run(manifest["mlflow"]["run_id"])
    losses = client.get_metric_history(run.info.run_id, "finetune/loss")
    assert sorted(m.step for m in losses) == [1, 2] and run.data.metrics["finetune/steps"] == 2
    assert run.data.params["finetune.adapter_sha256"] == sha and run.data.tags[SHA_TAG] == sha
    assert run.data.params["finetune.mix"] == "human" and run.data.params["finetune.lora.rank"] == "4"
    assert run.data.params["finetune.examples.human"] == "4"
    err = capsys.readouterr().err
    assert "finetune: training the reply stage's LoRA adapter on 4 human examples" in err
    # the same compile again finds the provider's finished checkpoint: nothing is trained twice
    assert main([*ARGS, "--tracking-uri", tiny_compile]) == 0
    again = json.loads((tmp_path / "artifacts/trace-dspy/v0002/manifest.json").read_text())["writer_adapter"]
    assert again["resumed_from"] == again["steps"] == 2 and again["sha256"] == sha
    assert "finetune: reused the finished training" in capsys.readouterr().err


def test_compile_finetune_refuses_what_it_cannot_train_in_one_line(tiny_compile, tmp_path, monkeypatch, capsys):
    import trace_dspy.workflows.finetuning as finetuning

    real = finetuning.importlib.util.find_spec
    monkeypatch.setattr(finetuning.importlib.util, "find_spec", lambda name: None if name == "peft" else real(name))
    assert main([*ARGS, "--no-mlflow"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ['error: compile --optimizer finetune needs the \'finetune\' and \'embed\' extras (peft not '
                   'installed): pip install -e ".[finetune,embed]"']
    monkeypatch.setattr(finetuning.importlib.util, "find_spec", real)
    assert main([*ARGS, "--no-mlflow", "--lm", "openai/gpt-4o-mini"]) == 2
    assert "trains a LoRA adapter for the embedded model; the reply stage runs on 'openai/gpt-4o-mini'" in \
        capsys.readouterr().err
    with pytest.raises(SystemExit) as stopped:  # argparse names the choices
        main([*ARGS, "--no-mlflow", "--finetune-mix", "both"])
    assert stopped.value.code == 2 and "choose from 'human', 'program', 'human+program'" in capsys.readouterr().err
    assert not (tmp_path / "artifacts").exists()


def test_the_program_mix_learns_from_the_replies_the_metric_passes(tiny_compile, tmp_path, monkeypatch):
    import trace_dspy.compact.finetune_fit as fit_module

    seen = []
    real = fit_module.program_traces

    def traces(program, examples, metric, log):
        kept = real(program, examples, metric, log)
        seen.append((len(examples), kept))
        # the program answers each conversation's opening message, as the human mix learns it
        assert all("Listener:" not in e.dialogue for e in examples)
        return kept

    monkeypatch.setattr(fit_module, "program_traces", traces)
    # a metric every reply passes: the fake's replies are not good ones
    (tmp_path / "fast.toml").write_text(FAST_CONFIG.replace("[metric]\n", "[metric]\nthreshold = 0.0\n"))
    assert main([*ARGS, "--no-mlflow", "--finetune-mix", "human+program"]) == 0
    record = json.loads((tmp_path / "artifacts/trace-dspy/v0001/manifest.json").read_text())["writer_adapter"]
    (tried, kept), = seen
    assert tried == 4 and kept and record["program_replies"] == {"dialogues": 4, "passed": len(kept)}
    assert record["examples"] == {"human": 4, "program": len(kept)} and record["mix"] == "human+program"
    # each kept reply comes with the inputs the reply stage had: the dialogue, the emotion and the plan
    assert all(set(inputs) == {"dialogue", "emotion", "strategy", "secondary_strategy"} and reply
               for inputs, reply in kept)


def test_the_floors_flag_leaves_out_the_replies_below_it_and_the_record_counts_them(tiny_compile, tmp_path,
                                                                                   monkeypatch, capsys):
    class _Half:  # the relevance head finds every other reply off-topic
        def score_batch(self, speakers, lasts, replies):
            return [0.9 if i % 2 else 0.1 for i in range(len(replies))]

    monkeypatch.setattr(finetune_fit, "_relevance", lambda floors: _Half() if floors.relevance > 0 else None)
    assert main([*ARGS, "--no-mlflow", "--finetune-floors", "0.5,0.2"]) == 0
    manifest = json.loads((tmp_path / "artifacts/trace-dspy/v0001/manifest.json").read_text())
    record = manifest["writer_adapter"]
    assert record["examples"] == {"human": 2} and record["pool"]["below_floors"] == 2
    assert record["floors"] == {"relevance": 0.5, "empathy": 0.2}
    assert manifest["optimizer"]["finetune_floors"] == [0.5, 0.2]
    assert "2 below the floors (relevance 0.5, empathy 0.2) left out" in capsys.readouterr().err
    assert main([*ARGS, "--no-mlflow", "--finetune-floors", "0,0"]) == 0  # 0,0 keeps every reply
    again = json.loads((tmp_path / "artifacts/trace-dspy/v0002/manifest.json").read_text())["writer_adapter"]
    assert again["examples"] == {"human": 4} and again["pool"]["below_floors"] == 0
    with pytest.raises(SystemExit) as stopped:  # argparse: not two numbers
        main([*ARGS, "--no-mlflow", "--finetune-floors", "0.5"])
    assert stopped.value.code == 2 and "expected two numbers as RELEVANCE,EMPATHY" in capsys.readouterr().err
    assert main([*ARGS, "--no-mlflow", "--finetune-floors", "2,0.3"]) == 2  # the config's range
    assert "finetune_floors must be two numbers, relevance in [0, 1]" in capsys.readouterr().err
    assert not (tmp_path / "artifacts/trace-dspy/v0003").exists()


def test_ctrl_c_during_training_says_the_step_it_stopped_at_and_the_next_compile_resumes_there(
        tiny_compile, tmp_path, monkeypatch, capsys):
    import os
    import signal

    from trace_dspy.workflows.finetuning import TrainingBar

    real = TrainingBar.__call__

    def interrupting(self, step):
        real(self, step)
        if step.step == 1:
            os.kill(os.getpid(), signal.SIGINT)

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # as a terminal starts Python
    monkeypatch.setattr(TrainingBar, "__call__", interrupting)
    try:
        assert main([*ARGS, "--no-mlflow"]) == 130
    finally:
        signal.signal(signal.SIGINT, previous)
    err = capsys.readouterr().err
    assert "interrupted: training stopped at step 1 of 2; its checkpoint in " in err
    assert "no artifact version was written" in err and not (tmp_path / "artifacts/trace-dspy").exists()
    monkeypatch.setattr(TrainingBar, "__call__", real)
    assert main([*ARGS, "--no-mlflow"]) == 0
    record = json.loads((tmp_path / "artifacts/trace-dspy/v0001/manifest.json").read_text())["writer_adapter"]
    assert record["resumed_from"] == 1 and record["steps"] == 2
    assert "finetune: resumed at step 1 of 2 from the checkpoint" in capsys.readouterr().err
