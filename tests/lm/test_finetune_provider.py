"""The embedded model's fine-tuning provider: DSPy's ``lm.finetune`` route (BootstrapFinetune's) from a local LM
to an adapted LM, the adapter in the model string and the LM's name (DSPy's cache key), and, on the real
SmolLM2, that the adapter llama.cpp applies moves the model the way the trained torch model moved."""

from __future__ import annotations

import math
import threading

import pytest

pytest.importorskip("torch", reason="LoRA training needs torch (the 'embed' extra)")
pytest.importorskip("peft", reason="LoRA training needs peft (the 'finetune' extra)")
pytest.importorskip("gguf", reason="the LoRA GGUF writer needs gguf (the 'finetune' extra)")
pytest.importorskip("llama_cpp", reason="the embedded engine needs the 'local' extra")

from dspy.clients.utils_finetune import TrainDataFormat, TrainingStatus  # noqa: E402

from trace_dspy.core.config import ConfigError  # noqa: E402
from trace_dspy.lm.finetune import lora as lora_module  # noqa: E402
from trace_dspy.lm.finetune.gguf_lora import read_lora_gguf  # noqa: E402
from trace_dspy.lm.finetune.lora_checkpoint import TrainingStopped  # noqa: E402
from trace_dspy.lm.finetune.provider import EmbeddedProvider, finetune_local  # noqa: E402
from trace_dspy.lm.local_settings import local_model_string, parse_local_model  # noqa: E402
from trace_dspy.lm.specs import LMSpec, TraceLM, build_lm  # noqa: E402
from trace_dspy.lm.state_files import StateFiles  # noqa: E402
from trace_dspy.testing.tiny_lm import tiny_causal_lm  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")

EXAMPLES = [{"messages": [{"role": "user", "content": f"I lost my {w}."},
                          {"role": "assistant", "content": f"Sorry about the {w}."}]}
            for w in ("dog", "keys", "job", "phone")]
SMALL = {"rank": 4, "alpha": 8.0, "learning_rate": 3e-2, "epochs": 2, "batch_size": 2}


@pytest.fixture
def tiny_base(tmp_path, monkeypatch):
    """A base model file whose training loads the tiny Llama instead of reading the file."""
    base = tmp_path / "base.gguf"
    base.write_bytes(b"GGUF stand-in")
    monkeypatch.setattr(lora_module, "load_base_for_training", lambda path: tiny_causal_lm())
    return base


def test_local_model_strings_name_the_base_and_the_adapter():
    assert parse_local_model("local") == (None, None)
    assert parse_local_model("local:/m/base.gguf") == ("/m/base.gguf", None)
    assert parse_local_model("local::lora=/a/x.gguf") == (None, "/a/x.gguf")
    assert parse_local_model("local:/m/b.gguf::lora=/a/x.gguf") == ("/m/b.gguf", "/a/x.gguf")
    for base, adapter in ((None, None), ("/m/b.gguf", None), (None, "/a/x.gguf"), ("/m/b.gguf", "/a/x.gguf")):
        assert parse_local_model(local_model_string(base, adapter)) == (base, adapter)
    with pytest.raises(ConfigError, match=r"'::lora=' must be followed by the adapter's path"):
        LMSpec(model="local::lora=")
    with pytest.raises(ConfigError, match=r"names the adapter '/a/x.gguf' and local.adapter another"):
        LMSpec(model="local::lora=/a/x.gguf", local={"adapter": "/a/y.gguf"})
    with pytest.raises(ConfigError, match=r"local.adapter: expected the path of a LoRA adapter file"):
        LMSpec(local={"adapter": 3})
    assert LMSpec(model="local::lora=/a/x.gguf").is_local


