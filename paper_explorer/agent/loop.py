"""The episode loop: question -> policy -> action -> sandbox -> observation ... -> outcome, then the
option probes the config asks for (``agent.probes``)."""

from __future__ import annotations

import hashlib
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError
from pydantic_core import PydanticSerializationError

from paper_explorer.agent.actions import extract_code
from paper_explorer.agent.environment import versions
from paper_explorer.agent.policies.base import ContextExceeded, EpisodeStart, NoAnswer, Policy, PolicyError
from paper_explorer.agent.policies.records import recorded
from paper_explorer.agent.probes import after_episode, check_probes
from paper_explorer.agent.prompt import FORMAT_ERROR, cut, observation, prompt_template_sha256, question_message, system_prompt
from paper_explorer.agent.served import reply_sha256, served_record
from paper_explorer.agent.trajectory import (
    EpisodeConfig,
    Generation,
    Hashes,
    Outcome,
    PolicyInfo,
    Served,
    Step,
    StepPolicyInfo,
    Timings,
    Trajectory,
)
from paper_explorer.corpus import Corpus
from paper_explorer.tools.sandbox import Limits, Sandbox


def sandbox_limits(config: EpisodeConfig) -> Limits:
    return Limits.from_settings(config)


def corpus_hashes(corpus: Corpus, policy: Policy | str | None = None, reader_prompts: str = "explorer") -> Hashes:
    """The hashes a run records; the prompts' is ``policy``'s own (a policy, or a policy's name as
    a manifest records it: the memory reader's is its prompts file, the one ``reader_prompts`` names)."""
    if isinstance(policy, Policy):
        prompts = policy.prompt_template_sha256()
    elif policy == "memory-reader":
        from paper_explorer.agent.memory_reader.prompts import ReaderPrompts

        prompts = ReaderPrompts.named(reader_prompts).sha256
    else:
        prompts = prompt_template_sha256()
    return Hashes(corpus_sha256=corpus.papers_sha256, questions_sha256=corpus.questions_sha256, prompt_template_sha256=prompts)


def run_episode(
    question: str,
    policy: Policy,
    sandbox: Sandbox,
    config: EpisodeConfig,
    hashes: Hashes,
    *,
    question_id: str | None = None,
    paper_id: str | None = None,
    document: str | None = None,
    episode_id: str | None = None,
    sample: int = 0,
    on_step: Callable[[Step], None] | None = None,
) -> Trajectory:
    """One episode in ``sandbox`` (a fresh one per episode: no state may carry over)."""
    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    started = time.perf_counter()
    system = system_prompt()
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}, {"role": "user", "content": question_message(question)}]
    steps: list[Step] = []
    outcome: Outcome | None = None
    last_prompt: list[int] | None = None
    seed = episode_seed(config.seed, question_id or question, sample)
    failed_retries = 0
    if config.probes:
        check_probes(
            config.probes, policy, path=config.probes_file
        )  # AgentError: the run cannot ask what it asks (eval checks it before anything is written)
    try:
        policy.start(
            EpisodeStart(
                seed=seed,
                question=question,
                question_id=question_id,
                sample=sample,
                paper_id=paper_id,
                document=document,
                record_ids=config.record_prompt_ids,
                record_sampled=config.record_sampled,
            )
        )
    except PolicyError as error:
        outcome = Outcome(status="policy_error", reason=str(error))
    while outcome is None:
        if len(steps) >= config.max_steps:
            outcome = Outcome(status="step_limit", reason=f"no submit or abstain within {config.max_steps} steps")
            break
        size = sum(len(message["content"]) for message in messages)
        if size > config.context_chars:
            outcome = Outcome(
                status="context_limit", reason=f"the conversation holds {size} characters, over the budget of {config.context_chars}"
            )
            break
        policy_started = time.perf_counter()
        try:
            reply = policy.act([dict(message) for message in messages])
        except ContextExceeded as error:
            outcome = Outcome(status="context_limit", reason=str(error))
            break
        except NoAnswer as error:
            outcome = Outcome(status="no_answer", reason=str(error))
            break
        except PolicyError as error:
            outcome = Outcome(status="policy_error", reason=str(error))
            failed_retries = error.retries
            break
        except Exception as error:  # a policy's own bug ends this episode, not the run
            outcome = Outcome(status="policy_error", reason=f"{type(error).__name__}: {error}")
            break
        policy_seconds = time.perf_counter() - policy_started
        try:
            generation, info = _step_records(reply)
        except ValueError as error:  # a policy's record that cannot be written: this episode ends, not the run
            outcome = Outcome(status="policy_error", reason=str(error))
            break
        step, ended = _execute(len(steps), reply.text, sandbox, config)
        step.reasoning = reply.reasoning
        step.served, last_prompt = _served(policy, reply, messages, config, last_prompt)
        step.generation, step.policy_info = generation, info
        step.timings.policy_seconds = policy_seconds
        steps.append(step)
        policy.observed(step)
        if on_step is not None:
            on_step(step)
        turn: dict[str, Any] = {"role": "assistant", "content": reply.text}
        if reply.reasoning is not None:
            turn["reasoning"] = reply.reasoning
        if generation is not None and generation.thinking_unclosed:
            turn["thinking_unclosed"] = True  # rendered as Trajectory.messages renders it back
        messages += [turn, {"role": "user", "content": step.observation}]
        outcome = ended
    if steps:
        try:
            final = policy.finish([dict(message) for message in messages])
        except Exception as error:  # a report about the episode must not lose the episode
            final = {"finish_error": f"{type(error).__name__}: {error}"}
        if final:
            earlier = steps[-1].policy_info.model_dump(exclude_none=True) if steps[-1].policy_info else {}
            steps[-1].policy_info = StepPolicyInfo.model_validate({**earlier, **final})
    # after finish: the whole conversation, the last observation included; each failure is a result's not_measured
    submitted = outcome.status == "submitted"
    probes = after_episode(policy, messages, config.probes, submitted=submitted, path=config.probes_file) if config.probes else []
    return Trajectory(
        episode_id=episode_id or uuid.uuid4().hex[:12],
        question_id=question_id,
        question=question,
        paper_id=paper_id,
        system_prompt=system,
        policy=PolicyInfo(name=policy.name, settings=recorded(policy.settings())),
        config=config,
        steps=steps,
        outcome=outcome,
        sample=sample,
        episode_seed=seed,
        failed_request_retries=failed_retries,
        probes=probes,
        hashes=hashes,
        isolation=sandbox.isolation,
        documents=sandbox.documents,
        versions=versions(),
        started_at=started_at,
        seconds=time.perf_counter() - started,
    )


