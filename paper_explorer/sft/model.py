"""The model being trained: the base as it is served, made trainable with LoRA, and the loss on
assistant tokens that training and validation both compute. torch and peft are imported inside
the functions: importing this module loads nothing heavy."""

from __future__ import annotations

from paper_explorer.agent.models import load_causal_lm
from paper_explorer.sft.config import TrainConfig
from paper_explorer.sft.dataset import IGNORE


def load_model(config: TrainConfig):
    """The base as ``agent.models.load_causal_lm`` loads it for serving, made trainable, with LoRA."""
    loaded = load_causal_lm(config.model, config.quantization, threads=config.threads)
    quantize = loaded.quantization == "4bit"
    model = made_trainable(loaded.model, quantize, config.gradient_checkpointing)
    return with_new_adapter(model, config.lora_r, config.lora_alpha, config.lora_dropout, config.target_modules), quantize


def with_new_adapter(model, r: int, alpha: int, dropout: float, target_modules: list[str]):
    """``model`` with a new LoRA adapter on ``target_modules`` (explorer train's, and explorer rl's without a starting one)."""
    from peft import LoraConfig, get_peft_model

    lora = LoraConfig(task_type="CAUSAL_LM", r=r, lora_alpha=alpha, lora_dropout=dropout, target_modules=target_modules)
    return get_peft_model(model, lora)


def made_trainable(model, quantized: bool, gradient_checkpointing: bool):
    """The loaded base ready for an adapter's gradients: a 4-bit one through peft's
    ``prepare_model_for_kbit_training``, with activation checkpointing when asked."""
    from peft import prepare_model_for_kbit_training

    if quantized:
        return prepare_model_for_kbit_training(
            model, use_gradient_checkpointing=gradient_checkpointing, gradient_checkpointing_kwargs={"use_reentrant": False}
        )
    if gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.enable_input_require_grads()
    return model


def assistant_loss(model, input_ids, labels, attention_mask=None, reduction: str = "mean"):
    """Cross-entropy at the labelled (assistant) positions only: the LM head runs on those hidden
    states alone (``logits_to_keep`` as a mask) instead of on all of them. Equal to the usual shifted
    loss. It calls the model's own forward, so under several processes DDP synchronises the gradients."""
    import torch.nn.functional as F

    targets = labels[:, 1:]
    keep = targets != IGNORE
    positions = F.pad(keep, (0, 1))  # the hidden state at p predicts token p + 1; the last one predicts nothing
    logits = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False, logits_to_keep=positions).logits
    logits = logits.reshape(-1, logits.shape[-1]).float()
    if logits.shape[0] == 0:
        return logits.sum() * 0.0, logits, targets[keep]
    loss = F.cross_entropy(logits, targets[keep], reduction=reduction)
    return loss, logits, targets[keep]