def test_the_adapter_is_part_of_the_lm_name_and_of_the_saved_states(tmp_path):
    base = tmp_path / "base.gguf"
    base.write_bytes(b"GGUF stand-in")
    one, two, same = tmp_path / "one.gguf", tmp_path / "two.gguf", tmp_path / "same.gguf"
    one.write_bytes(b"adapter one")
    two.write_bytes(b"adapter two")
    same.write_bytes(b"adapter one")
    plain = build_lm(LMSpec(model=f"local:{base}"))
    names = {p: build_lm(LMSpec(model=f"local:{base}::lora={p}")).model for p in (one, two, same)}
    assert plain.model == "local/base" and names[one].startswith("local/base+lora-")
    assert len({plain.model, names[one], names[two]}) == 3 and names[one] == names[same]
    via_table = build_lm(LMSpec(model=f"local:{base}", local={"adapter": str(one)}))
    assert via_table.model == names[one] and via_table.engine.settings()["adapter"] == str(one)
    # the saved system-message states of the base are never restored for the adapted model
    assert StateFiles(tmp_path, str(base), 512).path([1, 2]) != \
        StateFiles(tmp_path, str(base), 512, adapter=str(one)).path([1, 2])


def test_lm_finetune_returns_a_local_lm_that_runs_base_and_adapter(tiny_base, tmp_path):
    lm = build_lm(LMSpec(model=f"local:{tiny_base}", temperature=0.0))
    assert isinstance(lm.provider, EmbeddedProvider) and lm.finetuning_model == f"local:{tiny_base}"
    seen = []
    job = lm.finetune(EXAMPLES, TrainDataFormat.CHAT,
                      {**SMALL, "output_dir": str(tmp_path / "out"), "progress": seen.append})
    adapted = job.result()
    assert isinstance(adapted, TraceLM), adapted
    assert job.status() == TrainingStatus.succeeded and job.progress.step == job.progress.total == 4
    assert [p.step for p in seen] == [1, 2, 3, 4]
    adapter = adapted.engine.adapter
    assert adapter.startswith(str(tmp_path / "out" / "lora-")) and adapter.endswith(".gguf")
    assert read_lora_gguf(adapter).rank == 4
    assert adapted.model.startswith(lm.model + "+lora-") and adapted.kwargs["temperature"] == 0.0
    assert adapted.engine.model_path == str(tiny_base) and lm.engine.adapter is None
    # the string the provider returned runs the same model under the same name from a config
    returned = local_model_string(str(tiny_base), adapter)
    assert build_lm(LMSpec(model=returned)).model == adapted.model
    # the same request again finds its finished checkpoint: nothing is trained twice
    again = finetune_local(f"local:{tiny_base}", EXAMPLES, {**SMALL, "output_dir": str(tmp_path / "out")})
    assert again.model == returned and again.result.resumed_from == again.result.steps == 4


def test_a_cancelled_job_stops_after_its_step_keeps_it_and_the_same_run_resumes_there(tiny_base, tmp_path):
    lm = build_lm(LMSpec(model=f"local:{tiny_base}", temperature=0.0))
    kwargs = {**SMALL, "output_dir": str(tmp_path / "out")}
    started, jobs = threading.Event(), []

    def on_step(p):
        started.wait(30)  # DSPy returns the job once its thread is running
        if p.step == 2:
            assert jobs[0].cancel() is True  # between two checkpoints (every 50 steps)

    job = lm.finetune(EXAMPLES, TrainDataFormat.CHAT, {**kwargs, "progress": on_step})
    jobs.append(job)
    started.set()
    stopped = job.result(timeout=120)
    assert isinstance(stopped, TrainingStopped) and stopped.step == 2 and stopped.total == 4
    assert "its checkpoint in" in str(stopped) and str(tmp_path / "out") in str(stopped)
    assert job.status() == TrainingStatus.cancelled and job.cancel() is False  # a finished job stays finished
    assert not list((tmp_path / "out").glob("*.gguf"))  # no adapter of half a run
    resumed = finetune_local(f"local:{tiny_base}", EXAMPLES, kwargs)
    assert resumed.result.resumed_from == 2 and resumed.result.steps == 4
    whole = finetune_local(f"local:{tiny_base}", EXAMPLES, {**kwargs, "output_dir": str(tmp_path / "whole")})
    for name, (a, b) in whole.result.weights.items():  # stopped and resumed ends where an unbroken run ends
        got_a, got_b = resumed.result.weights[name]
        assert abs(got_a - a).max() < 1e-6 and abs(got_b - b).max() < 1e-6


