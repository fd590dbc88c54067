"""One round's update of the adapter: the round's training sequences (``rl.sequences``), their
advantages, the clipped policy-gradient loss with a KL penalty toward the base (``rl.loss``), in
``minibatches`` AdamW steps; then the adapter and the optimizer's state are saved for the next round.

Why not TRL's ``GRPOTrainer``: it owns the generation step (``generate``, or vLLM through its own
client) and scores a completion of one prompt; an episode of ours is a multi-turn conversation
that our loop runs in a sandbox, with tool observations between the turns, each turn's ids and
log-probabilities recorded as they were drawn, rewards from our detectors, and a round that must
resume exactly after ``kill -9``. Its experimental ``rollout_func`` hands one completion per prompt
back; what we need from TRL is its loss, which ``rl.loss`` writes out in twenty lines (and the
tests check against hand-worked groups). The model, the 4-bit base, LoRA and AdamW are the same
transformers, bitsandbytes and peft objects ``explorer train`` uses.

The ratio's denominator: each trained token's log-probability under the sampler at the sampling
temperature. The hf policy records exactly that as it draws (``Sampled``), and it is used as
recorded. A vLLM server records the log-probabilities of its raw logits (temperature 1) whatever it
sampled at: for such a sequence (``old_logprobs_temperature``) they are recomputed with the round's
starting weights - the adapter the server sampled - before the first optimizer step, without
gradients, as TRL's ``GRPOTrainer`` computes ``old_per_token_logps`` when vLLM samples; the ratio
is then 1 at the first step up to numerics (``first_step_ratio_gap_max``). The recorded ones still
measure the trainer against the sampler: ``sampler_logprob_gap`` compares them with the starting
weights' log-probabilities at the temperature they were recorded at, so a trainer whose base is not
the server's shows, whichever temperature the episodes were sampled at.

Exact resume: the update of round N is a function of round N-1's adapter and optimizer state, the
round's sequences (a file) and the seed; it is written to a temporary directory and renamed, so a
kill leaves either no result (the update runs again, to the same bytes) or the whole result.
"""

from __future__ import annotations

import json
import random
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from statistics import fmean

from paper_explorer.corpus.setting_names import setting
from paper_explorer.rl.config import RLConfig
from paper_explorer.rl.loss import token_losses, token_weights
from paper_explorer.rl.sequences import TrainingSequence

ADAPTER = "adapter"
OPTIMIZER = "optimizer.pt"


class UpdateRefused(ValueError):
    """The update cannot go on without writing weights that are wrong (one line: which sequence, why)."""


@dataclass
class UpdateFigures:
    """What one round's update measured, for the round's record."""

    minibatches: int = 0
    sequences: int = 0
    tokens_trained: int = 0
    loss: list[float] = field(default_factory=list)  # per optimizer step
    grad_norm: list[float] = field(default_factory=list)
    ratio_mean: float | None = None
    clip_fraction: float | None = None  # share of trained tokens whose clipped term was taken
    kl: float | None = None  # mean k3 estimate per trained token, toward the base (None: kl_beta 0)
    # mean |log p - log p recorded| at the first step, at the recorded temperature: 0 up to numerics when trainer and sampler agree
    sampler_logprob_gap: float | None = None
    sampler_logprob_gap_max: float | None = None
    first_step_ratio_gap_max: float | None = None  # max |ratio - 1| over the first minibatch's tokens
    old_logprobs_recomputed: int = 0  # sequences whose ratio's denominator was recomputed at the sampling temperature
    seconds: float = 0.0


def torch_seed(seed: int) -> int:
    """``seed`` as torch takes it (an unsigned 64-bit number, as it reads a negative one): any
    episode.seed, and a round's seed + N past 2**64, seeds it instead of overflowing."""
    return seed % 2**64


def train_model(config: RLConfig) -> str:
    """The base weights the update loads: the policy's model (its backend's, for the memory
    reader); with a server sampling (openai), the weights it serves that model from, as its model
    list says (``served_weights``: the served name is no path)."""
    model = getattr(config.policy, "model", None)
    if not model:
        raise ValueError("the policy names no model")
    if config.policy.serving == "openai":
        from paper_explorer.agent.policies.server_sampling import served_weights

        return served_weights(getattr(config.policy, "base_url", None) or [], model, getattr(config.policy, "timeout", 30.0))
    return model


