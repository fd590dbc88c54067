"""``--policy memory-reader``: a paged recurrent memory reader (MemAgent, arXiv 2507.02259) in the
code agent's runtime, on the same questions, metrics and reports.

The control flow is fixed code; the model writes only memory updates and the final answer:

1. search for the question (scope ``search:K``; the top K distinct papers, best first), or take
   the question's own paper (scope ``paper``: an oracle, recorded as such);
2. read their outlines, then each paper whole, through the sandbox's ``read``, and build the
   document from the host's records of what each call returned (``agent.memory_reader.document``,
   handed each step's records by ``Policy.observed``), never from an observation's text;
3. page the document in the model's tokens (``agent.memory_reader.paging``) and, page by page,
   prompt the model with the problem, its memory so far and the page; what it writes is the new
   memory (cut at ``memory_tokens``), or the keep sentinel, which keeps the memory as it was;
   ReadTwice (``passes`` 2) reads every page again starting from the first pass's memory;
4. prompt it with the problem and the memory alone for the answer, and submit that ("Unanswerable"
   is an abstention, as QASPER scores one). An answer
   that is empty or cut at ``answer_tokens`` is no answer: the episode ends ``no_answer``
   (scored zero, counted).

The model is a backend policy (``hf`` or ``openai``) called through ``Policy.complete``: the
same loading, adapters, server checks, retries and records as the code agent. A token budget
(``token_budget``) bounds every token the episode's model calls take, prompts included: before
each update the reader checks that the update at its largest and the final answer at its
largest still fit, and leaves the rest of the document unread (counted) when they do not.

Everything the reader did is recorded on the last step (``StepPolicyInfo.reading``): each
update's page and token range, the page's digest, memory tokens in and out, whether the cap cut
it or it was kept, the prompt's digest and the generation's statistics; so ``check-parity``
can rebuild every prompt from the trajectory alone.
"""

from __future__ import annotations

import copy
from typing import Any

from pydantic import SerializeAsAny

from paper_explorer.agent.memory_reader import document
from paper_explorer.agent.memory_reader.paging import Document, Paging, encode_document, page_document, verbatim_document
from paper_explorer.agent.memory_reader.prompts import (
    ReaderPrompts,
    answer_of,
    final_prompt,
    is_keep,
    memory_ids,
    problem_text,
    update_prompt,
)
from paper_explorer.agent.memory_reader.settings import ReaderRecipe, parse_scope
from paper_explorer.agent.policies.base import EpisodeStart, NoAnswer, Policy, PolicyError, Reply, action, steps_taken
from paper_explorer.agent.policies.records import Inline, PolicySettings, SettingsRecord
from paper_explorer.agent.served import ids_sha256, reply_sha256, served_record
from paper_explorer.agent.trajectory import MemoryAnswer, MemoryUpdate, Reading, Step
from paper_explorer.corpus.setting_names import setting
from paper_explorer.tools.records import ToolCallRecord

SUBMIT_CHARS = 2000  # submit()'s longest answer
UNANSWERABLE = "unanswerable"  # the answer the final prompt asks for when the memory does not answer


class MemoryReaderSettings(PolicySettings):
    """What a trajectory records of the reader: its backend's own record and its recipe (the
    config's ``ReaderRecipe`` fields), side by side, as ``memory_reader.parity`` reads them back."""

    backend: str
    backend_settings: Inline[SerializeAsAny[SettingsRecord]]
    recipe: Inline[ReaderRecipe]  # the recipe's fields alone, not the backend's that its config holds too
    oracle: bool  # scope paper: it reads the question's own paper
    prompts_sha256: str


