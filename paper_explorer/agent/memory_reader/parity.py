"""The memory reader's prompts, rebuilt from its trajectory and checked against what it recorded.

A reader's model never sees the conversation; it sees the prompts the reader builds. Each one can
be rebuilt from the trajectory alone: the document from the read steps' tool records (taken as
the reader took them, ``document.Reads``), its pages from the recorded recipe, the memory each update held from the
update before it, and the problem from the question. The check rebuilds every update's prompt
and the final one and compares them with the records: the digest and length of the ids sent,
the server's own ids' digest and count where it returned them, the tokenizer, the page's range
and digest, the memory tokens, the tokens read and left unread, a recorded parity warning. An
edited memory, page, count, recipe or prompts file, another tokenizer, or a server that
tokenised the prompt itself all fail it.
"""

from __future__ import annotations

from typing import Any

from paper_explorer.agent.memory_reader import document
from paper_explorer.agent.memory_reader.paging import Document, encode_document, page_document, verbatim_document
from paper_explorer.agent.memory_reader.policy import abstains, capped, taken_answer, written_tokens
from paper_explorer.agent.memory_reader.prompts import ReaderPrompts, final_prompt, is_keep, memory_ids, problem_text, update_prompt
from paper_explorer.agent.memory_reader.settings import parse_scope
from paper_explorer.agent.mismatch import Mismatch
from paper_explorer.agent.policies.base import PolicyError
from paper_explorer.agent.renderer import ChatRenderer
from paper_explorer.agent.served import ids_sha256, reply_sha256
from paper_explorer.agent.trajectory import Generation, Reading, Served, Trajectory


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
    prompts = prompts or ReaderPrompts.named(settings.get("prompts", "explorer"))
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
    mismatch = _scope(where, trajectory, reading, settings)
    if mismatch is not None:
        return mismatch
    verbatim = reading.document == "verbatim"
    if verbatim:
        if reading.document_text is None or reading.document_text != reading.document_text.strip():
            return Mismatch(where, "the reader recorded a verbatim reading without the stripped text it paged")
        rebuilt: Document = verbatim_document(reading.document_text, renderer)
        if reading.document_sha256 != ids_sha256(rebuilt.ids):  # the unread rest too, which no prompt shows
            return Mismatch(where, "its recorded text is not the document the reader paged (its digest differs): the record was altered")
    else:
        try:
            sections = sections_read(trajectory, reading)
        except PolicyError as error:
            return Mismatch(where, f"the read records no longer make the document: {error}")
        rebuilt = encode_document(sections, renderer, prompts)
    paging = page_document(
        rebuilt,
        page_tokens=settings["page_tokens"],
        outlines=settings["outlines"] and not verbatim,
        outline_sections=settings["outline_sections"],
        renderer=renderer,
        prompts=prompts,
        balanced=settings.get("outline_fill") == "balanced",
    )
    if (reading.document_tokens, reading.pages) != (rebuilt.tokens, len(paging.pages)):
        return Mismatch(
            where,
            f"the reader recorded {reading.document_tokens} document tokens in {reading.pages} pages; "
            f"{'its recorded text' if verbatim else 'the observations'} make(s) {rebuilt.tokens} in {len(paging.pages)}",
        )
    # What a budget left unread is a reported figure (scores, compare): it must be what the updates read.
    read = max((update.end for update in reading.updates), default=0)
    if (reading.read_tokens, reading.unread_tokens) != (read, rebuilt.tokens - read):
        return Mismatch(
            where,
            f"the reader recorded {reading.read_tokens} tokens read and {reading.unread_tokens} unread; "
            f"its updates read {read} of the document's {rebuilt.tokens}",
        )
    return _updates(where, trajectory, reading, rebuilt, paging, settings, renderer, prompts) or _outcome(where, trajectory, reading)


def _outcome(where: str, trajectory: Trajectory, reading: Reading) -> Mismatch | None:
    """An episode that ended with an answer or an abstention ended with the answer the final call
    gave, as the reader submits it (no evidence), or its abstention: what is scored is what it read."""
    status, outcome = trajectory.outcome.status, trajectory.outcome
    if status not in ("submitted", "abstained"):
        return None
    answer = reading.answer.answer if reading.answer is not None else None
    expected = None if answer is None else "abstained" if abstains(answer) else "submitted"
    if status != expected or (status == "submitted" and (outcome.answer != answer or outcome.evidence)):
        ended = "abstained" if status == "abstained" else f"submitted {outcome.answer!r}"
        ended += f" with {len(outcome.evidence)} evidence paragraph(s)" if outcome.evidence else ""
        gave = "no answer" if answer is None else "an abstention" if expected == "abstained" else f"the answer {answer!r}"
        return Mismatch(where, f"the episode ended {ended}, but the reader's final call gave {gave}: the outcome was altered")
    return None


def sections_read(trajectory: Trajectory, reading: Reading):
    """The document's sections, built again from the tool records of the outline and paper reads,
    step by step as the reader took them (``document.Reads``: each step must be the plan's next action)."""
    if trajectory.schema_version < 8:
        raise PolicyError(
            f"recorded in schema {trajectory.schema_version}, whose reads keep no typed record of the pages the reader read "
            "(schema 8 on): its document cannot be built again"
        )
    if not reading.papers:
        return []
    reads = document.Reads(reading.papers)
    first = 0 if trajectory.policy.settings.get("scope") == "paper" else 1  # else the search comes first
    for step in trajectory.steps[first:]:
        planned = reads.next_action()
        if planned is None:
            break
        if step.action_text != planned:
            raise PolicyError(f"step {step.index + 1} is not the reader's next read")
        reads.take(step.tool_calls)
    return reads.sections()


