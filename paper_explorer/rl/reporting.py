"""Each finished round of an rl run, to TensorBoard or Weights & Biases (``--report-to``), under
the names ``explorer train`` uses for its validation figures (``eval/...``) and ``rl/...`` beside them."""

from __future__ import annotations

import os
from pathlib import Path
from statistics import fmean
from typing import Any

from paper_explorer.rl.records import RoundRecord


class Reporter:
    """Each finished round's figures to TensorBoard (OUT/runs) or Weights & Biases, at step N."""

    def __init__(self, kind: str, out: Path) -> None:
        self.kind, self.out = kind, out
        self.writer: Any = None

    def __enter__(self):
        return self

    def _opened(self):
        """The writer, made when the first round is done: a start that fails before then leaves no
        event file (or wandb run) behind in OUT, which would keep the run's settings from being forgotten."""
        if self.writer is None and self.kind == "tensorboard":
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(log_dir=os.environ.get("TENSORBOARD_LOGGING_DIR") or str(self.out / "runs"))
        elif self.writer is None and self.kind == "wandb":
            import wandb

            self.writer = wandb.init(project=os.environ.get("WANDB_PROJECT", "paper-explorer"), name=self.out.name, dir=str(self.out))
        return self.writer

    def __call__(self, record: RoundRecord) -> None:
        if self.kind == "none":
            return
        writer, values = self._opened(), scalars(record)
        if self.kind == "tensorboard":
            for name, value in values.items():
                writer.add_scalar(name, value, record.round)
            writer.flush()
        else:
            writer.log(values, step=record.round)

    def __exit__(self, *exc) -> None:
        if self.writer is not None:
            self.writer.close() if self.kind == "tensorboard" else self.writer.finish()


def scalars(record: RoundRecord) -> dict[str, float]:
    """A round's figures as reporters take them (rl/..., eval/... as explorer train names them)."""
    values = {
        "rl/reward_mean": record.reward_mean,
        "rl/reward_std": record.reward_std,
        "rl/advantage_abs_mean": record.advantage_abs_mean,
        "rl/groups_without_signal": record.groups_without_signal,
        "rl/direct_submit_rate": record.direct_submit_rate,
        "rl/sampled_tokens": record.sampled_tokens,
        "rl/tokens_trained": record.update.tokens_trained,
        "rl/steps_per_episode": record.steps_per_episode,
    }
    values |= {f"rl/reward_part/{name}": value for name, value in record.reward_parts.items()}
    values |= {f"rl/detector/{name}": value for name, value in record.detector_rates.items()}
    for name in ("kl", "clip_fraction", "ratio_mean", "sampler_logprob_gap"):
        value = getattr(record.update, name)
        if value is not None:
            values[f"rl/{name}"] = value
    if record.update.loss:
        values["rl/loss"] = fmean(record.update.loss)
    seen = record.validation
    for name in ("answer_f1", "exact_match", "direct_submit_rate", "format_error_rate"):
        value = getattr(seen, name)
        if value is not None:
            values[f"eval/{name}"] = value
    return values


def round_line(record: RoundRecord) -> str:
    """The line a person sees when a round is done."""
    seen = record.validation
    kl = "-" if record.update.kl is None else f"{record.update.kl:.4f}"
    clip = "-" if record.update.clip_fraction is None else f"{record.update.clip_fraction:.1%}"
    f1 = "-" if seen.answer_f1 is None else f"{seen.answer_f1:.3f}"
    rate = "-" if seen.direct_submit_rate is None else f"{seen.direct_submit_rate:.0%}"
    return (
        f"round {record.round}: reward {record.reward_mean:+.3f} over {record.episodes} episodes "
        f"({record.groups_without_signal} of {record.groups} groups without signal), direct-submit {record.direct_submit_rate:.0%}; "
        f"{record.update.tokens_trained} tokens trained, KL {kl}, clipped {clip}; validation answer F1 {f1}, direct-submit {rate}"
    )