class MemoryReader(Policy):
    name = "memory-reader"

    def __init__(self, backend: Policy, *, recipe: ReaderRecipe, max_steps: int, prompts: ReaderPrompts | None = None) -> None:
        if backend.renderer is None:
            raise PolicyError("the memory reader's backend has no tokenizer")
        self.backend, self.recipe = backend, recipe
        self.prompts = prompts or ReaderPrompts.named(recipe.prompts)
        self.tokens = backend.renderer  # what pages and prompts are made of; the loop records no conversation prompt
        self.papers_wanted = parse_scope(recipe.scope)
        self.max_steps = max_steps  # the episode's: a plan that needs more says so before it runs out
        self.reading: Reading | None = None

    def settings(self) -> MemoryReaderSettings:
        return MemoryReaderSettings(
            backend=self.backend.name,
            backend_settings=self.backend.settings(),
            recipe=self.recipe,
            oracle=self.recipe.scope == "paper",
            prompts_sha256=self.prompts.sha256,
        )

    def prompt_template_sha256(self) -> str:
        return self.prompts.sha256

    def preflight(self) -> str | None:
        return self.backend.preflight()

    def for_episode(self) -> MemoryReader:
        episode = copy.copy(self)
        episode.backend = self.backend.for_episode()
        return episode

    def start(self, episode: EpisodeStart) -> None:
        super().start(episode)
        self.backend.start(episode)
        self.reads: document.Reads | None = None  # set once the papers to read are known
        self.calls: list[ToolCallRecord] = []  # the last step's tool calls, as the host recorded them
        self.reading = None
        self.submitted = False
        self.verbatim = False  # this episode pages the question's own document as given

    def observed(self, step: Step) -> None:
        self.calls = step.tool_calls

    def act(self, messages: list[dict[str, str]]) -> Reply:
        step = steps_taken(messages)
        if self.submitted:
            refused = next((call.error for call in reversed(self.calls) if call.error is not None), "no reason recorded")
            raise NoAnswer(f"submit refused the answer: {refused}")
        if step == 0:
            if self._reads_verbatim():
                # its outline through the sandbox, so the run shows which document it read; then
                # the pages, verbatim, in this process
                assert self.episode.paper_id is not None  # a question's own document is its paper's context
                self.verbatim = True
                return Reply(document.outlines_action([self.episode.paper_id]))
            return self._first()
        if self.verbatim:
            failed = next((call.error or "" for call in self.calls if call.error is not None or call.name != "read"), None)
            if failed is not None or not self.calls:
                raise PolicyError(f"the question's own document could not be opened: {failed or 'the step called no tool'}")
            return self._answer()
        if self.reads is None:  # the search's step: its hits name the papers
            assert self.papers_wanted is not None
            self.reads = document.Reads(document.top_papers(self.calls, self.papers_wanted))
        else:
            self.reads.take(self.calls)
        following = self.reads.next_action()
        if following is None:
            return self._answer()
        if step + 2 > self.max_steps:  # this read, then the answer
            raise PolicyError(
                f"the papers are not read whole within the episode's {self.max_steps} steps; "
                f"raise {setting('episode.max_steps')} (each read takes about {document.BATCH_CHARS:,} characters of a paper)"
            )
        return Reply(following)

    def finish(self, messages: list[dict[str, str]]) -> dict[str, Any] | None:
        return {"reading": self.reading} if self.reading is not None else None

    def _reads_verbatim(self) -> bool:
        """Whether this episode pages the question's own document as given (``document``: verbatim,
        or auto with a question that brings one) rather than papers read through the tools."""
        if self.recipe.document == "sections":
            return False
        if self.episode.document is None:
            if self.recipe.document == "verbatim":
                raise PolicyError(
                    f"{setting('policy.document', 'verbatim')} pages a question's own document (a LongBench or MemAgent "
                    f"record's context); this question brings none: use {setting('policy.document', 'auto')} or sections"
                )
            return False
        return True

    def _first(self) -> Reply:
        if self.papers_wanted is not None:
            return Reply(document.search_action(self.episode.question))
        if self.episode.paper_id is None:
            raise PolicyError("--scope paper reads the question's own paper; a question given as text has none (use search:K)")
        self.reads = document.Reads([self.episode.paper_id])
        outlines = self.reads.next_action()
        assert outlines is not None  # a paper to read: its outline comes first
        return Reply(outlines)

    def _answer(self) -> Reply:
        if self.verbatim:
            assert self.episode.document is not None and self.episode.paper_id is not None
            reader = Reader(self, verbatim_document(self.episode.document, self.tokens), [self.episode.paper_id], verbatim=True)
        else:
            reader = Reader(self, encode_document(self.reads.sections() if self.reads is not None else [], self.tokens, self.prompts))
        answer = reader.run()
        if abstains(answer):
            self.submitted = True
            return Reply(action(f"abstain({document.literal('the memory does not answer the question')})"))
        if len(answer) > SUBMIT_CHARS:
            raise NoAnswer(f"the answer is {len(answer)} characters; submit() takes at most {SUBMIT_CHARS}")
        self.submitted = True
        return Reply(action(f"submit({document.literal(answer)}, evidence=[])"))


