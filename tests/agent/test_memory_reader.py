"""The memory reader end to end in one process, against a fake OpenAI server that decodes each
prompt it is sent and answers as a script says: the keep sentinel, the memory cap, prompt i
holding memory i-1, the final prompt without page text, ReadTwice, boxed and cut answers, the
token budget, and the parity check that rebuilds every prompt from the trajectory."""

import threading

import pytest

from paper_explorer.agent.memory_reader.parity import check_reading, reading_of
from paper_explorer.agent.memory_reader.prompts import ReaderPrompts
from paper_explorer.agent.memory_reader.settings import READS_PER_PAPER, plan_steps
from paper_explorer.agent.policies import make_config, make_policy
from paper_explorer.agent.policies.base import last_value
from paper_explorer.agent.renderer import ChatRenderer
from paper_explorer.agent.runner import EpisodeRunner
from paper_explorer.agent.served import ids_sha256, reply_sha256
from paper_explorer.agent.trajectory import EpisodeConfig
from paper_explorer.corpus import BM25Index
from paper_explorer.tools.records import Evidence
from tests.agent.test_openai_policy import FakeServer

SENTINEL = "<KEEP_MEMORY>"
UPDATE_MARK, FINAL_MARK = "Updated memory:", "Your answer:"  # how each prompt of the prompts file ends
CODE_AGENT_SUBMIT = '```python\nsubmit("Unanswerable", evidence=[])\n```'  # any other prompt: a code agent's


class ReaderServer:
    """A fake vLLM for the memory reader. Each request's prompt ids are decoded and kept
    (``calls``: kind, ids, text); an update is answered by ``update(number, text)`` and the final
    call by ``final(text)``, each returning the text, or (text, cut) where cut says it stopped at
    max_tokens; any other prompt (a code agent's) by a submit. The prompt's ids come back as vLLM returns them (``return_token_ids``)."""

    def __init__(self, renderer: ChatRenderer, update=None, final=None):
        self.renderer, self.calls, self.lock = renderer, [], threading.Lock()
        self.update = update or (lambda number, text: f"notes {number}")
        self.final = final or (lambda text: "\\boxed{3e-5}")
        self.fake = FakeServer(models=["served"], respond=self.respond, return_ids=True)
        self.url = self.fake.url

    def respond(self, body):
        ids = body["prompt"]
        text = self.renderer.decode(ids)
        kind = "update" if UPDATE_MARK in text[-200:] else "final" if FINAL_MARK in text[-200:] else "unknown"
        with self.lock:
            number = sum(1 for call in self.calls if call[0] == "update")
            self.calls.append((kind, ids, text))
        reply = self.update(number, text) if kind == "update" else self.final(text) if kind == "final" else CODE_AGENT_SUBMIT
        written, cut = reply if isinstance(reply, tuple) else (reply, False)
        count = body["max_tokens"] if cut else len(self.renderer.text(written))
        choice = {"text": written, "finish_reason": "length" if cut else "stop"}
        if body.get("return_token_ids"):
            choice["prompt_token_ids"] = ids
        return 200, {"choices": [choice], "usage": {"prompt_tokens": len(ids), "completion_tokens": count}}

    def prompts(self, kind: str) -> list[list[int]]:
        return [ids for called, ids, _ in self.calls if called == kind]

    def close(self):
        self.fake.server.shutdown()


@pytest.fixture(scope="module")
def index(small_demo):
    return BM25Index.build(small_demo)


@pytest.fixture(scope="module")
def renderer(tiny_tokenizer):
    return ChatRenderer.from_directory(tiny_tokenizer)


@pytest.fixture
def serve(renderer):
    servers = []

    def start(**answers) -> ReaderServer:
        servers.append(ReaderServer(renderer, **answers))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def read(small_demo, index, server, tiny_tokenizer, question=0, **recipe):
    """One memory-reader episode of the small demo's question ``question`` against ``server``."""
    settings = {"scope": "paper", "page_tokens": 200, "memory_tokens": 24, "answer_tokens": 16, **recipe}
    config = make_config("memory-reader", backend="openai", base_url=server.url, model="served", tokenizer=tiny_tokenizer, **settings)
    policy = make_policy(config)
    policy.preflight()
    episode = EpisodeConfig(max_steps=plan_steps(settings["scope"]))  # the plan fits its own budget
    asked = small_demo.questions[question]
    return EpisodeRunner(small_demo, index, policy, episode).run(asked.text, asked)