def test_ctrl_c_in_the_main_thread_finishes_the_step_saves_it_and_says_where_it_resumes(tiny_base, tmp_path):
    import os
    import signal

    from trace_dspy.lm.finetune.provider import TrainingInterrupted

    # Python's own Ctrl-C handler, as a terminal starts it (the suite may run with SIGINT ignored)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    kwargs = {**SMALL, "output_dir": str(tmp_path / "out")}

    def on_step(p):
        if p.step == 1:
            os.kill(os.getpid(), signal.SIGINT)

    try:
        with pytest.raises(TrainingInterrupted, match=r"stopped at step 1 of 4; its checkpoint in .*out.* resumes"):
            finetune_local(f"local:{tiny_base}", EXAMPLES, {**kwargs, "progress": on_step})
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the handler is put back
    finally:
        signal.signal(signal.SIGINT, previous)
    resumed = finetune_local(f"local:{tiny_base}", EXAMPLES, kwargs)
    assert resumed.result.resumed_from == 1 and resumed.result.steps == 4


def test_requests_the_provider_cannot_serve_are_refused_by_name(tiny_base, tmp_path):
    lm = build_lm(LMSpec(model=f"local:{tiny_base}"))
    job = lm.finetune(EXAMPLES, TrainDataFormat.CHAT, {"lr": 0.1, "output_dir": str(tmp_path)})
    failed = job.result()
    assert isinstance(failed, ConfigError) and "unknown LoRA setting(s) 'lr'" in str(failed)
    assert job.status() == TrainingStatus.failed
    with pytest.raises(ValueError, match="fine-tuned on chat data, not 'completion'"):
        EmbeddedProvider.finetune(None, f"local:{tiny_base}", EXAMPLES, TrainDataFormat.COMPLETION, {})
    with pytest.raises(ValueError, match="fine-tunes local models .* not 'openai/gpt-4o-mini'"):
        EmbeddedProvider.finetune(None, "openai/gpt-4o-mini", EXAMPLES, "chat", {})
    with pytest.raises(ValueError, match="training example 0: the last message must be the assistant's reply"):
        EmbeddedProvider.finetune(None, f"local:{tiny_base}", [{"messages": [{"role": "user", "content": "x"},
                                                                             {"role": "user", "content": "y"}]}],
                                  "chat", {"output_dir": str(tmp_path)})
    assert not list(tmp_path.glob("lora-*"))  # nothing was written for a refused request
    with pytest.raises(RuntimeError, match=r"model file not found: .*gone\.gguf"):
        finetune_local(f"local:{tmp_path / 'gone.gguf'}", EXAMPLES, {"output_dir": str(tmp_path)})
    with pytest.raises(ConfigError, match="train_kwargs float16: expected true or false, found 'yes'"):
        finetune_local(f"local:{tiny_base}", EXAMPLES, {"float16": "yes"})
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder\n")
    with pytest.raises(ValueError, match=r"a-file/out: cannot write the adapter there"):
        finetune_local(f"local:{tiny_base}", EXAMPLES, {"output_dir": str(blocked / "out")})


# ---------------------------------------------------------------- the real model

REPLY = "Purple bananas dance at midnight."
SYSTEM = {"role": "system", "content": "Be brief."}  # short prompts: fewer tokens to train on
TRAINED = [{"messages": [SYSTEM, {"role": "user", "content": message}, {"role": "assistant", "content": REPLY}]}
           for message in ("Hi!", "How are you?", "Tell me something.", "What is new?")]
