"""A small Qwen3-style tokenizer trained locally (byte-level BPE with Qwen's special tokens and a
Qwen3-style chat template), so the renderer and parity checks run without a model hub."""

from __future__ import annotations

import json
from pathlib import Path

# Qwen's control tokens: the tiny model is a Qwen3-architecture model with a Qwen3-style template.
END_OF_TEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = (IM_START, IM_END, "<think>", "</think>")

# Qwen3's template, reduced to what matters here: ChatML turns, and in non-thinking mode an empty
# think block opening the generated turn. Like Qwen3's, it drops think blocks from history.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message.role + '\\n' }}"
    "{%- if message.role == 'assistant' %}"
    "{%- set content = message.content.split('</think>')[-1].lstrip('\\n') %}"
    "{%- if loop.last and enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- endif %}"
    "{{- content }}"
    "{%- else %}"
    "{{- message.content }}"
    "{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- endif %}"
    "{%- endif %}"
)


def build_tokenizer(out: Path, texts: list[str], vocab_size: int = 4_000) -> Path:
    """Train the tokenizer on ``texts`` and write ``tokenizer.json`` and ``tokenizer_config.json`` to ``out``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[END_OF_TEXT, *SPECIAL_TOKENS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": 32768,
        "eos_token": "<|im_end|>",
        "pad_token": END_OF_TEXT,
        "bos_token": None,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    return out