def contains(ids: list[int], part: list[int]) -> bool:
    return any(ids[i : i + len(part)] == part for i in range(len(ids) - len(part) + 1))


def test_prompt_i_holds_memory_i_minus_1_and_the_sentinel_keeps_it(small_demo, index, serve, tiny_tokenizer, renderer):
    server = serve(update=lambda number, text: SENTINEL if number % 3 == 2 else f"notes {number}")
    trajectory = read(small_demo, index, server, tiny_tokenizer)
    reading = reading_of(trajectory)
    assert trajectory.outcome.status == "submitted" and trajectory.outcome.answer == "3e-5"
    updates, sent = reading.updates, server.prompts("update")
    assert len(updates) == reading.pages == len(sent) > 4
    assert [update.served.sha256 for update in updates] == [ids_sha256(ids) for ids in sent]  # what was recorded is what was sent
    assert all(update.served.server_sha256 == update.served.sha256 for update in updates)
    no_memory = renderer.text(ReaderPrompts.load().no_memory)
    assert contains(sent[0], no_memory) and updates[0].memory_tokens_in == len(no_memory)
    for number, (before, update, prompt) in enumerate(zip(updates, updates[1:], sent[1:]), 1):
        held = renderer.text(before.memory)
        assert contains(prompt, held) and update.memory_tokens_in == len(held)  # prompt i holds memory i-1
        if number % 3 == 2:
            assert update.kept and update.memory == before.memory and update.memory_tokens_out == update.memory_tokens_in
        else:
            assert not update.kept and update.memory == f"notes {number}"
    assert contains(server.prompts("final")[0], renderer.text(updates[-1].memory))
    assert check_reading(trajectory, renderer) is None


def test_an_edited_memory_page_or_answer_prompt_fails_the_parity_check(small_demo, index, serve, tiny_tokenizer, renderer):
    trajectory = read(small_demo, index, serve(), tiny_tokenizer)
    assert check_reading(trajectory, renderer) is None
    edited = trajectory.model_copy(deep=True)
    reading_of(edited).updates[1].memory = "notes 9"  # was "notes 1": as many tokens, other ones
    mismatch = check_reading(edited, renderer)
    assert mismatch is not None and "memory update 2" in mismatch.where and "digest differs" in mismatch.what
    reading_of(edited).updates[1].served.reply_sha256 = reply_sha256("notes 9", None)  # a forger who knows the digest
    mismatch = check_reading(edited, renderer)
    assert mismatch is not None and "memory update 3" in mismatch.where and "not the one the trajectory rebuilds" in mismatch.what
    edited = trajectory.model_copy(deep=True)
    reading_of(edited).updates[0].page_sha256 = "0" * 64
    mismatch = check_reading(edited, renderer)
    assert mismatch is not None and "memory update 1" in mismatch.where and "recorded page" in mismatch.what
    edited = trajectory.model_copy(deep=True)
    reading_of(edited).updates[-1].memory = "notes 0"
    reading_of(edited).updates[-1].served.reply_sha256 = reply_sha256("notes 0", None)
    mismatch = check_reading(edited, renderer)
    assert mismatch is not None and "final answer" in mismatch.where
    edited = trajectory.model_copy(deep=True)
    reading_of(edited).unread_tokens += 100  # a figure the scores report: as checked as a prompt
    mismatch = check_reading(edited, renderer)
    assert mismatch is not None and "unread" in mismatch.what


def test_the_memory_never_exceeds_its_cap(small_demo, index, serve, tiny_tokenizer, renderer):
    long = " ".join(f"fact{n}" for n in range(200))  # far past the cap, as a model that ignores max_tokens would write
    server = serve(update=lambda number, text: (long, True))
    trajectory = read(small_demo, index, server, tiny_tokenizer, memory_tokens=24)
    updates = reading_of(trajectory).updates
    assert all(update.hit_cap and update.memory_tokens_out == 24 for update in updates)
    assert all(update.memory_tokens_in == 24 for update in updates[1:])
    cut = renderer.text(long)[:24]
    assert all(contains(prompt, cut) and not contains(prompt, renderer.text(long)[:25]) for prompt in server.prompts("update")[1:])
    assert contains(server.prompts("final")[0], cut) and reading_of(trajectory).answer.memory_tokens_in == 24
    assert check_reading(trajectory, renderer) is None


