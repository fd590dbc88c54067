"""What a step was served, recorded so that a later check can compare it with what is trained.

A served prompt is kept as the SHA-256 of its ids (``ids_sha256``), its length and the
fingerprint of the tokenizer that made it; with ``record_prompt_ids`` also the ids themselves,
each step's as a change from the previous step's (``PromptIds``). A server that returns the ids it
received (vLLM, asked with ``return_token_ids``) has their digest recorded beside ours
(``server_sha256``), and with ``record_prompt_ids`` the ids themselves where they differ from ours.
"""

from __future__ import annotations

import hashlib
import json

from paper_explorer.agent.trajectory import PromptIds, Sampled, Served, Step


def ids_sha256(ids: list[int]) -> str:
    """The digest of a token id sequence: SHA-256 of the ids written in decimal, comma-separated."""
    return hashlib.sha256(",".join(map(str, ids)).encode()).hexdigest()


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def reply_sha256(action_text: str, reasoning: str | None) -> str:
    """The digest of what a policy wrote at a step: its think block (if any) and its action."""
    written = json.dumps([reasoning, action_text], ensure_ascii=True)  # ascii: a lone surrogate digests too
    return hashlib.sha256(written.encode()).hexdigest()


def served_record(
    prompt: list[int],
    tokenizer_sha256: str,
    source: str,
    *,
    reply: str,
    previous: list[int] | None = None,
    keep_ids: bool = False,
    server_ids: list[int] | None = None,
    server_tokens: int | None = None,
    sampled: Sampled | None = None,
) -> Served:
    """The record of one served prompt and the digest of the reply to it (``reply_sha256``);
    ``previous`` is the prompt of the step before (for the ids' delta); ``sampled``, what the model
    generated for it, is kept as given (the caller passes it when the episode records samples)."""
    ids = None
    if keep_ids:
        keep = common_prefix(previous or [], prompt)
        ids = PromptIds(keep=keep, append=prompt[keep:])
    differing = server_ids if keep_ids and server_ids is not None and server_ids != prompt else None
    return Served(
        source=source,
        tokens=len(prompt),
        sha256=ids_sha256(prompt),
        tokenizer_sha256=tokenizer_sha256,
        ids=ids,
        server_tokens=server_tokens,
        server_sha256=ids_sha256(server_ids) if server_ids is not None else None,
        reply_sha256=reply,
        server_ids=differing,
        sampled=sampled,
    )


class AlteredRecord(Exception):
    """Recorded ids that no honest recording can produce (a delta keeping more than there was)."""


def served_prompts(steps: list[Step]) -> list[list[int] | None]:
    """Each step's served ids, rebuilt from the recorded deltas (None where they were not kept).
    Raises AlteredRecord, naming the step, for a delta that cannot be rebuilt."""
    prompts: list[list[int] | None] = []
    previous: list[int] | None = []
    for step in steps:
        ids = step.served.ids if step.served else None
        if ids is None:
            prompts.append(None)
            previous = None
            continue
        if ids.keep and (previous is None or ids.keep > len(previous)):
            known = "no recorded ids" if previous is None else f"{len(previous)} ids"
            raise AlteredRecord(f"step {step.index + 1} keeps {ids.keep} ids of a previous prompt that has {known}")
        previous = (previous or [])[: ids.keep] + ids.append
        prompts.append(previous)
    return prompts
