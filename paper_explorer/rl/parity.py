"""An rl run against the episodes it sampled: the ids trained are the ids sampled.

``explorer check-parity --rl OUT --tokenizer DIR`` checks, for every round that trained:

* every draw recorded in the round's samples decodes to the text the episode acted on (the action
  the sandbox ran, the memory the reader kept, its answer): the ids are what the model wrote;
* every sequence of ``batch.jsonl`` (what the update read) is, token by token, the sequence rebuilt
  from those recorded prompt and draw ids (``rl.sequences``), with the same trained positions, the
  sampler's log-probabilities and its episode's advantage from ``rewards.jsonl``; and nothing is
  trained that was not sampled, nor left out.
"""

from __future__ import annotations

from pathlib import Path

from paper_explorer.agent.mismatch import Mismatch
from paper_explorer.agent.parity import differing
from paper_explorer.agent.renderer import ChatRenderer
from paper_explorer.rl.batch import BATCH, REWARDS, read_lines
from paper_explorer.rl.records import EpisodeReward
from paper_explorer.rl.run import SAMPLES
from paper_explorer.rl.sequences import SequenceRefused, TrainingSequence, sequences_of


def check_rl_run(out: Path, renderer: ChatRenderer) -> tuple[Mismatch | None, dict[str, int]]:
    """The first mismatch (None: parity holds) and what was compared."""
    from paper_explorer.evaluation.run_directory import Run

    counted = {"rounds": 0, "sequences": 0, "tokens": 0, "draws": 0}
    number = 1
    # a round killed between its two files has trained nothing yet: it is not checked
    while (out / f"round-{number}" / BATCH).exists() and (out / f"round-{number}" / REWARDS).exists():
        directory = out / f"round-{number}"
        samples = Run.load(directory / SAMPLES)
        advantages = {r.episode_id: r.advantage for r in read_lines(directory / REWARDS, EpisodeReward, "episode reward", directory)}
        trained = read_lines(directory / BATCH, TrainingSequence, "training sequence", directory)
        rebuilt: list[TrainingSequence] = []
        for trajectory in samples.trajectories:
            mismatch = _draws_are_the_text(trajectory, renderer, counted)
            if mismatch is not None:
                return mismatch, counted
            try:
                sequences = sequences_of(trajectory)
            except SequenceRefused as error:
                return Mismatch(f"{directory / SAMPLES}", str(error)), counted
            if trajectory.episode_id not in advantages:
                return Mismatch(f"{directory / REWARDS}", f"episode {trajectory.episode_id} has no reward"), counted
            for sequence in sequences:
                sequence.advantage = advantages[trajectory.episode_id]
            rebuilt += sequences
        if len(trained) != len(rebuilt):
            return Mismatch(f"{directory / BATCH}", f"{len(trained)} sequences trained, {len(rebuilt)} rebuilt from the samples"), counted
        for position, (ours, theirs) in enumerate(zip(trained, rebuilt), 1):
            where = f"{directory / BATCH}:{position} (episode {ours.episode_id}, {ours.conversation})"
            mismatch = _same(where, ours, theirs, renderer)
            if mismatch is not None:
                return mismatch, counted
            counted["sequences"] += 1
            counted["tokens"] += len(ours.trained)
        counted["rounds"] += 1
        number += 1
    return None, counted


def _same(where: str, ours: TrainingSequence, theirs: TrainingSequence, renderer: ChatRenderer) -> Mismatch | None:
    if (ours.episode_id, ours.conversation, ours.steps) != (theirs.episode_id, theirs.conversation, theirs.steps):
        return Mismatch(where, f"is not the sequence rebuilt at its place (episode {theirs.episode_id}, {theirs.conversation})")
    mismatch = differing(where, "the trained input_ids differ from the ids served and sampled", ours.input_ids, theirs.input_ids, renderer)
    if mismatch is not None:
        return mismatch
    if ours.trained != theirs.trained:
        return Mismatch(where, "it trains other positions than the sampled ones")
    if ours.old_logprobs != theirs.old_logprobs:
        return Mismatch(where, "its old log-probabilities are not the sampler's")
    if ours.old_logprobs_temperature != theirs.old_logprobs_temperature:
        return Mismatch(where, "its old log-probabilities' temperature is not the one the sampler recorded")
    if ours.temperature != theirs.temperature or ours.advantage != theirs.advantage:
        return Mismatch(where, "its temperature or advantage is not its episode's")
    return None


def _draws_are_the_text(trajectory, renderer: ChatRenderer, counted: dict[str, int]) -> Mismatch | None:
    """Each recorded draw decodes to what the episode acted on (the stop token that ended it aside)."""
    for step in trajectory.steps:
        reading = step.policy_info.reading if step.policy_info else None
        if reading is not None:
            calls = [
                (f"memory update {n}", u.served, u.generation, u.written if u.written is not None else u.memory or "")
                for n, u in enumerate(reading.updates, 1)
            ]
            if reading.answer is not None:
                calls.append(("memory answer", reading.answer.served, reading.answer.generation, reading.answer.text))
        elif step.reasoning is None:
            calls = [(f"step {step.index + 1}", step.served, step.generation, step.action_text)]
        else:
            calls = []  # thinking mode: the reply is split into its think block and action; the prompt checks cover it
        for what, served, generation, text in calls:
            sampled = served.sampled if served is not None else None
            if sampled is None:
                continue
            # its last token is the stop token, unless it was cut: at its cap, or at the room its context left (a server's "length")
            stopped = generation is not None and not generation.hit_cap and generation.finish_reason != "length" and sampled.ids
            ids = sampled.ids[:-1] if stopped else sampled.ids
            if renderer.decode(ids) != text:
                return Mismatch(f"episode {trajectory.episode_id} {what}", "its sampled ids do not decode to the text it acted on")
            counted["draws"] += 1
    return None
