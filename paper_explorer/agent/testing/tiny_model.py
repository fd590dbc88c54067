"""``explorer tiny-model``: a Qwen3-architecture model with random weights and a locally trained
Qwen3-style tokenizer, small enough for a laptop CPU, so the whole model path (hf policy,
4-bit loading, LoRA adapters, parity, training) can be smoke-tested without a model hub.

Its actions are nonsense - the weights are random - which is the point: the loop must handle
whatever a model writes.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import paper_explorer.corpus.files as files
from paper_explorer.agent.errors import AgentError
from paper_explorer.agent.testing.tiny_tokenizer import END_OF_TEXT, IM_END, build_tokenizer

# head_dim 32: the smallest head size vLLM's CPU attention serves (32, 64, 80, ...), so a real
# vLLM can serve this model. Two heads of 32 keep the projections of the earlier four of 16 (and
# the training dynamics the SFT tests rely on).
TINY_SHAPE: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 32,
    "max_position_embeddings": 32768,
    "tie_word_embeddings": True,
}
# Qwen3's published generation defaults sample; the hf policy must override them for greedy runs.
QWEN3_GENERATION_DEFAULTS = {"do_sample": True, "temperature": 0.6, "top_p": 0.95, "top_k": 20}


def tokenizer_texts(papers: int = 40) -> list[str]:
    from paper_explorer.agent.prompt import system_prompt
    from paper_explorer.corpus import DemoConfig, generate
    from paper_explorer.tools import registry

    corpus = generate(DemoConfig(papers=papers, seed=0))
    actions = [f"```python\n{tool.example}\n```" for tool in registry.tools()]
    return [system_prompt(), *actions, *(p.text for p in corpus.paragraphs()), *(q.text for q in corpus.questions)]


def build_tiny_model(out: Path, seed: int = 0, force: bool = False, tokenizer_from: Path | None = None) -> Path:
    """Write config, random weights, generation config and tokenizer to ``out`` (whole or not at all).
    ``tokenizer_from``: a directory whose tokenizer files to use (the real Qwen3 tokenizer, for
    parity checks on its vocabulary) instead of training a small one."""
    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()
    if out.exists() and any(out.iterdir()) and not force:
        raise AgentError(f"{out}: already exists and is not empty; pass --force to replace it")
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        if tokenizer_from is None:
            build_tokenizer(staging, tokenizer_texts())
        else:
            for name in ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt"):
                if (tokenizer_from / name).exists():
                    shutil.copyfile(tokenizer_from / name, staging / name)
            if not (staging / "tokenizer.json").exists():
                raise AgentError(f"{tokenizer_from}: no tokenizer.json; name a tokenizer directory")
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(staging / "tokenizer.json"))
        im_end, end_of_text = tokenizer.token_to_id(IM_END), tokenizer.token_to_id(END_OF_TEXT)
        config = Qwen3Config(
            vocab_size=tokenizer.get_vocab_size(),
            bos_token_id=end_of_text,
            eos_token_id=im_end,
            pad_token_id=end_of_text,
            **TINY_SHAPE,
        )
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(config)
        model.generation_config = GenerationConfig(
            eos_token_id=[im_end, end_of_text],
            pad_token_id=end_of_text,
            bos_token_id=end_of_text,
            **QWEN3_GENERATION_DEFAULTS,
        )
        model.save_pretrained(staging)
        (staging / "tiny-model.json").write_text(json.dumps({"seed": seed, "shape": TINY_SHAPE}, indent=2))
        if out.exists():
            shutil.rmtree(out)
        files.publish_directory(staging)  # the mode mkdir gives, never through a link put at its name
        staging.rename(out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out