def _updates(where, trajectory, reading, rebuilt, paging, settings: dict[str, Any], renderer, prompts) -> Mismatch | None:
    problem = renderer.text(problem_text(trajectory.question, settings.get("prompts", "explorer")))
    cap = settings["memory_tokens"]
    sentinel = settings.get("keep_sentinel") or None
    planned = [(number, page) for number in range(1, settings["passes"] + 1) for page in range(len(paging.pages))]
    done = [(update.pass_index, update.page) for update in reading.updates]
    if reading.passes != settings["passes"] or done != planned[: len(done)] or (len(done) < len(planned) and reading.stopped is None):
        return Mismatch(
            where,
            f"the updates are not the plan's pages in order ({settings['passes']} pass(es) of {len(paging.pages)} pages"
            f"{', then a stop' if reading.stopped else ''}): an update was added, removed or moved",
        )
    spent = 0
    memory: str | None = None
    for number, update in enumerate(reading.updates, 1):
        at = f"{where} memory update {number} (pass {update.pass_index}, page {update.page + 1})"
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
        mismatch = _served(at, update.served, update.generation, prompt) or _written(at, update, memory, renderer, prompts, cap, sentinel)
        if mismatch is not None:
            return mismatch
        spent += len(prompt) + written_tokens(
            renderer, update.written if update.written is not None else update.memory or "", update.generation
        )
        memory = update.memory
    answer = reading.answer
    if answer is not None:
        held = memory_ids(renderer, prompts, memory, cap)
        prompt = final_prompt(renderer, prompts, problem_ids=problem, memory_ids=held)
        mismatch = _served(f"{where} final answer", answer.served, answer.generation, prompt) or _answer(
            f"{where} final answer", answer, renderer, settings["answer_tokens"], settings.get("answer_from", "boxed-or-text")
        )
        if mismatch is not None:
            return mismatch
        spent += len(prompt) + written_tokens(renderer, answer.text, answer.generation)
    if spent != reading.model_tokens:
        return Mismatch(where, f"the reader recorded {reading.model_tokens} model tokens; its calls add up to {spent}")
    budget = settings.get("token_budget")
    if reading.token_budget != budget or (budget is not None and spent > budget):
        return Mismatch(where, f"the token budget recorded ({reading.token_budget}) is not the settings' ({budget}) or was exceeded")
    return None


def _written(at: str, update, before: str | None, renderer, prompts, cap: int, sentinel: str | None) -> Mismatch | None:
    """What the update wrote, against its digest, and the memory, keep and cap it made of that."""
    text = update.written if update.written is not None else update.memory
    if text is None or update.served.reply_sha256 != reply_sha256(text, None):
        return Mismatch(at, "what the update wrote is not what the model sent back (its digest differs): the record was altered")
    kept = is_keep(text, sentinel)
    after = before if kept else capped(renderer, text, cap)
    cut = bool(update.generation.hit_cap) or (not kept and after != text)
    out = len(memory_ids(renderer, prompts, after, cap))
    if (update.kept, update.memory, update.hit_cap, update.memory_tokens_out) != (kept, after, cut, out):
        return Mismatch(
            at,
            f"the recorded update (kept {update.kept}, cut {update.hit_cap}, {update.memory_tokens_out} memory tokens out) is not "
            f"what its text makes (kept {kept}, cut {cut}, {out} tokens)",
        )
    return None


def _answer(at: str, answer, renderer, answer_tokens: int, answer_from: str) -> Mismatch | None:
    """The answer taken from what the model wrote, and whether it was cut, empty or unboxed."""
    if answer.served.reply_sha256 != reply_sha256(answer.text, None):
        return Mismatch(at, "the answer's text is not what the model sent back (its digest differs): the record was altered")
    taken, invalid = taken_answer(renderer, answer.text, answer.generation, answer_tokens, answer_from)
    if (answer.answer, answer.invalid) != (taken, invalid):
        return Mismatch(at, f"the recorded answer ({answer.answer!r}, {answer.invalid}) is not what its text makes ({taken!r}, {invalid})")
    return None


def _scope(where: str, trajectory: Trajectory, reading: Reading, settings: dict[str, Any]) -> Mismatch | None:
    """The papers read are the scope's: the question's own (an oracle), or the top K of the search the first step ran."""
    scope = settings.get("scope")
    if reading.scope != scope or settings.get("oracle") != (scope == "paper"):
        return Mismatch(where, f"the recorded scope ({reading.scope}, oracle {settings.get('oracle')}) is not the settings' ({scope})")
    wanted = parse_scope(scope) if isinstance(scope, str) else None
    expected: list[str] | None
    if reading.document == "verbatim":
        # the question's own document, which only auto and verbatim page as given
        allowed = settings.get("document", "auto") in ("auto", "verbatim") and trajectory.paper_id is not None
        opened = bool(trajectory.steps) and trajectory.steps[0].action_text == document.outlines_action([str(trajectory.paper_id)])
        expected = [str(trajectory.paper_id)] if allowed and opened else None
    elif scope == "paper":
        expected = [trajectory.paper_id] if trajectory.paper_id is not None else None
    elif wanted is not None and trajectory.steps and trajectory.steps[0].action_text == document.search_action(trajectory.question):
        try:
            expected = document.top_papers(trajectory.steps[0].tool_calls, wanted)
        except PolicyError:
            expected = None
    else:
        expected = None
    if expected != reading.papers:
        return Mismatch(where, f"the papers read ({', '.join(reading.papers)}) are not the {scope} scope's ({expected})")
    return None


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
