"""The memory reader's prompts, rebuilt from its trajectory and checked against what it recorded.

A reader's model never sees the conversation; it sees the prompts the reader builds. Each one can
be rebuilt from the trajectory alone: the document from the read observations (the same parse
the reader made), its pages from the recorded recipe, the memory each update held from the
update before it, and the problem from the question. The check rebuilds every update's prompt
and the final one and compares them with the records: the digest and length of the ids sent,
the server's own ids' digest and count where it returned them, the tokenizer, the page's range
and digest, the memory tokens, the tokens read and left unread, a recorded parity warning. An
edited memory, page, count, recipe or prompts file, another tokenizer, or a server that
tokenised the prompt itself all fail it.
"""

from __future__ import annotations

from typing import Any

from agent.memory_reader import document
from agent.memory_reader.paging import encode_document, page_document
from agent.memory_reader.prompts import ReaderPrompts, final_prompt, memory_ids, update_prompt
from agent.mismatch import Mismatch
from agent.policies.base import PolicyError
from agent.renderer import ChatRenderer
from agent.served import ids_sha256
from agent.trajectory import Generation, Reading, Served, Trajectory


def reading_of(trajectory: Trajectory) -> Reading | None:
    """The reader's record: on the last step that holds one."""
    for step in reversed(trajectory.steps):
        if step.policy_info is not None and step.policy_info.reading is not None:
            return step.policy_info.reading
    return None


def check_reading(trajectory: Trajectory, renderer: ChatRenderer, prompts: ReaderPrompts | None = None) -> Mismatch | None:
    """The first recorded prompt of the reader that its trajectory does not rebuild, or None."""
    where = f"episode {trajectory.episode_id}"
    reading = reading_of(trajectory)
    if reading is None:
        return None  # it ended before its model was called: nothing was served
    settings = trajectory.policy.settings
    prompts = prompts or ReaderPrompts.load()
    if settings.get("prompts_sha256") != prompts.sha256:
        return Mismatch(
            where, f"served with the reader prompts {str(settings.get('prompts_sha256'))[:12]}, checked with {prompts.sha256[:12]}"
        )
    if settings.get("tokenizer_sha256") != renderer.fingerprint:
        return Mismatch(
            where,
            f"served with the tokenizer {str(settings.get('tokenizer_sha256'))[:12]}, checked with {renderer.fingerprint[:12]}: "
            "name the tokenizer the run used",
        )
    try:
        sections = _sections(trajectory, reading)
    except PolicyError as error:
        return Mismatch(where, f"the read observations no longer parse into the document: {error}")
    rebuilt = encode_document(sections, renderer, prompts)
    paging = page_document(
        rebuilt,
        page_tokens=settings["page_tokens"],
        outlines=settings["outlines"],
        outline_sections=settings["outline_sections"],
        renderer=renderer,
        prompts=prompts,
    )
    if (reading.document_tokens, reading.pages) != (rebuilt.tokens, len(paging.pages)):
        return Mismatch(
            where,
            f"the reader recorded {reading.document_tokens} document tokens in {reading.pages} pages; "
            f"the observations make {rebuilt.tokens} in {len(paging.pages)}",
        )
    # What a budget left unread is a reported figure (scores, compare): it must be what the updates read.
    read = max((update.end for update in reading.updates), default=0)
    if (reading.read_tokens, reading.unread_tokens) != (read, rebuilt.tokens - read):
        return Mismatch(
            where,
            f"the reader recorded {reading.read_tokens} tokens read and {reading.unread_tokens} unread; "
            f"its updates read {read} of the document's {rebuilt.tokens}",
        )
    return _updates(where, trajectory, reading, rebuilt, paging, settings, renderer, prompts)


def _sections(trajectory: Trajectory, reading: Reading):
    """The document's sections, parsed again from the observations of the outline and paper reads."""
    if not reading.papers:
        return []
    outline_text = document.outlines_action(reading.papers)
    position = next((i for i, step in enumerate(trajectory.steps) if step.action_text == outline_text), None)
    if position is None:
        raise PolicyError("no step read the recorded papers' outlines")
    outlines = document.parse_outlines(trajectory.steps[position].observation, reading.papers)
    reads = trajectory.steps[position + 1 : position + 1 + len(outlines)]
    if len(reads) != len(outlines):
        raise PolicyError(f"{len(outlines)} papers, {len(reads)} read steps")
    sections = []
    for outline, step in zip(outlines, reads):
        if step.action_text != document.paper_action(outline.paper_id, outline.sections):
            raise PolicyError(f"step {step.index + 1} is not the read of paper {outline.paper_id!r}")
        sections += document.parse_paper(step.observation, outline)
    return sections


def _updates(where, trajectory, reading, rebuilt, paging, settings: dict[str, Any], renderer, prompts) -> Mismatch | None:
    problem = renderer.text(trajectory.question)
    cap = settings["memory_tokens"]
    sentinel = settings.get("keep_sentinel") or None
    memory: str | None = None
    for number, update in enumerate(reading.updates, 1):
        at = f"{where} memory update {number} (pass {update.pass_index}, page {update.page + 1})"
        if not 0 <= update.page < len(paging.pages):
            return Mismatch(at, f"no page {update.page + 1} in the document's {len(paging.pages)}")
        page = paging.pages[update.page]
        ids = page.ids(rebuilt)
        if (update.start, update.end, update.page_sha256) != (page.start, page.end, ids_sha256(ids)):
            return Mismatch(
                at, f"the recorded page (tokens {update.start}-{update.end}) is not the document's (tokens {page.start}-{page.end})"
            )
        held = memory_ids(renderer, prompts, memory, cap)
        if update.memory_tokens_in != len(held):
            return Mismatch(at, f"recorded {update.memory_tokens_in} memory tokens in; the previous update's memory makes {len(held)}")
        prompt = update_prompt(
            renderer, prompts, problem_ids=problem, memory_ids=held, outline_ids=page.outline_ids, page_ids=ids, sentinel=sentinel
        )
        mismatch = _served(at, update.served, update.generation, prompt)
        if mismatch is not None:
            return mismatch
        memory = update.memory
    if reading.answer is None:
        return None
    held = memory_ids(renderer, prompts, memory, cap)
    prompt = final_prompt(renderer, prompts, problem_ids=problem, memory_ids=held)
    return _served(f"{where} final answer", reading.answer.served, reading.answer.generation, prompt)


def _served(at: str, served: Served, generation: Generation, prompt: list[int]) -> Mismatch | None:
    if generation.parity_warning is not None:
        return Mismatch(at, f"a parity warning was recorded at serving time: {generation.parity_warning!r}")
    if served.tokens != len(prompt) or served.sha256 != ids_sha256(prompt):
        return Mismatch(
            at,
            f"the served prompt ({served.tokens} tokens, sha256 {served.sha256[:12]}) is not the one the trajectory rebuilds "
            f"({len(prompt)} tokens, sha256 {ids_sha256(prompt)[:12]})",
        )
    if generation.prompt_tokens is not None and generation.prompt_tokens != len(prompt):
        return Mismatch(at, f"the model was sent {generation.prompt_tokens} prompt tokens; the trajectory rebuilds {len(prompt)}")
    if served.server_tokens is not None and served.server_tokens != served.tokens:
        return Mismatch(at, f"the server counted {served.server_tokens} prompt tokens; {served.tokens} were sent")
    if served.server_sha256 is not None and served.server_sha256 != served.sha256:
        return Mismatch(at, "the prompt ids the server returned differ from the ids sent")
    return None