class Reader:
    """One episode's paging, memory updates and final answer, recorded as they happen (so an
    episode that fails halfway keeps what was done)."""

    def __init__(self, policy: MemoryReader, document: Document, papers: list[str] | None = None, *, verbatim: bool = False) -> None:
        self.policy, self.recipe, self.prompts, self.tokens = policy, policy.recipe, policy.prompts, policy.tokens
        self.document = document
        self.paging: Paging = page_document(
            self.document,
            page_tokens=self.recipe.page_tokens,
            outlines=self.recipe.outlines and not verbatim,  # a verbatim document has no sections to outline
            outline_sections=self.recipe.outline_sections,
            renderer=self.tokens,
            prompts=self.prompts,
            balanced=self.recipe.outline_fill == "balanced",
        )
        self.problem = self.tokens.text(problem_text(policy.episode.question, self.recipe.prompts))
        if papers is None:
            papers = list(policy.reads.paper_ids) if policy.reads is not None else []
        self.reading = policy.reading = Reading(
            scope=self.recipe.scope,
            papers=papers,
            document="verbatim" if verbatim else None,
            document_text=document.text if verbatim else None,
            document_sha256=ids_sha256(document.ids) if verbatim else None,
            document_tokens=self.document.tokens,
            read_tokens=0,
            unread_tokens=self.document.tokens,
            pages=len(self.paging.pages),
            passes=self.recipe.passes,
            token_budget=self.recipe.token_budget,
        )

    def run(self) -> str:
        memory: str | None = None
        for pass_index in range(1, self.recipe.passes + 1):
            for page in self.paging.pages:
                if not self._affordable(pass_index, page):
                    return self._final(memory)
                memory = self._update(pass_index, page, memory)
        return self._final(memory)

    def _affordable(self, pass_index: int, page) -> bool:
        """Whether the update of ``page`` and the final answer, both at their largest, fit the budget."""
        budget = self.recipe.token_budget
        if budget is None:
            return True
        largest_memory = [self.tokens.end_of_turn] * self.recipe.memory_tokens
        update = update_prompt(
            self.tokens,
            self.prompts,
            problem_ids=self.problem,
            memory_ids=largest_memory,
            outline_ids=page.outline_ids,
            page_ids=page.ids(self.document),
            sentinel=self.recipe.keep_sentinel or None,
        )
        cost = len(update) + self.recipe.memory_tokens + self._final_cost()
        if self.reading.model_tokens + cost <= budget:
            return True
        self.reading.stopped = (
            f"the token budget of {budget}: pass {pass_index}, page {page.index + 1} of {len(self.paging.pages)} would bring the episode to "
            f"{self.reading.model_tokens + cost} tokens at most"
        )
        return False

    def _final_cost(self) -> int:
        largest = max(self.recipe.memory_tokens, len(memory_ids(self.tokens, self.prompts, None, self.recipe.memory_tokens)))
        prompt = final_prompt(self.tokens, self.prompts, problem_ids=self.problem, memory_ids=[self.tokens.end_of_turn] * largest)
        return len(prompt) + self.recipe.answer_tokens

    def _update(self, pass_index: int, page, memory: str | None) -> str | None:
        held = memory_ids(self.tokens, self.prompts, memory, self.recipe.memory_tokens)
        prompt = update_prompt(
            self.tokens,
            self.prompts,
            problem_ids=self.problem,
            memory_ids=held,
            outline_ids=page.outline_ids,
            page_ids=page.ids(self.document),
            sentinel=self.recipe.keep_sentinel or None,
        )
        reply = self.policy.backend.complete(prompt, max_new_tokens=self.recipe.memory_tokens)
        kept = is_keep(reply.text, self.recipe.keep_sentinel or None)
        after = memory if kept else capped(self.tokens, reply.text, self.recipe.memory_tokens)
        self.reading.updates.append(
            MemoryUpdate(
                pass_index=pass_index,
                page=page.index,
                start=page.start,
                end=page.end,
                page_sha256=ids_sha256(page.ids(self.document)),
                outline_tokens=page.outline_tokens,
                memory_tokens_in=len(held),
                memory_tokens_out=len(memory_ids(self.tokens, self.prompts, after, self.recipe.memory_tokens)),
                hit_cap=bool(reply.generation and reply.generation.hit_cap) or after != reply.text and not kept,
                kept=kept,
                memory=after,
                written=reply.text if kept or after != reply.text else None,
                served=self._served(prompt, reply),
                generation=reply.generation,
            )
        )
        self._spent(reply, prompt)
        self.reading.read_tokens = max(self.reading.read_tokens, page.end)
        self.reading.unread_tokens = self.document.tokens - self.reading.read_tokens
        return after

    def _final(self, memory: str | None) -> str:
        # A budget below even the final call's largest cost (no page was affordable) must not be
        # overspent by that call: the episode ends with no answer, the budget named as the reason.
        budget = self.recipe.token_budget
        if budget is not None and self.reading.model_tokens + self._final_cost() > budget:
            self.reading.stopped = self.reading.stopped or f"the token budget of {budget}"
            raise NoAnswer(
                f"the token budget of {budget} does not cover the final answer "
                f"({self.reading.model_tokens + self._final_cost()} tokens at most)"
            )
        held = memory_ids(self.tokens, self.prompts, memory, self.recipe.memory_tokens)
        prompt = final_prompt(self.tokens, self.prompts, problem_ids=self.problem, memory_ids=held)
        reply = self.policy.backend.complete(prompt, max_new_tokens=self.recipe.answer_tokens)
        answer, invalid = taken_answer(self.tokens, reply.text, reply.generation, self.recipe.answer_tokens, self.recipe.answer_from)
        self.reading.answer = MemoryAnswer(
            text=reply.text,
            answer=None if invalid else answer,
            invalid=invalid,
            memory_tokens_in=len(held),
            served=self._served(prompt, reply),
            generation=reply.generation,
        )
        self._spent(reply, prompt)
        if invalid is not None or answer is None:
            raise NoAnswer(f"the final answer was {invalid}")
        return answer

    def _served(self, prompt: list[int], reply: Reply):
        return served_record(
            prompt,
            self.tokens.fingerprint,
            "policy",
            reply=reply_sha256(reply.text, None),
            keep_ids=self.policy.episode.record_ids,  # each call's prompt is its own: kept whole
            server_ids=reply.server_prompt_ids,
            server_tokens=reply.server_prompt_tokens,
            sampled=reply.sampled if self.policy.episode.record_sampled else None,
        )

    def _spent(self, reply: Reply, prompt: list[int]) -> None:
        self.reading.model_tokens += len(prompt) + written_tokens(self.tokens, reply.text, reply.generation)


