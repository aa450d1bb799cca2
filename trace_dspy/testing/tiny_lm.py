"""A tiny Llama-architecture causal LM and a byte-level tokenizer with a chat template, for fine-tuning tests.

Nothing is downloaded: the model is built from a config (2 layers, hidden size 32) with weights drawn from a
seed, and the tokenizer has one token per byte plus the two chat markers, so any text encodes. Its chat
template renders conversations the way SmolLM2's does (``<|im_start|>role\\n...<|im_end|>\\n``).
Its weights are drawn wider than transformers' default (``initializer_range`` 0.3, not 0.02): with the default,
the tied embeddings are so small that no adapter can move the logits far, and a test could not see a loss fall.
torch, transformers and tokenizers are imported inside the functions.
"""

from __future__ import annotations

from typing import Any

CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL = ("<|im_start|>", "<|im_end|>")
HEADS, KV_HEADS = 4, 2


def tiny_tokenizer() -> Any:
    """A byte-level tokenizer (256 byte tokens, then the chat markers) with SmolLM2's style of chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {symbol: index for index, symbol in enumerate(sorted(alphabet))}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, eos_token=SPECIAL[1], pad_token=SPECIAL[1])
    tokenizer.add_special_tokens({"additional_special_tokens": [SPECIAL[0]]})
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def tiny_causal_lm(seed: int = 0, vocab_size: int | None = None) -> tuple[Any, Any]:
    """(model, tokenizer): a 2-layer Llama (hidden 32, 4 query heads, 2 key/value heads) in float32."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = tiny_tokenizer()
    config = LlamaConfig(vocab_size=vocab_size or len(tokenizer), hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
                         max_position_embeddings=512, tie_word_embeddings=True, initializer_range=0.3,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(torch.float32)
    model.eval()
    return model, tokenizer
