"""Tiny but real targets for tests: a transformers ``LlamaForCausalLM`` and a byte-level BPE tokenizer.

``tiny_target(folder)`` writes a Hugging Face folder (config.json, model.safetensors, tokenizer
files) that ``AutoModelForCausalLM`` / ``AutoTokenizer`` load offline. Building one takes well
under a second; everything is seeded.
"""

from __future__ import annotations

from pathlib import Path

import torch

TEXTS = [
    "def add(a, b):\n    return a + b\n",
    "The quick brown fox jumps over the lazy dog.",
    "Speculative decoding drafts tokens with a small model and verifies them with the target.",
    "for i in range(10):\n    print(i * i)\n",
    "user: what is a drafter?\nassistant: a small model that guesses the next tokens.",
    "EAGLE-3 fuses three hidden states of the target model into one.",
]

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def tiny_tokenizer(folder: Path, vocab_size: int = 320, chat_template: bool = True):
    """Train a byte-level BPE on ``TEXTS`` and save it as a ``PreTrainedTokenizerFast`` folder."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|user|>", "<|assistant|>", "<|system|>", "<|end|>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(TEXTS * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    if chat_template:
        fast.chat_template = CHAT_TEMPLATE
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(folder))
    return fast


def tiny_target(folder: Path, *, hidden_size: int = 32, num_layers: int = 8, vocab_size: int = 320,
                heads: int = 4, kv_heads: int = 2, max_position_embeddings: int = 256, seed: int = 0,
                chat_template: bool = True, tokenizer: bool = True) -> Path:
    """Write a random tiny Llama target (and its tokenizer) to ``folder``; returns the folder."""
    from transformers import LlamaConfig, LlamaForCausalLM

    folder = Path(folder)
    if tokenizer:
        tok = tiny_tokenizer(folder, vocab_size=vocab_size, chat_template=chat_template)
        vocab_size = max(vocab_size, len(tok))
    cfg = LlamaConfig(hidden_size=hidden_size, intermediate_size=2 * hidden_size, num_hidden_layers=num_layers,
                      num_attention_heads=heads, num_key_value_heads=kv_heads, vocab_size=vocab_size,
                      max_position_embeddings=max_position_embeddings, tie_word_embeddings=False,
                      bos_token_id=0, eos_token_id=0, pad_token_id=0)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():  # larger logits than the default init so the target has preferences to learn
        model.lm_head.weight.mul_(8.0)
    model.save_pretrained(str(folder))
    return folder


WORDS = ("the quick brown fox jumps over lazy dog def return print range for in model draft token "
         "target speculative accept verify").split()


def tiny_chat_data(path: Path, n: int = 40, seed: int = 0, reply_words: int = 16) -> Path:
    """A JSONL of ``n`` seeded two-turn conversations over a small word list."""
    import json
    import random

    rng = random.Random(seed)
    lines = []
    for _ in range(n):
        lines.append(json.dumps({"messages": [
            {"role": "user", "content": " ".join(rng.choices(WORDS, k=5))},
            {"role": "assistant", "content": " ".join(rng.choices(WORDS, k=reply_words))},
        ]}))
    Path(path).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return Path(path)


def tiny_deepseek_v3_target(folder: Path, *, num_layers: int = 6, vocab_size: int = 128, seed: int = 0) -> Path:
    """Write a random tiny transformers ``DeepseekV3ForCausalLM`` (MLA attention, MoE after layer 0), no tokenizer."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    cfg = DeepseekV3Config(hidden_size=32, intermediate_size=64, moe_intermediate_size=16, num_hidden_layers=num_layers,
                           num_attention_heads=4, num_key_value_heads=4, n_routed_experts=4, n_shared_experts=1,
                           num_experts_per_tok=2, n_group=1, topk_group=1, first_k_dense_replace=1,
                           kv_lora_rank=16, q_lora_rank=24, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8,
                           vocab_size=vocab_size, max_position_embeddings=256, tie_word_embeddings=False,
                           bos_token_id=0, eos_token_id=0, pad_token_id=0)
    torch.manual_seed(seed)
    DeepseekV3ForCausalLM(cfg).save_pretrained(str(folder))
    return Path(folder)


def tiny_pair(target_dir: Path, drafter_dir: Path) -> tuple[Path, Path]:
    """A random tiny target (with tokenizer and chat template) and an EAGLE-3 drafter that fits it."""
    from factories import tiny_drafter_config, write_drafter

    from draftlab.models.target import read_config

    target = tiny_target(target_dir)
    return target, write_drafter(drafter_dir, tiny_drafter_config(read_config(target)))
