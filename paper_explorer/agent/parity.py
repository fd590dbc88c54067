"""Train/serve parity, checked against what was recorded at serving time.

For every step of a trajectory: the prompt the renderer builds from the recorded messages, plus
the tokens the model wrote, must be a prefix of the training sequence; the tool page must be in
the prompt once; and what the step *recorded* it was served (``Step.served``: the ids or their
digest, the tokenizer's fingerprint, the server's own count and ids) must be that same prompt.
A recorded parity warning fails too. The recorded side is what makes the check able to fail:
an edited trajectory, another tokenizer, or a server that tokenised the prompt itself all
leave a record that no longer matches the training sequence.
"""

from __future__ import annotations

from paper_explorer.agent.memory_reader.parity import check_reading
from paper_explorer.agent.mismatch import Mismatch, differing
from paper_explorer.agent.renderer import ChatRenderer
from paper_explorer.agent.served import AlteredRecord, ids_sha256, reply_sha256, served_prompts
from paper_explorer.agent.trajectory import Trajectory
from paper_explorer.corpus.setting_names import setting
from paper_explorer.tools.page import tool_page

MODEL_POLICIES = ("hf", "openai")  # from schema version 3 on, they record every step's served prompt (a chat teacher: with --tokenizer)


def check_trajectory(trajectory: Trajectory, renderer: ChatRenderer, require_served: bool = False) -> Mismatch | None:
    """The first place where serving and training disagree for this trajectory, or None.
    ``require_served``: a step without a record of what it was served fails too (otherwise
    only where the record must exist: a model policy's steps, or beside steps that have one)."""
    if trajectory.policy.name == "memory-reader":
        return check_reading(trajectory, renderer)  # its model saw its own prompts, never the conversation
    # Only the memory reader records a reading, and the detectors count its pages as research: one on
    # another policy's trajectory would make a direct submit look researched.
    read = next((step for step in trajectory.steps if step.policy_info is not None and step.policy_info.reading is not None), None)
    if read is not None:
        return Mismatch(
            f"episode {trajectory.episode_id} step {read.index + 1}",
            f"a memory reader's reading on a trajectory of the {trajectory.policy.name} policy, which never records one: the record was altered",
            step=read.index,
        )
    recorded = [step.served is not None for step in trajectory.steps]
    served_by_us = trajectory.policy.name in MODEL_POLICIES and trajectory.policy.settings.get("api") != "chat"
    must = require_served or any(recorded) or (trajectory.schema_version >= 3 and served_by_us)
    if must and not all(recorded):
        step = trajectory.steps[recorded.index(False)]
        return Mismatch(
            f"episode {trajectory.episode_id} step {step.index + 1}",
            f"no record of what this step was served (removed, or recorded without {setting('policy.tokenizer')})",
            step=step.index,
        )
    for step, mismatch in _step_mismatches(trajectory, renderer):
        mismatch.step = step
        return mismatch
    return None


def server_evidence(step) -> str:
    """What the server said it received at ``step``: "ids" (their digest is recorded), "counts"
    (only how many), or "nothing" (no server, or one that says neither)."""
    served, generation = step.served, step.generation
    if served is not None and served.server_sha256 is not None:
        return "ids"
    if (served is not None and served.server_tokens is not None) or (
        generation is not None and generation.server_prompt_tokens is not None
    ):
        return "counts"
    return "nothing"


def without_server_ids(trajectory: Trajectory) -> Mismatch | None:
    """The first step of ``trajectory`` whose served prompt the server did not confirm id by id."""
    for step in trajectory.steps:
        if server_evidence(step) != "ids":
            return Mismatch(
                f"episode {trajectory.episode_id} step {step.index + 1}",
                "no prompt ids from the server were recorded (it did not return them, or they were not asked for)",
                step=step.index,
            )
    return None