def abstains(answer: str) -> bool:
    """Whether the final answer is the reader's abstention: the final prompt asks for "unanswerable"
    when the memory holds no answer, and it counts as one (QASPER scores an abstention as this very answer)."""
    return answer.strip().rstrip(".").lower() == UNANSWERABLE


def taken_answer(tokens, text: str, generation, answer_tokens: int, answer_from: str) -> tuple[str | None, str | None]:
    """The answer a final call's text gives under the recipe, and why there is none (None: there is
    one). A text cut at the cap is no answer; so is an empty one, or, under ``answer_from = "boxed"``,
    one without a complete ``\\boxed{}`` (MemAgent's evaluation scores it 0)."""
    # a server may write past max_tokens and say it did not: the text itself is counted too
    cut = bool(generation and generation.hit_cap) or len(tokens.text(text)) > answer_tokens
    if cut:
        return None, f"cut at the answer cap of {answer_tokens} tokens"
    answer = answer_of(text, answer_from)  # only of a text within the cap: nothing of one past it is taken
    if answer is None:
        return None, "not in a \\boxed{}" if answer_from == "boxed" and text.strip() else "empty"
    return answer, None


def written_tokens(tokens, text: str, generation) -> int:
    """What a call wrote, in tokens: the backend's count, or the text's own where that is more (a
    server that did not count, or that wrote past max_tokens and said less)."""
    claimed = generation.generated_tokens if generation is not None and generation.generated_tokens is not None else 0
    return max(claimed, len(tokens.text(text)))


def capped(tokens, text: str, cap: int) -> str:
    """An update's text as the memory: itself, or, when its tokens run past the cap (a server that
    ignored max_tokens), the text of its first ``cap`` tokens, so the record stays bounded too."""
    ids = tokens.text(text)
    return text if len(ids) <= cap else tokens.decode(ids[:cap])


__all__ = ["MemoryReader"]
