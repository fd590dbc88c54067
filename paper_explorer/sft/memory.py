"""``explorer train --dry-run``: the estimated peak GPU memory of a QLoRA run, before any download
of weights or any GPU time, from the model's config, the sequence length and the LoRA settings.

It is an estimate (a sum of the big terms, plus a fixed allowance for the CUDA context and
allocator fragmentation); bench/gpu_check.py --train measures the real peak to compare with.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import paper_explorer.corpus.files as files
from paper_explorer.sft.errors import TrainingError

GIB = 2**30
# Qwen/Qwen3-8B config.json as published: used when the config cannot be fetched (offline).
QWEN3_8B = {
    "vocab_size": 151936,
    "hidden_size": 4096,
    "intermediate_size": 12288,
    "num_hidden_layers": 36,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "max_position_embeddings": 40960,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "tie_word_embeddings": False,
}
NF4_BYTES_PER_PARAM = 0.5 + 1 / 64 + 4 / (64 * 256)  # 4-bit values, 8-bit absmax per 64 (double quant), fp32 per 256 blocks
CUDA_OVERHEAD_GIB = 1.0


@dataclass(frozen=True)
class Shape:
    vocab: int
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    tied: bool

    @classmethod
    def from_config(cls, config: dict) -> Shape:
        """The shape a config.json gives; a field the estimate uses that is missing, not a positive
        whole number, or past any real model's size is a ValueError naming the field (a config of
        0 heads divided by zero; a string, or a negative, gave a traceback or nonsense)."""
        if not isinstance(config, dict):
            raise ValueError("not a JSON object")
        heads = _dimension(config, "num_attention_heads")
        hidden = _dimension(config, "hidden_size")
        head_dim = _dimension(config, "head_dim") if config.get("head_dim") is not None else hidden // heads
        if head_dim < 1:
            raise ValueError(f"hidden_size {hidden} is smaller than num_attention_heads {heads}")
        return cls(
            _dimension(config, "vocab_size"),
            hidden,
            _dimension(config, "intermediate_size"),
            _dimension(config, "num_hidden_layers"),
            heads,
            _dimension(config, "num_key_value_heads") if config.get("num_key_value_heads") is not None else heads,
            head_dim,
            bool(config.get("tie_word_embeddings")),
        )

    def projections(self) -> dict[str, tuple[int, int]]:
        """(in, out) features of each linear projection in one decoder layer."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        return {
            "q_proj": (self.hidden, q),
            "k_proj": (self.hidden, kv),
            "v_proj": (self.hidden, kv),
            "o_proj": (q, self.hidden),
            "gate_proj": (self.hidden, self.intermediate),
            "up_proj": (self.hidden, self.intermediate),
            "down_proj": (self.intermediate, self.hidden),
        }


MAX_DIMENSION = 1 << 24  # past any real model's width, vocabulary or depth (16 million)


def _dimension(config: dict, field: str) -> int:
    value = config.get(field)
    if value is None:
        raise ValueError(f"no {field}")
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_DIMENSION:
        raise ValueError(f"{field} is {repr(value)[:40]}, not a whole number from 1 to {MAX_DIMENSION:,}")
    return value


def estimate(
    shape: Shape,
    max_length: int,
    lora_r: int,
    target_modules: list[str],
    quantized: bool = True,
    gradient_checkpointing: bool = True,
    trained_share: float = 1.0,
    batch_size: int = 1,
) -> dict:
    """Peak memory terms in GiB for one QLoRA training step on a sequence of ``max_length`` tokens."""
    projections = shape.projections()
    linear = shape.layers * sum(i * o for i, o in projections.values())
    embeddings = shape.vocab * shape.hidden * (1 if shape.tied else 2)  # embeddings and lm_head are not quantized
    # peft's prepare_model_for_kbit_training casts the unquantized weights to fp32
    weights = linear * (NF4_BYTES_PER_PARAM if quantized else 2) + embeddings * (4 if quantized else 2)
    lora = shape.layers * sum(lora_r * (i + o) for name, (i, o) in projections.items() if name in target_modules)
    lora_state = lora * (4 + 4 + 8)  # fp32 weights, gradients, Adam moments
    tokens = max_length * batch_size
    if gradient_checkpointing:  # each layer's input is kept; one layer is recomputed at a time in backward
        kept = shape.layers * tokens * shape.hidden * 2
        layer = tokens * (4 * shape.hidden + 2 * shape.heads * shape.head_dim + 3 * shape.intermediate) * 2 * 2
    else:
        kept = shape.layers * tokens * (4 * shape.hidden + 2 * shape.heads * shape.head_dim + 3 * shape.intermediate) * 2
        layer = 0
    logits = tokens * trained_share * shape.vocab * (2 + 4 + 4)  # bf16 logits, fp32 for the loss, their gradient
    terms = {
        "weights": weights / GIB,
        "lora_and_optimizer": lora_state / GIB,
        "activations": (kept + layer) / GIB,
        "logits": logits / GIB,
        "cuda_overhead": CUDA_OVERHEAD_GIB,
    }
    terms["total"] = sum(terms.values())
    terms["lora_parameters"] = lora
    return terms


L4_BF16_TFLOPS = 121.0  # NVIDIA L4 dense bf16 tensor throughput
ASSUMED_UTILISATION = 0.3  # a 4-bit base dequantised on the fly, gradient checkpointing: a modest share of peak


def tokens_per_second(shape: Shape, tflops: float = L4_BF16_TFLOPS, utilisation: float = ASSUMED_UTILISATION) -> float:
    """Training throughput estimate: forward (2N), recomputation under checkpointing (2N) and the
    backward pass through frozen weights (2N) - 6N FLOPs per token, N the base's parameters."""
    parameters = shape.layers * sum(i * o for i, o in shape.projections().values()) + shape.vocab * shape.hidden
    return tflops * 1e12 * utilisation / (6 * parameters)


def model_shape(model: str) -> tuple[Shape, str]:
    """The architecture of ``model`` from its config.json, and where it came from; Qwen/Qwen3-8B's
    published one when offline."""
    local = Path(model) / "config.json"
    if local.exists():
        try:
            config = files.parse_json(files.read_bytes(local, limit=files.DOCUMENT_BYTES, what="model config"), local)
            return Shape.from_config(config), str(local)
        except (files.FileRefused, ValueError, KeyError, TypeError, AttributeError) as error:  # ValueError: invalid JSON
            raise TrainingError(f"{local}: not a model's config.json ({str(error).splitlines()[0]})") from None
    if model == "Qwen/Qwen3-8B":  # the default: no network needed to plan a run
        return Shape.from_config(QWEN3_8B), "Qwen/Qwen3-8B's published config.json (built in)"
    try:
        from transformers import AutoConfig

        from paper_explorer.agent.models import hub_retries_said_once

        with hub_retries_said_once(model):
            return Shape.from_config(AutoConfig.from_pretrained(model).to_dict()), f"{model} (hub config)"
    except Exception as error:  # offline, or no such repository
        raise TrainingError(f"{model}: cannot read its config ({str(error).splitlines()[0]}); name a local model directory") from None
