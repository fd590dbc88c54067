"""A round's samples -> what its update trains: each episode's reward with its parts
(``rl.rewards``), its advantage within its question's group (``rl.advantages``), and its training
sequences (``rl.sequences``) carrying that advantage."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel

from paper_explorer.corpus.jsonl import JsonLinesError, read_records, write_records
from paper_explorer.rl.advantages import group_advantages
from paper_explorer.rl.config import RLConfig
from paper_explorer.rl.records import EpisodeReward
from paper_explorer.rl.rewards import reward
from paper_explorer.rl.sequences import SequenceRefused, TrainingSequence, sequences_of
from paper_explorer.sft.errors import TrainingError

M = TypeVar("M", bound=BaseModel)

REWARDS = "rewards.jsonl"
BATCH = "batch.jsonl"


def round_batch(directory: Path, samples, config: RLConfig) -> tuple[list[EpisodeReward], list[TrainingSequence]]:
    """Each episode's reward and advantage (``rewards.jsonl``), and the sequences to train
    (``batch.jsonl``): computed from the samples, written once; on a resume, files already there
    must be what the samples give (an edited line is refused, never trained)."""
    rewards, batch = batch_of(samples, config)
    rewards_path, batch_path = directory / REWARDS, directory / BATCH
    if rewards_path.exists() and batch_path.exists():
        _same_as_written(batch_path, batch, read_lines(batch_path, TrainingSequence, "training sequence", directory))
        _same_as_written(rewards_path, rewards, read_lines(rewards_path, EpisodeReward, "episode reward", directory))
        return rewards, batch
    write_records(batch_path, batch)
    write_records(rewards_path, rewards)
    return rewards, batch


def batch_of(samples, config: RLConfig) -> tuple[list[EpisodeReward], list[TrainingSequence]]:
    """The rewards and training sequences of a round's samples (an eval run), in the samples' order."""
    trajectories = {trajectory.episode_id: trajectory for trajectory in samples.trajectories}
    groups: dict[str | None, list] = defaultdict(list)
    for score in samples.scores:
        groups[score.question_id].append(score)
    rewards: list[EpisodeReward] = []
    batch: list[TrainingSequence] = []
    for scores in groups.values():
        earned = [reward(score, config.reward) for score in scores]
        advantages = group_advantages([r.total for r in earned], config.advantage, config.scale_rewards)
        for score, got, advantage in zip(scores, earned, advantages):
            trajectory = trajectories[score.episode_id]
            try:
                sequences = sequences_of(trajectory)
            except SequenceRefused as error:
                raise TrainingError(f"{samples.directory}: {error}") from None
            for sequence in sequences:
                sequence.advantage = advantage
            batch += sequences
            rewards.append(
                EpisodeReward(
                    episode_id=score.episode_id,
                    question_id=score.question_id,
                    sample=score.sample,
                    status=score.status,
                    reward=got.total,
                    parts=got.parts,
                    advantage=advantage,
                    sampled_tokens=sum(len(s.served.sampled.ids) for s in _served_calls(trajectory) if s.served and s.served.sampled),
                )
            )
    return rewards, batch


def _same_as_written(path: Path, computed: list[M], written: list[M]) -> None:
    again = "remove it to compute it again from the samples"
    for number, (ours, theirs) in enumerate(zip(computed, written), 1):
        if ours != theirs:
            raise TrainingError(f"{path}:{number}: is not what the round's samples give (edited after it was written?); {again}")
    if len(computed) != len(written):
        raise TrainingError(f"{path}: holds {len(written)} lines, the round's samples give {len(computed)}; {again}")


def _served_calls(trajectory):
    """Every model call of an episode that has a served record: its steps, or the memory reader's calls."""
    for step in trajectory.steps:
        reading = step.policy_info.reading if step.policy_info else None
        if reading is None:
            yield step
            continue
        yield from reading.updates
        if reading.answer is not None:
            yield reading.answer


def read_lines(path: Path, model: type[M], what: str, directory: Path) -> list[M]:
    """A JSON-lines file of the round; anything wrong is one TrainingError line."""
    try:
        return read_records(path, model, what=what, inside=directory)
    except JsonLinesError as error:
        raise TrainingError(f"{error}; remove it to run that stage again") from None
