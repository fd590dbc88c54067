"""Tokens spent: every token a model processed or wrote in an episode, one count per episode, so
that the code agent and the memory reader can be compared at the same cost.

The definition (``model_tokens``): over every model call of the episode, its prompt tokens plus
the tokens it generated. A prompt counts in full at every call, even where a KV cache or a
server's prefix cache saved the work of encoding part of it again: the count is what the model
was given and wrote, not what the hardware did, so it does not depend on the backend's caching
and the code agent's count (one call per step, each prompt the whole conversation so far) and the
reader's (one call per memory update and one for the answer) compare.

What it reads: the code agent's ``Step.generation`` (``prompt_tokens``, the renderer's prompt as
sent; for a chat API, which sends messages, the API's own ``usage_prompt_tokens``, in the served
model's tokens; and ``generated_tokens``), and the memory reader's ``Reading.model_tokens`` (its
own sum over its update and answer calls, in ``StepPolicyInfo.reading``). A count the policy did
not record counts 0. Scripted policies make no model call: their count is None, not 0, so a mean
over a run never mixes "free" with "not measured".
"""

from __future__ import annotations

from paper_explorer.agent.trajectory import Generation, Trajectory


def model_tokens(trajectory: Trajectory) -> int | None:
    """Prompt plus generated tokens over every model call of the episode; None when it made none."""
    counts = [_generation_tokens(step.generation) for step in trajectory.steps if step.generation is not None]
    counts += [reading.model_tokens for reading in readings(trajectory)]
    return sum(counts) if counts else None


def readings(trajectory: Trajectory) -> list:
    """The memory reader's records (``agent.trajectory.Reading``) of the episode: none for other policies."""
    return [step.policy_info.reading for step in trajectory.steps if step.policy_info is not None and step.policy_info.reading is not None]


def _generation_tokens(generation: Generation) -> int:
    prompt = generation.prompt_tokens if generation.prompt_tokens is not None else generation.usage_prompt_tokens
    return (prompt or 0) + (generation.generated_tokens or 0)