def load_trainable(config: RLConfig, adapter: Path | None):
    """The base as ``explorer train`` loads it (4-bit on CUDA by default), with ``adapter`` made
    trainable, or a new LoRA adapter seeded with ``config.episode.seed``."""
    import torch
    from peft import PeftConfig, PeftModel

    from paper_explorer.agent.models import load_causal_lm
    from paper_explorer.sft.model import made_trainable, with_new_adapter

    quantization = getattr(config.policy, "quantization", "auto")
    loaded = load_causal_lm(train_model(config), quantization, threads=getattr(config.policy, "threads", None))
    model = made_trainable(loaded.model, loaded.quantization == "4bit", config.gradient_checkpointing)
    if adapter is not None:
        # its own dropout off (an SFT adapter keeps train's 0.05): a dropped-out forward pass is not the
        # sampler's, and the ratio and the first step's log-probability gap would measure the noise
        settings = PeftConfig.from_pretrained(str(adapter))
        settings.lora_dropout = config.lora_dropout
        return PeftModel.from_pretrained(model, str(adapter), is_trainable=True, config=settings), loaded.quantization
    torch.manual_seed(torch_seed(config.episode.seed))
    return with_new_adapter(model, config.lora_r, config.lora_alpha, config.lora_dropout, config.target_modules), loaded.quantization


def trained_logits(model, sequence: TrainingSequence):
    """The logits predicting each trained token under ``model`` (float32): the LM head runs on the
    positions before the trained tokens only."""
    import torch

    device = next(model.parameters()).device
    ids = torch.tensor([sequence.input_ids], device=device)
    before = torch.tensor([position - 1 for position in sequence.trained], device=device)
    return model(input_ids=ids, use_cache=False, logits_to_keep=before).logits[0].float()


def logprobs_at(logits, sequence: TrainingSequence, temperature: float):
    """Each trained token's log-probability under ``logits`` (``trained_logits``) divided by ``temperature``."""
    import torch

    targets = torch.tensor([sequence.input_ids[position] for position in sequence.trained], device=logits.device)
    return torch.log_softmax(logits / temperature, dim=-1).gather(1, targets[:, None])[:, 0]


def trained_logprobs(model, sequence: TrainingSequence):
    """Each trained token's log-probability under ``model`` at the sampling temperature."""
    return logprobs_at(trained_logits(model, sequence), sequence, sequence.temperature)


def recomputed_old_logprobs(model, sequences: list[TrainingSequence], first: list[TrainingSequence]):
    """For each sequence whose recorded log-probabilities are not at its sampling temperature
    (``old_logprobs_temperature``): its tokens' log-probabilities at that temperature under
    ``model`` as it is (the round's starting weights), without gradients, by ``id`` of the sequence;
    and, for those in ``first`` (the first minibatch), |the same weights' at the recorded
    temperature - the recorded ones| per token."""
    import torch

    old: dict[int, torch.Tensor] = {}
    gaps: list[float] = []
    in_first = {id(sequence) for sequence in first}
    with torch.no_grad():
        for sequence in sequences:
            if sequence.old_logprobs_temperature is None:
                continue
            logits = trained_logits(model, sequence)
            old[id(sequence)] = logprobs_at(logits, sequence, sequence.temperature)
            if id(sequence) in in_first:
                recorded = torch.tensor(sequence.old_logprobs, device=logits.device)
                gaps += (logprobs_at(logits, sequence, sequence.old_logprobs_temperature) - recorded).abs().tolist()
    return old, gaps


def minibatches(sequences: list[TrainingSequence], count: int, seed: int) -> list[list[TrainingSequence]]:
    """The round's sequences in ``count`` minibatches of whole episodes, in a seeded order."""
    episodes: dict[str, list[TrainingSequence]] = {}
    for sequence in sequences:
        episodes.setdefault(sequence.episode_id, []).append(sequence)
    order = sorted(episodes)
    random.Random(seed).shuffle(order)
    count = max(1, min(count, len(order)))
    return [[s for episode in order[i::count] for s in episodes[episode]] for i in range(count)]