def _step_mismatches(trajectory: Trajectory, renderer: ChatRenderer):
    messages = trajectory.messages()
    training = renderer.render(messages).ids
    page = tool_page()
    try:
        recorded_prompts = served_prompts(trajectory.steps)
    except AlteredRecord as error:
        yield 0, Mismatch(f"episode {trajectory.episode_id}", f"the recorded prompt ids were altered: {error}")
        return
    for step, recorded_ids in zip(trajectory.steps, recorded_prompts):
        where = f"episode {trajectory.episode_id} step {step.index + 1}"
        before = messages[: 2 + 2 * step.index]
        copies = sum(message["content"].count(page) for message in before)
        if copies != 1:
            yield step.index, Mismatch(where, f"the tool page appears {copies} times in the prompt, not once")
        unclosed = step.generation is not None and bool(step.generation.thinking_unclosed)
        prompt = renderer.prompt(before, thinking=step.reasoning is not None or unclosed)
        written = (renderer.thought(step.reasoning) if step.reasoning is not None else []) + (
            renderer.unclosed(step.action_text) if unclosed else renderer.action(step.action_text)
        )
        mismatch = differing(where, "served and training tokens differ", prompt + written, training[: len(prompt) + len(written)], renderer)
        mismatch = mismatch or _recorded(where, step, recorded_ids, prompt, renderer)
        if mismatch is not None:
            yield step.index, mismatch


def _recorded(where: str, step, recorded_ids: list[int] | None, prompt: list[int], renderer: ChatRenderer) -> Mismatch | None:
    """What the step recorded about its serving, against the prompt the renderer builds for it."""
    generation, served = step.generation, step.served
    if served is not None and served.server_ids is not None and ids_sha256(served.server_ids) == served.server_sha256:
        shown = differing(
            where,
            "the prompt ids the server returned differ from the ids sent",
            served.server_ids,
            recorded_ids if recorded_ids is not None else prompt,
            renderer,
        )
        if shown is not None:
            return shown
    if generation is not None and generation.parity_warning is not None:
        return Mismatch(where, f"a parity warning was recorded at serving time: {generation.parity_warning!r}")
    if generation is not None and generation.prompt_tokens is not None and generation.prompt_tokens != len(prompt):
        return Mismatch(where, f"the policy recorded a prompt of {generation.prompt_tokens} tokens; the renderer builds {len(prompt)}")
    if generation is not None and generation.server_prompt_tokens is not None and generation.server_prompt_tokens != len(prompt):
        return Mismatch(where, f"the server counted {generation.server_prompt_tokens} prompt tokens; the renderer builds {len(prompt)}")
    if served is None:
        return None
    if served.reply_sha256 != reply_sha256(step.action_text, step.reasoning):
        return Mismatch(where, "the action (or think block) differs from what the policy wrote back: the record was altered")
    if served.tokenizer_sha256 != renderer.fingerprint:
        return Mismatch(
            where,
            f"served with the tokenizer {served.tokenizer_sha256[:12]}, checked with {renderer.fingerprint[:12]}: "
            "name the tokenizer the run used",
        )
    if served.server_tokens is not None and served.server_tokens != served.tokens:
        return Mismatch(where, f"the server counted {served.server_tokens} prompt tokens; {served.tokens} were sent")
    if served.server_sha256 is not None and served.server_sha256 != served.sha256:
        return Mismatch(
            where,
            f"the prompt ids the server returned differ from the ids sent (rerun with {setting('episode.record_prompt_ids', True)} to see where)",
        )
    if recorded_ids is not None:
        if ids_sha256(recorded_ids) != served.sha256 or len(recorded_ids) != served.tokens:
            return Mismatch(where, "the recorded prompt ids do not match their recorded digest: the record was altered")
        return differing(where, "the served prompt differs from the training sequence", recorded_ids, prompt, renderer)
    if served.tokens != len(prompt) or served.sha256 != ids_sha256(prompt):
        return Mismatch(
            where,
            f"the served prompt ({served.tokens} tokens, sha256 {served.sha256[:12]}) is not the training "
            f"sequence's prompt ({len(prompt)} tokens, sha256 {ids_sha256(prompt)[:12]}); "
            f"rerun with {setting('episode.record_prompt_ids', True)} to see the first differing token",
        )
    return None