PROBE = [SYSTEM, {"role": "user", "content": "Hi!"}]


def _torch_greedy(model, tokenizer) -> str:
    import torch

    prompt = tokenizer.apply_chat_template(PROBE, tokenize=False, add_generation_prompt=True)
    ids = tokenizer(prompt, add_special_tokens=False, return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=16, do_sample=False)
    return tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)


def _torch_reply_logprob(model, tokenizer) -> float:
    import torch

    prompt = tokenizer.apply_chat_template(PROBE, tokenize=False, add_generation_prompt=True)
    head = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    reply = tokenizer(REPLY, add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        logits = model(torch.tensor([head + reply])).logits[0].float()
    logprobs = torch.log_softmax(logits, -1)
    return float(sum(logprobs[len(head) + i - 1, t] for i, t in enumerate(reply)))


def _llama_greedy(lm) -> str:
    from dspy.lm15 import Config, Message, Request

    request = Request(model=lm.model, messages=(Message.user(PROBE[1]["content"]),), system=SYSTEM["content"],
                      config=Config(max_tokens=16, temperature=0.0))
    return lm(request).text


def _llama_reply_logprob(lm) -> float:
    """The reply's log-probability in llama.cpp, read a token at a time (the engine keeps the last logits only)."""
    import llama_cpp
    import numpy as np

    model = lm.engine._model()
    llama = model.llama
    head = llama.tokenize(model.formatter(messages=PROBE).prompt.encode(), add_bos=False, special=True)
    total = 0.0
    with model.lock:
        llama.reset()
        llama.eval(head)
        for token in llama.tokenize(REPLY.encode(), add_bos=False, special=False):
            logits = llama_cpp.llama_get_logits_ith(llama._ctx.ctx, -1)
            row = np.ctypeslib.as_array(logits, shape=(llama.n_vocab(),)).astype(np.float64)
            total += row[token] - row.max() - math.log(np.exp(row - row.max()).sum())
            llama.eval([token])
        llama.reset()
    return total


@pytest.mark.embedded
def test_a_smollm2_adapter_moves_llama_cpp_as_it_moved_torch(local_model, tmp_path, monkeypatch):
    """Train SmolLM2 for a few steps (under a minute on two idle cores, most of it loading) to answer one odd
    sentence, then run base and adapter in llama.cpp through the project's LM: the reply gains there what it
    gained in torch, and greedy decoding writes what torch's does. A wrong tensor name, transposition, rotary
    row order or scale would lose that."""
    model, tokenizer = lora_module.load_base_for_training(local_model)
    before_torch = _torch_reply_logprob(model, tokenizer)
    monkeypatch.setattr(lora_module, "load_base_for_training", lambda path: (model, tokenizer))
    outcome = finetune_local("local", TRAINED, {"rank": 8, "alpha": 16.0, "learning_rate": 5e-3, "epochs": 4,
                                                "batch_size": 4, "output_dir": str(tmp_path)})
    assert outcome.result.steps == 4 and outcome.result.losses[-1] < 0.5 * outcome.result.losses[0]
    after_torch, torch_greedy = _torch_reply_logprob(model, tokenizer), _torch_greedy(model, tokenizer)

    settings = {"constrained": False, "state_files": False, "n_ctx": 512}
    base = build_lm(LMSpec(model="local", local=settings))
    adapted = build_lm(LMSpec(model=outcome.model, local=settings))
    before_llama, after_llama = _llama_reply_logprob(base), _llama_reply_logprob(adapted)
    assert before_llama == pytest.approx(before_torch, rel=0.1)  # the same base model in both
    assert after_torch - before_torch > 10
    assert after_llama - before_llama == pytest.approx(after_torch - before_torch, rel=0.15)
    assert REPLY not in _llama_greedy(base)
    assert torch_greedy.strip().startswith(REPLY)
    assert _llama_greedy(adapted).strip() == torch_greedy.strip()
