"""Trajectories -> the token sequences an RL update trains: exactly the ids the sampler was served
and the ids it drew, with the sampler's log-probabilities, never a re-rendering of the text.

* The code agent: each step's prompt is rebuilt from its recorded ids (``Served.ids``), and its
  reply is the recorded draw (``Served.sampled``). Consecutive steps share one sequence when the
  next prompt starts with the sequence so far (the usual case: the template closes the turn and
  appends the observation); where it does not (the template re-encodes the action differently),
  the step starts a sequence of its own. Either way every token fed is one the sampler saw before
  the token it trains, and only drawn tokens are trained: the prompt, the observations and tokens
  written for the model (a thinking budget's ``</think>``) are not.
* The memory reader (MemAgent's multi-conversation form): each memory update and the final answer
  is a conversation of its own, its recorded prompt and its draw, all with the episode's advantage.

A sequence's ``temperature`` is the one its episode was sampled at (the policy's, as
``trajectory.policy.settings`` records it): the update computes the trainer's log-probabilities at
it. ``old_logprobs`` are the draw's, as recorded (``Sampled.logprobs``), at the temperature the
sampler computed them at: the hf policy's are at the sampling temperature; a vLLM server's are, by
default, of the raw logits (temperature 1) whatever it sampled at. Where they differ the sequence
says so (``old_logprobs_temperature``) and the update recomputes the ratio's denominator with the
round's starting weights (``rl.update``); the recorded ones stay, for check-parity and to measure
the trainer against the sampler.

``explorer check-parity --rl`` rebuilds these sequences from a round's trajectories and compares
them token by token with what the round trained (``rl.parity``).
"""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field, model_validator

from paper_explorer.agent.served import AlteredRecord, ids_sha256, served_prompts
from paper_explorer.agent.trajectory import Sampled, Served, Trajectory


class SequenceRefused(ValueError):
    """A trajectory that cannot be trained on exactly (one line: which episode, which step, why)."""


class TrainingSequence(BaseModel):
    """One sequence of a round's update: ``input_ids`` fed as one, the positions whose token was
    drawn by the sampler (each predicted from the position before it) with the sampler's
    log-probabilities, and the advantage of the episode it comes from."""

    model_config = ConfigDict(extra="forbid")

    episode_id: str
    question_id: str | None
    sample: int
    conversation: str  # "actions" (the code agent's steps), "update N" or "answer" (the memory reader's calls)
    steps: list[int]  # the steps (or the memory reader's calls, in order) it holds
    input_ids: list[int]
    trained: list[int]  # positions in input_ids of the drawn tokens it trains
    old_logprobs: list[float]  # the sampler's, one per trained position, as recorded
    temperature: float = Field(gt=0, allow_inf_nan=False)  # the sampling temperature: the trainer's log-probabilities are at it
    # the temperature old_logprobs are at, where not ``temperature`` (a vLLM server's raw log-probabilities: 1)
    old_logprobs_temperature: float | None = Field(None, gt=0, allow_inf_nan=False)
    advantage: float = Field(0.0, allow_inf_nan=False)

    @model_validator(mode="after")
    def _trainable(self) -> TrainingSequence:
        """What the update can train as it is: each trained token predicted from one before it, and
        its sampler's log-probability beside it (a line edited by hand is refused here, not in torch)."""
        if any(token < 0 for token in self.input_ids):
            raise ValueError("a token id below 0")
        if any(not 1 <= position < len(self.input_ids) for position in self.trained):
            raise ValueError(f"a trained position outside 1..{len(self.input_ids) - 1} (the first token has nothing before it)")
        if any(later <= earlier for earlier, later in zip(self.trained, self.trained[1:])):
            raise ValueError("trained positions out of order or repeated")
        if len(self.old_logprobs) != len(self.trained):
            raise ValueError(f"{len(self.trained)} trained positions but {len(self.old_logprobs)} old log-probabilities")
        if not all(math.isfinite(logprob) and logprob <= 0 for logprob in self.old_logprobs):
            raise ValueError("an old log-probability that is not a finite number at most 0")
        return self


def sequences_of(trajectory: Trajectory) -> list[TrainingSequence]:
    """The training sequences of one episode (its advantage left at 0, set by the round)."""
    reader = [step.policy_info.reading for step in trajectory.steps if step.policy_info and step.policy_info.reading]
    if reader:
        return _reader_sequences(trajectory, reader)
    return _action_sequences(trajectory)


def _where(trajectory: Trajectory, what: str) -> str:
    return f"episode {trajectory.episode_id} {what}"


def _recorded(trajectory: Trajectory, served: Served | None, what: str) -> Sampled:
    if served is None or served.sampled is None:
        raise SequenceRefused(f"{_where(trajectory, what)}: no sampled ids recorded; sample with episode.record_sampled (explorer rl does)")
    return served.sampled