def test_the_final_prompt_holds_no_page_text(small_demo, index, serve, tiny_tokenizer):
    server = serve()
    trajectory = read(small_demo, index, server, tiny_tokenizer)
    assert trajectory.outcome.status == "submitted"
    ((_, _, final),) = [call for call in server.calls if call[0] == "final"]
    paper = small_demo.paper(trajectory.paper_id)
    texts = [paper.abstract] + [paragraph for section in paper.sections for paragraph in section.paragraphs]
    assert texts and all(text[:40] not in final for text in texts if len(text) > 40)
    assert trajectory.question in final and "notes" in final
    pages = [text for kind, _, text in server.calls if kind == "update"]
    assert any(texts[1][:40] in page for page in pages)  # the same check finds page text where there is some


def test_read_twice_starts_its_second_pass_from_the_first_pass_memory(small_demo, index, serve, tiny_tokenizer, renderer):
    server = serve()
    trajectory = read(small_demo, index, server, tiny_tokenizer, passes=2)
    reading = reading_of(trajectory)
    first = [update for update in reading.updates if update.pass_index == 1]
    second = [update for update in reading.updates if update.pass_index == 2]
    assert len(first) == len(second) == reading.pages
    where = [(update.page, update.start, update.end, update.page_sha256) for update in first]
    assert where == [(update.page, update.start, update.end, update.page_sha256) for update in second]  # the same pages again
    opening = server.prompts("update")[len(first)]
    last_memory = renderer.text(first[-1].memory)
    assert contains(opening, last_memory) and second[0].memory_tokens_in == len(last_memory)
    assert not contains(opening, renderer.text(ReaderPrompts.load().no_memory))
    assert reading.read_tokens == reading.document_tokens and reading.unread_tokens == 0
    assert check_reading(trajectory, renderer) is None


def test_a_boxed_answer_is_submitted(small_demo, index, serve, tiny_tokenizer):
    server = serve(final=lambda text: "From my notes the rate was \\boxed{3e-5}, I think.")
    trajectory = read(small_demo, index, server, tiny_tokenizer, answer_tokens=256)  # the fake server writes whole texts
    answer = reading_of(trajectory).answer
    assert trajectory.outcome.status == "submitted" and trajectory.outcome.answer == "3e-5"
    assert answer.answer == "3e-5" and answer.invalid is None and answer.text.startswith("From my notes")


def test_an_outcome_that_is_not_the_answer_the_reader_took_fails_the_parity_check(small_demo, index, serve, tiny_tokenizer, renderer):
    """What is scored is the outcome: an edit of it alone (the answer, an abstention, evidence) left
    every prompt and the reading as they were, and passed."""
    trajectory = read(small_demo, index, serve(), tiny_tokenizer)
    assert trajectory.outcome.answer == "3e-5" and check_reading(trajectory, renderer) is None
    edits = [
        {"answer": "5e-3"},
        {"status": "abstained", "answer": None, "reason": "the memory does not answer the question"},
        {"evidence": [Evidence(paper_id=trajectory.paper_id, section=0, paragraph=0, text="x")]},
    ]
    for change in edits:
        edited = trajectory.model_copy(update={"outcome": trajectory.outcome.model_copy(update=change)})
        mismatch = check_reading(edited, renderer)
        assert mismatch is not None and "the outcome was altered" in mismatch.what and "the answer '3e-5'" in mismatch.what
    abstaining = read(small_demo, index, serve(final=lambda text: "Unanswerable."), tiny_tokenizer)
    assert abstaining.outcome.status == "abstained" and check_reading(abstaining, renderer) is None
    submitted = abstaining.outcome.model_copy(update={"status": "submitted", "answer": "Unanswerable.", "reason": None})
    mismatch = check_reading(abstaining.model_copy(update={"outcome": submitted}), renderer)
    assert mismatch is not None and "gave an abstention" in mismatch.what


@pytest.mark.parametrize(
    ("final", "why"),
    [(("\\boxed{3e-5} and then some more words", True), "cut at the answer cap of 16 tokens"), ("  ", "empty")],
)
def test_an_answer_cut_at_its_cap_or_empty_ends_no_answer(small_demo, index, serve, tiny_tokenizer, renderer, final, why):
    server = serve(final=lambda text: final)
    trajectory = read(small_demo, index, server, tiny_tokenizer)
    answer = reading_of(trajectory).answer
    assert trajectory.outcome.status == "no_answer" and trajectory.outcome.answer is None
    assert answer.invalid == why and answer.answer is None and why in trajectory.outcome.reason
    assert check_reading(trajectory, renderer) is None  # a failed answer's prompt is recorded all the same