def episode_seed(run_seed: int, question: str, sample: int) -> int:
    """The seed an episode's policy gets: fixed by the run's seed, the question and the sample
    number, so that a config gives the same trajectories in any order, on any worker."""
    digest = hashlib.sha256(f"{run_seed}:{question}:{sample}".encode()).digest()
    return int.from_bytes(digest[:4], "big")


def _step_records(reply) -> tuple[Generation | None, StepPolicyInfo | None]:
    """The reply's generation and info as records, checked before its action runs; ValueError
    (pydantic's included) says what cannot be recorded: a lone surrogate (no UTF-8 log holds it)
    or a field of the wrong type."""
    for name, text in (("action", reply.text), ("reasoning", reply.reasoning)):
        try:
            (text or "").encode("utf-8")
        except UnicodeEncodeError as error:
            raise ValueError(
                f"the policy's {name} holds a lone surrogate (at character {error.start}); it cannot be tokenised or logged"
            ) from None
    try:
        generation = Generation.model_validate(reply.generation) if reply.generation else None
        info = StepPolicyInfo.model_validate(reply.info) if reply.info else None
    except ValidationError as error:
        first = error.errors(include_url=False)[0]
        raise ValueError(
            f"the policy recorded {'.'.join(map(str, first['loc']))} as {str(first.get('input'))[:60]!r}: {first['msg']}"
        ) from None
    for record in (generation, info):
        try:
            record is None or record.model_dump_json()
        except PydanticSerializationError as error:  # text a server sent (a lone surrogate) that no log can hold
            raise ValueError(f"the policy's {type(record).__name__.lower()} record cannot be logged ({str(error)[:120]})") from None
    return generation, info


def _served(
    policy: Policy, reply, messages: list[dict[str, Any]], config: EpisodeConfig, previous: list[int] | None
) -> tuple[Served | None, list[int] | None]:
    """The record of the prompt this step was served: the ids a model policy sent, or those its
    renderer would have sent a policy without a model; None when the policy has no renderer."""
    renderer = policy.renderer
    if renderer is None:
        return None, None
    if reply.prompt_ids is not None:
        prompt, source = reply.prompt_ids, "policy"
    else:
        prompt, source = renderer.prompt(messages, thinking=policy.thinking), "renderer"
    record = served_record(
        prompt,
        renderer.fingerprint,
        source,
        reply=reply_sha256(reply.text, reply.reasoning),
        previous=previous,
        keep_ids=config.record_prompt_ids,
        server_ids=reply.server_prompt_ids,
        server_tokens=reply.server_prompt_tokens,
        sampled=reply.sampled if config.record_sampled else None,
    )
    return record, prompt


def _execute(index: int, text: str, sandbox: Sandbox, config: EpisodeConfig) -> tuple[Step, Outcome | None]:
    code = extract_code(text)
    if code is None:
        shown, omitted = cut(FORMAT_ERROR, config.observation_chars)
        return Step(index=index, action_text=text, code=None, observation=shown, observation_chars_cut=omitted, format_error=True), None
    result = sandbox.execute(code)
    shown, omitted = cut(observation(result), config.observation_chars)
    calls = result.tool_calls
    step = Step(
        index=index,
        action_text=text,
        code=code,
        observation=shown,
        observation_chars_cut=omitted,
        error=result.error,
        limit_hit=result.limit_hit,
        variables_lost=result.variables_lost,
        deferred_output_chars=result.deferred_output_chars,
        tool_calls=calls,
        timings=Timings(
            sandbox_seconds=result.seconds,
            tools_seconds=sum(call.seconds for call in calls),
            host_seconds=result.host_seconds,
            host_cpu_seconds=result.host_cpu_seconds,
            worker_cpu_seconds=result.worker_cpu_seconds,
            reply_cpu_seconds=result.reply_cpu_seconds,
        ),
    )
    return step, result.outcome  # the host's record of the call that ended the episode, if one did
