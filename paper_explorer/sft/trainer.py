"""What training needs from transformers' Trainer: the assistant-only loss, batching, the hook
that validates and completes each checkpoint (and stops on Ctrl-C), and the progress display.
Imported only when training runs (transformers is heavy), by ``sft.train``; it imports nothing
that imports it."""

from __future__ import annotations

import datetime
import sys
import time

import torch
from tqdm import tqdm
from transformers import PrinterCallback, Trainer, TrainerCallback

from paper_explorer.sft.dataset import IGNORE
from paper_explorer.sft.interrupts import Interrupt
from paper_explorer.sft.model import assistant_loss
from paper_explorer.sft.records import Example, ValidationRecord
from paper_explorer.sft.validation import Validator, scalars


class AssistantLossTrainer(Trainer):
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        # The Trainer hands over the assistant-token count of the whole accumulated batch and,
        # for models that take loss kwargs, does not divide by the accumulation steps itself:
        # a sum over that count is the token-weighted mean of the optimizer step.
        if num_items_in_batch is not None:
            total, _, _ = assistant_loss(model, inputs["input_ids"], inputs["labels"], inputs.get("attention_mask"), reduction="sum")
            loss = total / num_items_in_batch * self.token_average_scale()
        else:
            loss, _, _ = assistant_loss(model, inputs["input_ids"], inputs["labels"], inputs.get("attention_mask"))
        return (loss, None) if return_outputs else loss

    def token_average_scale(self) -> int:
        """Trainer.compute_loss's own compensation, for the same case: with average_tokens_across_devices
        the count is summed over every process, while DDP averages the gradients (and the logged
        loss is averaged) over them, so each process's share is multiplied back by their number."""
        if not (self.args.average_tokens_across_devices and (self.model_accepts_loss_kwargs or self.compute_loss_func)):
            return 1
        return self.args.n_gpu if self.args.n_gpu > 1 else self.accelerator.num_processes // self.get_tp_size()


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


def barrier() -> None:
    """Wait for every process of the group (a no-op in a single process)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.barrier()


def anyone(flag: bool, device) -> bool:
    """True on every process when it is true on any: Ctrl-C may reach the processes between
    different steps, and they must stop at the same one or the next collective waits forever."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()) or torch.distributed.get_world_size() == 1:
        return flag
    value = torch.tensor([int(flag)], device=device)
    torch.distributed.all_reduce(value, op=torch.distributed.ReduceOp.MAX)
    return bool(value.item())


class ValidationCallback(TrainerCallback):
    """Validates every checkpoint (and every ``eval_steps`` steps) on the main process while the
    others wait, logs the figures through the Trainer beside the loss (so every reporter gets
    them), completes each checkpoint with its manifest, and turns a Ctrl-C into a checkpoint at
    the end of the step."""

    def __init__(self, validator: Validator, eval_steps: int | None, log_scalars, interrupt: Interrupt, main: bool) -> None:
        self.validator, self.eval_steps, self.log_scalars = validator, eval_steps, log_scalars
        self.interrupt, self.main = interrupt, main
        self.validated: dict[int, ValidationRecord] = {}
        self.saved_step: int | None = None
        self.first_step = 0  # the step this session started from (a resumed checkpoint's)
        self.stopped_step: int | None = None  # where Ctrl-C stopped training
        self.unscheduled = False  # ... at a step that saves no checkpoint of its own: it is saved unvalidated

    def on_train_begin(self, args, state, control, **kwargs):
        self.first_step = state.global_step

    def validate(self, state) -> ValidationRecord:
        """Once per step: a step validated for eval_steps and then checkpointed is not run twice."""
        if state.global_step not in self.validated:
            record = self.validator.run(state.global_step, state.epoch)
            self.validated[state.global_step] = record
            self.log_scalars(scalars(record))
        return self.validated[state.global_step]

    def on_step_end(self, args, state, control, **kwargs):
        # The last step ends training anyway: Ctrl-C there lets its checkpoint be validated. So does a
        # step that saves one in any case (a save_steps multiple, set by the Trainer's own callback
        # before this one, or an epoch's end): it is validated as it would have been without Ctrl-C.
        if state.global_step < state.max_steps and anyone(self.interrupt.requested, args.device):
            self.unscheduled = not (control.should_save or float(state.epoch or 0).is_integer())
            control.should_save = control.should_training_stop = True
            self.stopped_step = state.global_step
        elif self.eval_steps and state.global_step % self.eval_steps == 0 and not control.should_save and self.main:
            self.validator.write(self.validate(state))

    def on_epoch_end(self, args, state, control, **kwargs):
        # A checkpoint at every epoch end, once: with save_steps the Trainer saves by steps only, and
        # it would save a step twice when the epoch ends on a save step or after a Ctrl-C.
        control.should_save = state.global_step != self.saved_step

    def on_save(self, args, state, control, **kwargs):
        barrier()  # every process has written its part (rng_state_N.pth) before the manifest hashes the files
        if self.main:
            interrupted = state.global_step == self.stopped_step and self.unscheduled
            record = None if interrupted else self.validate(state)
            self.validator.checkpoint(args.output_dir, state.global_step, record, interrupted)
        barrier()
        self.saved_step = state.global_step


class Progress(TrainerCallback):
    """Loss, input tokens per second (every process's, padding left out) and the time left: a bar on
    a terminal, one plain line per logged step otherwise (CI logs). Replaces the Trainer's printer
    of raw dicts; only the main process shows it."""

    replaces = PrinterCallback

    def __init__(self, terminal: bool) -> None:
        self.terminal = terminal
        self.bar = None

    def on_train_begin(self, args, state, control, **kwargs):
        self.started, self.first_step, self.first_tokens = time.perf_counter(), state.global_step, state.num_input_tokens_seen
        if self.terminal and state.is_world_process_zero:
            self.bar = tqdm(total=state.max_steps, initial=state.global_step, unit="step", dynamic_ncols=True, file=sys.stderr)

    def on_step_end(self, args, state, control, **kwargs):
        if self.bar is not None:
            self.bar.update(state.global_step - self.bar.n)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or "loss" not in (logs or {}):
            return
        elapsed = time.perf_counter() - self.started
        steps, tokens = state.global_step - self.first_step, state.num_input_tokens_seen - self.first_tokens
        speed = tokens / elapsed if elapsed > 0 else 0.0
        if self.bar is not None:  # tqdm shows the steps, their rate and the time left itself
            self.bar.set_postfix_str(f"loss {logs['loss']:.4f}, {speed:,.0f} input tok/s")
            return
        left = (state.max_steps - state.global_step) * elapsed / steps if steps else None
        eta = "?" if left is None else str(datetime.timedelta(seconds=round(left)))
        print(
            f"step {state.global_step}/{state.max_steps} | epoch {state.epoch or 0:.2f} | loss {logs['loss']:.4f} | "
            f"{speed:,.0f} input tokens/s | ETA {eta}",
            file=sys.stderr,
            flush=True,
        )

    def on_train_end(self, args, state, control, **kwargs):
        if self.bar is not None:
            self.bar.close()
            self.bar = None