def update(model, optimizer, sequences: list[TrainingSequence], config: RLConfig, seed: int) -> UpdateFigures:
    """The round's optimizer steps on ``model`` (its adapter trainable)."""
    import torch

    started = time.perf_counter()
    figures = UpdateFigures()
    ratios: list[float] = []
    clipped = kls = 0.0
    gaps: list[float] = []
    trainable = [parameter for parameter in model.parameters() if parameter.requires_grad]
    # sequences with nothing to teach (advantage 0, no KL term) cost a forward and backward for nothing
    useful = [s for s in sequences if s.trained and (s.advantage or config.kl_beta)]
    _in_vocabulary(useful, model.get_input_embeddings().num_embeddings)
    model.train()
    batches = minibatches(useful, config.minibatches, seed)
    recomputed, gaps = recomputed_old_logprobs(model, useful, batches[0] if batches else [])  # before the first step
    first_step_ratio_gaps: list[float] = []
    for number, batch in enumerate(batches):
        tokens: dict[str, int] = {}
        for sequence in batch:
            tokens[sequence.episode_id] = tokens.get(sequence.episode_id, 0) + len(sequence.trained)
        weights = token_weights(tokens, config.loss_normalization)
        optimizer.zero_grad(set_to_none=True)
        total = 0.0
        for sequence in batch:
            logps = trained_logprobs(model, sequence)
            old = recomputed.get(id(sequence))
            if old is None:
                old = torch.tensor(sequence.old_logprobs, device=logps.device)
            reference = None
            if config.kl_beta:
                with torch.no_grad(), model.disable_adapter():
                    reference = trained_logprobs(model, sequence)
            losses = token_losses(logps, old, sequence.advantage, config.clip_epsilon, config.kl_beta, reference)
            loss = (losses.loss * weights[sequence.episode_id]).sum()
            if not torch.isfinite(loss):  # one NaN gradient makes every weight NaN, and the next round samples garbage
                raise UpdateRefused(
                    f"{_named(sequence)}: its loss is {float(loss.detach())}; nothing of the update was kept (check its samples' "
                    f"log-probabilities, or lower {setting('learning_rate')})"
                )
            loss.backward()
            total += float(loss.detach())
            ratios += losses.ratio.detach().tolist()
            clipped += float(losses.clipped.sum())
            if losses.kl is not None:
                kls += float(losses.kl.detach().sum())
            if number == 0:
                first_step_ratio_gaps += (losses.ratio.detach() - 1).abs().tolist()
                if sequence.old_logprobs_temperature is None:  # the recorded ones are the ratio's denominator
                    gaps += (logps.detach() - old).abs().tolist()
        norm = torch.nn.utils.clip_grad_norm_(trainable, config.max_grad_norm)
        if not torch.isfinite(norm):
            raise UpdateRefused(
                f"minibatch {number + 1}: its gradient norm is {float(norm)}; nothing of the update was kept (check its samples' "
                f"log-probabilities, or lower {setting('learning_rate')})"
            )
        optimizer.step()
        figures.loss.append(total)
        figures.grad_norm.append(float(norm))
    figures.minibatches, figures.sequences = len(batches), len(useful)
    figures.tokens_trained = len(ratios)
    if ratios:
        figures.ratio_mean = fmean(ratios)
        figures.clip_fraction = clipped / len(ratios)
        figures.kl = kls / len(ratios) if config.kl_beta else None
    if gaps:
        figures.sampler_logprob_gap, figures.sampler_logprob_gap_max = fmean(gaps), max(gaps)
    if first_step_ratio_gaps:
        figures.first_step_ratio_gap_max = max(first_step_ratio_gaps)
    figures.old_logprobs_recomputed = len(recomputed)
    model.eval()
    figures.seconds = time.perf_counter() - started
    return figures


def _named(sequence: TrainingSequence) -> str:
    return f"episode {sequence.episode_id} ({sequence.conversation})"


def _in_vocabulary(sequences: list[TrainingSequence], vocabulary: int) -> None:
    for sequence in sequences:
        if max(sequence.input_ids, default=0) >= vocabulary:
            raise UpdateRefused(f"{_named(sequence)}: token id {max(sequence.input_ids)} is not in the model's {vocabulary} embeddings")


def make_optimizer(model, config: RLConfig, state: Path | None):
    """AdamW over the adapter's weights, with the previous round's moments (``state``: its file) when given."""
    import pickle

    import torch

    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=config.learning_rate)
    if state is not None:
        try:
            optimizer.load_state_dict(torch.load(state, map_location=next(model.parameters()).device, weights_only=True))
        except (OSError, RuntimeError, ValueError, KeyError, pickle.UnpicklingError) as error:
            raise UpdateRefused(f"{state}: not the optimizer state of this adapter ({type(error).__name__})") from None
    return optimizer


def save(model, optimizer, directory: Path) -> None:
    """The adapter (``PeftModel.save_pretrained``: it loads with ``--adapter``) and the optimizer's
    state, written whole or not at all."""
    import torch

    partial = directory.with_name(f".{directory.name}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    model.save_pretrained(str(partial / ADAPTER))
    _in_a_stable_order(partial / ADAPTER / "adapter_config.json")
    torch.save(optimizer.state_dict(), partial / OPTIMIZER)
    shutil.rmtree(directory, ignore_errors=True)
    partial.rename(directory)


def _in_a_stable_order(config: Path) -> None:
    """peft writes target_modules from a set, in an order that changes with the process's hash
    seed: sorted, the same adapter is the same bytes in every process (a resumed run's included)."""
    settings = json.loads(config.read_text())
    if isinstance(settings.get("target_modules"), list):
        settings["target_modules"] = sorted(settings["target_modules"])
    config.write_text(json.dumps(settings, indent=2, sort_keys=True) + "\n")
