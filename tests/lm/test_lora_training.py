"""LoRA training on a tiny Llama built from a config (trace_dspy.testing.tiny_lm): the loss falls, a stopped
run resumes from its checkpoint to the very weights of an uninterrupted one, and a checkpoint of another run
is refused."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

pytest.importorskip("torch", reason="LoRA training needs torch (the 'embed' extra)")
pytest.importorskip("peft", reason="LoRA training needs peft (the 'finetune' extra)")

from trace_dspy.core.config import ConfigError  # noqa: E402
from trace_dspy.lm.finetune.lora import (  # noqa: E402
    FinetuneError,
    LoraSettings,
    encode_chat,
    train_lora,
)
from trace_dspy.lm.finetune.lora_checkpoint import checkpoint_path  # noqa: E402
from trace_dspy.testing.tiny_lm import tiny_causal_lm  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")

WORDS = ("dog", "keys", "job", "phone", "bike", "cat")
EXAMPLES = [{"messages": [{"role": "system", "content": "Be kind."},
                          {"role": "user", "content": f"I lost my {w}."},
                          {"role": "assistant", "content": f"Sorry about the {w}."}]} for w in WORDS]
FAST = LoraSettings(rank=4, alpha=8.0, learning_rate=3e-2, epochs=3, batch_size=2, dropout=0.1,
                    target_modules=("q_proj", "v_proj", "up_proj", "down_proj"), checkpoint_every=2, seed=7)


class Stop(Exception):
    """What a progress callback raises to kill a run."""


def _weights(result) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    return result.weights


def test_training_lowers_the_loss_and_reports_each_step():
    model, tokenizer = tiny_causal_lm()
    seen = []
    settings = LoraSettings(rank=8, alpha=16.0, learning_rate=3e-2, epochs=8, batch_size=6)
    result = train_lora(model, tokenizer, EXAMPLES, settings, progress=seen.append)
    assert result.steps == 8 == len(result.losses) == len(seen)
    assert result.losses[-1] < 0.7 * result.losses[0]
    assert [p.step for p in seen] == list(range(1, 9)) and all(p.total == 8 for p in seen)
    assert all(p.tokens_per_second > 0 for p in seen) and seen[-1].tokens == result.tokens > 0
    assert result.seed == 0 and result.resumed_from == 0 and result.seconds > 0
    # the adapter of every attention projection of both layers, in peft's (rank, in) / (out, rank) layout
    assert len(result.weights) == 8
    a, b = result.weights["model.layers.1.self_attn.k_proj"]
    assert a.shape == (8, 32) and b.shape == (16, 8) and a.dtype == np.float32


def test_only_the_last_reply_is_learned():
    _, tokenizer = tiny_causal_lm()
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
                {"role": "user", "content": "Bye"}, {"role": "assistant", "content": "See you."}]
    ids, labels, cut = encode_chat(tokenizer, messages, 256)
    learned = tokenizer.decode([t for t, label in zip(ids, labels) if label != -100])
    assert learned == "See you.<|im_end|>\n" and not cut
    ids, labels, cut = encode_chat(tokenizer, messages, 20)  # the prompt's start is cut, the reply kept
    assert cut and len(ids) == 20 and tokenizer.decode([t for t, lb in zip(ids, labels) if lb != -100]) == \
        "See you.<|im_end|>\n"
    with pytest.raises(FinetuneError, match="training example 3: its reply alone is"):
        encode_chat(tokenizer, messages, 8, index=3)


def test_a_killed_run_resumes_from_its_checkpoint_to_the_same_weights(tmp_path):
    model, tokenizer = tiny_causal_lm()
    straight = train_lora(model, tokenizer, EXAMPLES, FAST)

    def kill_at_step_5(progress):
        if progress.step == 5:
            raise Stop

    model, tokenizer = tiny_causal_lm()
    with pytest.raises(Stop):
        train_lora(model, tokenizer, EXAMPLES, FAST, checkpoint_dir=tmp_path, progress=kill_at_step_5)
    assert checkpoint_path(tmp_path).is_file()
    model, tokenizer = tiny_causal_lm()
    resumed = train_lora(model, tokenizer, EXAMPLES, FAST, checkpoint_dir=tmp_path)
    assert resumed.resumed_from == 4  # the last checkpoint before the kill (every 2 steps)
    assert resumed.steps == straight.steps == 9
    assert resumed.losses == pytest.approx(straight.losses, abs=1e-6)
    for module, (a, b) in straight.weights.items():
        np.testing.assert_allclose(resumed.weights[module][0], a, atol=1e-6)
        np.testing.assert_allclose(resumed.weights[module][1], b, atol=1e-6)
    # a finished run's folder holds its last step: running again trains nothing and gives the same adapter
    model, tokenizer = tiny_causal_lm()
    again = train_lora(model, tokenizer, EXAMPLES, FAST, checkpoint_dir=tmp_path)
    assert again.resumed_from == 9 and again.losses == resumed.losses


def test_a_checkpoint_of_other_data_or_settings_is_refused(tmp_path):
    model, tokenizer = tiny_causal_lm()
    train_lora(model, tokenizer, EXAMPLES[:4], FAST, checkpoint_dir=tmp_path)
    saved = checkpoint_path(tmp_path).read_bytes()
    model, tokenizer = tiny_causal_lm()
    with pytest.raises(FinetuneError, match=r"checkpoint\.npz: this checkpoint was made for other training data; "
                                            r"remove .* to start over"):
        train_lora(model, tokenizer, EXAMPLES[1:5], FAST, checkpoint_dir=tmp_path)
    model, tokenizer = tiny_causal_lm()
    with pytest.raises(FinetuneError, match="made for other settings"):
        train_lora(model, tokenizer, EXAMPLES[:4], LoraSettings(**{**FAST.__dict__, "rank": 8}),
                   checkpoint_dir=tmp_path)
    assert checkpoint_path(tmp_path).read_bytes() == saved  # a refused run leaves the checkpoint as it was
    # checkpoint_every does not change the result, so a run with another one resumes
    model, tokenizer = tiny_causal_lm()
    result = train_lora(model, tokenizer, EXAMPLES[:4], LoraSettings(**{**FAST.__dict__, "checkpoint_every": 5}),
                        checkpoint_dir=tmp_path)
    assert result.resumed_from == result.steps


def test_a_damaged_checkpoint_is_refused_with_its_name(tmp_path):
    model, tokenizer = tiny_causal_lm()
    train_lora(model, tokenizer, EXAMPLES[:2], FAST, checkpoint_dir=tmp_path)
    path = checkpoint_path(tmp_path)
    path.write_bytes(path.read_bytes()[:300])
    model, tokenizer = tiny_causal_lm()
    with pytest.raises(FinetuneError, match=rf"^{tmp_path}.*checkpoint\.npz: damaged LoRA checkpoint"):
        train_lora(model, tokenizer, EXAMPLES[:2], FAST, checkpoint_dir=tmp_path)


@pytest.mark.parametrize("examples, message", [
    ([], "no training examples"),
    ([{"messages": [{"role": "user", "content": "Hi"}]}], "training example 0: expected"),
    ([EXAMPLES[0], {"messages": [{"role": "assistant", "content": "Hi"}, {"role": "user", "content": "Yo"}]}],
     "training example 1: the last message must be the assistant's reply"),
    ([{"prompt": "Hi", "completion": "Hello"}], "training example 0: expected"),
])
def test_training_data_that_is_not_chat_is_refused_by_example(examples, message):
    model, tokenizer = tiny_causal_lm()
    with pytest.raises(FinetuneError, match=message):
        train_lora(model, tokenizer, examples, FAST)


def test_settings_are_checked_by_name():
    with pytest.raises(ConfigError, match=r"unknown LoRA setting\(s\) 'lr'; the settings are alpha, batch_size"):
        LoraSettings.from_kwargs({"lr": 1e-3})
    with pytest.raises(ConfigError, match="LoRA rank: expected an integer from 1 to 1024, found 0"):
        LoraSettings(rank=0)
    with pytest.raises(ConfigError, match="LoRA target_modules: expected distinct names from q_proj"):
        LoraSettings(target_modules=("lm_head",))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert LoraSettings.from_kwargs({"target_modules": ["q_proj"]}).target_modules == ("q_proj",)