def sampling_temperature(trajectory: Trajectory) -> float:
    """The temperature the episode's policy sampled at, as its settings record it (hf, openai and
    the memory reader write their decoding's ``temperature`` among them)."""
    value = trajectory.policy.settings.get("temperature")
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
        raise SequenceRefused(
            f"{_where(trajectory, 'was')} not sampled: its policy records temperature {value!r}; explorer rl trains episodes drawn above 0"
        )
    return float(value)


def _old_temperature(sampled: Sampled, temperature: float) -> float | None:
    return None if sampled.temperature == temperature else sampled.temperature


def _action_sequences(trajectory: Trajectory) -> list[TrainingSequence]:
    try:
        prompts = served_prompts(trajectory.steps)
    except AlteredRecord as error:
        raise SequenceRefused(f"{_where(trajectory, 'has')} altered prompt ids: {error}") from None
    sequences: list[TrainingSequence] = []
    current: TrainingSequence | None = None
    temperature = sampling_temperature(trajectory) if trajectory.steps else 1.0
    for step, prompt in zip(trajectory.steps, prompts):
        what = f"step {step.index + 1}"
        sampled = _recorded(trajectory, step.served, what)
        if prompt is None:
            raise SequenceRefused(f"{_where(trajectory, what)}: its prompt ids were not recorded; sample with episode.record_prompt_ids")
        if step.served is not None and ids_sha256(prompt) != step.served.sha256:
            raise SequenceRefused(f"{_where(trajectory, what)}: its recorded prompt ids do not hash to the prompt it was served")
        if current is not None and current.input_ids == prompt[: len(current.input_ids)]:
            current.input_ids += prompt[len(current.input_ids) :]
            current.steps.append(step.index)
        else:
            current = TrainingSequence(
                episode_id=trajectory.episode_id,
                question_id=trajectory.question_id,
                sample=trajectory.sample,
                conversation="actions",
                steps=[step.index],
                input_ids=list(prompt),
                trained=[],
                old_logprobs=[],
                temperature=temperature,
                old_logprobs_temperature=_old_temperature(sampled, temperature),
            )
            sequences.append(current)
        if _old_temperature(sampled, temperature) != current.old_logprobs_temperature:
            raise SequenceRefused(
                f"{_where(trajectory, what)}: its log-probabilities are at temperature {sampled.temperature}, "
                f"those of the steps before it in its sequence at {current.old_logprobs_temperature or temperature}"
            )
        _append(current, sampled, len(prompt))  # the sequence is now the prompt: the draw follows it
    return [sequence for sequence in sequences if sequence.trained]


def _append(sequence: TrainingSequence, sampled: Sampled, start: int) -> None:
    sequence.input_ids += sampled.ids
    for offset, logprob in enumerate(sampled.logprobs):
        if logprob is not None and not (math.isfinite(logprob) and logprob <= 0):  # a probability's log; else the ratio is inf or NaN
            raise SequenceRefused(
                f"episode {sequence.episode_id} {sequence.conversation}: a sampled log-probability of {logprob}, which no probability has; "
                "remove the round's samples/ to sample it again"
            )
        if logprob is not None:  # drawn, not written for the model
            sequence.trained.append(start + offset)
            sequence.old_logprobs.append(logprob)


def _reader_sequences(trajectory: Trajectory, readings) -> list[TrainingSequence]:
    sequences = []
    temperature = sampling_temperature(trajectory)
    calls = [(f"update {number}", update.served) for reading in readings for number, update in enumerate(reading.updates, 1)]
    calls += [("answer", reading.answer.served) for reading in readings if reading.answer is not None]
    for position, (conversation, served) in enumerate(calls):
        sampled = _recorded(trajectory, served, f"memory {conversation}")
        if served.ids is None or served.ids.keep:
            raise SequenceRefused(
                f"{_where(trajectory, f'memory {conversation}')}: its prompt ids were not recorded whole; sample with episode.record_prompt_ids"
            )
        prompt = served.ids.append
        if ids_sha256(prompt) != served.sha256:
            raise SequenceRefused(
                f"{_where(trajectory, f'memory {conversation}')}: its recorded prompt ids do not hash to the prompt it was served"
            )
        sequence = TrainingSequence(
            episode_id=trajectory.episode_id,
            question_id=trajectory.question_id,
            sample=trajectory.sample,
            conversation=conversation,
            steps=[position],
            input_ids=list(prompt),
            trained=[],
            old_logprobs=[],
            temperature=temperature,
            old_logprobs_temperature=_old_temperature(sampled, temperature),
        )
        _append(sequence, sampled, len(prompt))
        if sequence.trained:
            sequences.append(sequence)
    return sequences
