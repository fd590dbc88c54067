"""What a step was served, recorded so that a later check can compare it with what is trained.

A served prompt is kept as the SHA-256 of its ids (``ids_sha256``), its length and the
fingerprint of the tokenizer that made it; with ``record_prompt_ids`` also the ids themselves,
each step's as a change from the previous step's (``PromptIds``).
"""

from __future__ import annotations

import hashlib

from agent.trajectory import PromptIds, Served, Step


def ids_sha256(ids: list[int]) -> str:
    """The digest of a token id sequence: SHA-256 of the ids written in decimal, comma-separated."""
    return hashlib.sha256(",".join(map(str, ids)).encode()).hexdigest()


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def served_record(prompt: list[int], tokenizer_sha256: str, source: str, *, previous: list[int] | None = None,
                  keep_ids: bool = False, server_ids: list[int] | None = None, server_tokens: int | None = None) -> Served:
    """The record of one served prompt; ``previous`` is the prompt of the step before (for the ids' delta)."""
    ids = None
    if keep_ids:
        keep = common_prefix(previous or [], prompt)
        ids = PromptIds(keep=keep, append=prompt[keep:])
    return Served(
        source=source, tokens=len(prompt), sha256=ids_sha256(prompt), tokenizer_sha256=tokenizer_sha256, ids=ids,
        server_tokens=server_tokens, server_sha256=ids_sha256(server_ids) if server_ids is not None else None,
    )


def served_prompts(steps: list[Step]) -> list[list[int] | None]:
    """Each step's served ids, rebuilt from the recorded deltas (None where they were not kept)."""
    prompts: list[list[int] | None] = []
    previous: list[int] | None = []
    for step in steps:
        ids = step.served.ids if step.served else None
        if ids is None or (ids.keep and (previous is None or ids.keep > len(previous))):
            prompts.append(None)
            previous = None
            continue
        previous = (previous or [])[: ids.keep] + ids.append
        prompts.append(previous)
    return prompts