def test_search_scope_reads_the_top_distinct_papers_in_rank_order(small_demo, index, serve, tiny_tokenizer, renderer):
    trajectory = read(small_demo, index, serve(), tiny_tokenizer, scope="search:2", page_tokens=800)
    reading = reading_of(trajectory)
    ranked = list(dict.fromkeys(last_value([{"role": "user", "content": trajectory.steps[0].observation}])))  # the hits' paper ids
    assert reading.papers == ranked[:2] and len(set(reading.papers)) == 2
    assert len(trajectory.steps) == 5  # search, outlines, one read step per (short) paper, submit
    assert check_reading(trajectory, renderer) is None


def test_a_token_budget_leaves_the_rest_unread_and_counted(small_demo, index, serve, tiny_tokenizer, renderer):
    server = serve()
    trajectory = read(small_demo, index, server, tiny_tokenizer, token_budget=3000)
    reading = reading_of(trajectory)
    sent = sum(len(ids) for _, ids, _ in server.calls)
    assert trajectory.outcome.status == "submitted" and reading.model_tokens <= 3000
    assert 0 < len(reading.updates) < reading.pages and reading.stopped.startswith("the token budget of 3000")
    assert reading.read_tokens == reading.updates[-1].end and reading.unread_tokens == reading.document_tokens - reading.read_tokens > 0
    written = sum(update.generation.generated_tokens for update in reading.updates) + reading.answer.generation.generated_tokens
    assert reading.model_tokens == sent + written  # every token of every call, prompts included
    assert check_reading(trajectory, renderer) is None


def test_a_budget_below_the_final_call_ends_no_answer_without_calling_the_model(small_demo, index, serve, tiny_tokenizer):
    server = serve()
    trajectory = read(small_demo, index, server, tiny_tokenizer, token_budget=50)
    reading = reading_of(trajectory)
    assert trajectory.outcome.status == "no_answer" and "does not cover the final answer" in trajectory.outcome.reason
    assert server.calls == [] and reading.model_tokens == 0 and reading.unread_tokens == reading.document_tokens


def test_an_answer_or_question_holding_a_code_fence_is_submitted_whole(small_demo, index, serve, tiny_tokenizer):
    fenced = "use ```python\nprint(1)\n``` then 3e-5"  # a fence inside the action would end its code block early
    trajectory = read(small_demo, index, serve(final=lambda text: fenced), tiny_tokenizer, answer_tokens=256)
    assert trajectory.outcome.status == "submitted" and trajectory.outcome.answer == fenced
    asked = small_demo.questions[0].model_copy(update={"text": "Which ```rate``` is used?"})
    config = make_config(
        "memory-reader", backend="openai", base_url=serve().url, model="served", tokenizer=tiny_tokenizer, scope="search:1"
    )
    episode = EpisodeConfig(max_steps=plan_steps("search:1"))
    searched = EpisodeRunner(small_demo, index, make_policy(config), episode).run(asked.text, asked)
    assert searched.outcome.status == "submitted" and searched.steps[0].error is None


def test_a_preset_fills_what_was_not_given_and_the_plan_sets_the_steps():
    from paper_explorer.agent.config import EvalConfig

    config = EvalConfig(policy={"name": "memory-reader", "backend": "hf", "preset": "memagent-readtwice", "page_tokens": 256})
    policy = config.policy
    assert (policy.passes, policy.memory_tokens, policy.keep_sentinel, policy.outline_sections) == (2, 1024, SENTINEL, 24)
    assert policy.page_tokens == 256 and config.episode.seed == 801  # a setting given wins; the recipe's seed
    # search, outlines, READS_PER_PAPER read steps for each of the 3 papers, submit, one spare
    assert config.episode.max_steps == plan_steps("search:3") == 4 + 3 * READS_PER_PAPER
    given = EvalConfig(policy={"name": "memory-reader", "backend": "hf", "scope": "paper"}, episode={"max_steps": 9})
    assert given.episode.max_steps == 9 and plan_steps("paper") == 3 + READS_PER_PAPER
    assert EvalConfig(policy={"name": "openai"}).episode.max_steps == EpisodeConfig().max_steps  # other policies untouched
