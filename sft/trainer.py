"""What training needs from transformers' Trainer: the assistant-only loss, batching, and the hook
that validates each checkpoint. Imported only when training runs (transformers is heavy)."""

from __future__ import annotations

import torch
from transformers import Trainer, TrainerCallback

from sft.dataset import IGNORE
from sft.records import Example
from sft.train import Validator, assistant_loss


class AssistantLossTrainer(Trainer):
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        # The Trainer hands over the assistant-token count of the whole accumulated batch and,
        # for models that take loss kwargs, does not divide by the accumulation steps itself:
        # a sum over that count is the token-weighted mean of the optimizer step.
        if num_items_in_batch is not None:
            total, _, _ = assistant_loss(model, inputs["input_ids"], inputs["labels"], inputs.get("attention_mask"), reduction="sum")
            loss = total / num_items_in_batch
        else:
            loss, _, _ = assistant_loss(model, inputs["input_ids"], inputs["labels"], inputs.get("attention_mask"))
        return (loss, None) if return_outputs else loss


class Collator:
    """Right-pads a batch of examples; padding is never trained (labels -100, attention 0)."""

    def __init__(self, pad: int) -> None:
        self.pad = pad

    def __call__(self, batch: list[Example]) -> dict:
        width = max(len(e.input_ids) for e in batch)
        ids = [e.input_ids + [self.pad] * (width - len(e.input_ids)) for e in batch]
        labels = [e.labels + [IGNORE] * (width - len(e.labels)) for e in batch]
        mask = [[1] * len(e.input_ids) + [0] * (width - len(e.input_ids)) for e in batch]
        return {"input_ids": torch.tensor(ids), "labels": torch.tensor(labels), "attention_mask": torch.tensor(mask)}


class ValidationCallback(TrainerCallback):
    """Validates at the end of each epoch (and every ``eval_steps``), and records it with the checkpoint."""

    def __init__(self, validator: Validator, eval_steps: int | None) -> None:
        self.validator = validator
        self.eval_steps = eval_steps
        self.pending: dict | None = None

    def on_step_end(self, args, state, control, **kwargs):
        if self.eval_steps and state.global_step % self.eval_steps == 0:
            self.validator.write(self.validator.run(state.global_step, state.epoch))

    def on_epoch_end(self, args, state, control, **kwargs):
        self.pending = self.validator.run(state.global_step, state.epoch)

    def on_save(self, args, state, control, **kwargs):
        record = self.pending or self.validator.run(state.global_step, state.epoch)
        self.pending = None
        self.validator.checkpoint(args.output_dir, state.global_step, record)
