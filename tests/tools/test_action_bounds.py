"""Everything an action makes the host or the policy's process hold is bounded per action and per
episode: tool-call records (arguments, errors, kept results) by their budgets in bytes as sent, the
host's reply by ``Limits.reply_cap``, and the time to encode and read that reply by the action's
wall limit. Each bound that cuts an action names itself."""

import hashlib
import time

import pytest

from paper_explorer.corpus import BM25Index, Corpus
from paper_explorer.corpus.schema import Paper, Section
from paper_explorer.tools import wire, worker
from paper_explorer.tools.episode_host import ActionResult
from paper_explorer.tools.limits import MAX_EVIDENCE, OUTCOME_CHARS
from paper_explorer.tools.paper_tools import ACTION_RETURNED_CHARS
from paper_explorer.tools.records import Evidence, Outcome, Returned, ToolCallRecord
from paper_explorer.tools.sandbox import Limits, Sandbox, longest_paper_id

ASTRAL = "\U0001f600"  # 4 bytes in UTF-8; 12 as the JSON escapes \ud83d\ude00
HANG_SECONDS = 600  # bounds a hang, never a speed


def flood(char: str, calls: str = "range(500)") -> str:
    """The issue's attack: calls whose arguments a record keeps at their largest (~9,000 characters)."""
    return (
        f"quote = {char * 990!r}\nfor i in {calls}:\n    try:\n"
        f"        submit({char * 1990!r}, evidence=[quote] * 7)\n    except ToolError:\n        pass\n"
    )


def record_bytes(calls: list[ToolCallRecord]) -> int:
    return sum(wire.size(call.model_dump()) for call in calls)


@pytest.mark.parametrize("char", ["x", ASTRAL])
def test_an_action_of_hundreds_of_calls_with_large_arguments_is_cut_at_its_record_budget(small_demo, index, char):
    """500 calls recorded 4.7 MB of arguments (52 MB on the wire with astral characters) and the
    action ran past its 4 s wall limit while the host encoded it and this process decoded it."""
    limits = Limits(wall_seconds=4.0)
    with Sandbox(small_demo, limits, index=index) as sandbox:
        started = time.perf_counter()
        result = sandbox.execute(flood(char))
        seconds = time.perf_counter() - started
        after = sandbox.execute("6 * 7")
    assert result.limit_hit == "records" and result.variables_lost and after.value == "42"
    assert record_bytes(result.tool_calls) <= limits.record_bytes
    last = result.tool_calls[-1]
    assert last.error.startswith("not run:") and "action's budget for tool-call records" in last.error
    assert all(call.error and not call.error.startswith("not run") for call in result.tool_calls[:-1])
    assert wire.size(result.to_json()) <= limits.reply_cap(longest_paper_id(small_demo))
    assert seconds < limits.wall_seconds and result.reply_cpu_seconds < 0.5


@pytest.mark.parametrize(
    "call",
    [
        "search('q', k='\\U0001F600' * 100)",  # refused by validation: a record with an error and no arguments
        "search(lambda: i)",  # refused by the host: arguments that cannot cross
        "read('\\U0001F600' * 300)",  # a tool's own error, echoing what it was given
    ],
)
def test_every_call_a_record_is_kept_of_counts_against_the_budget(small_demo, index, call):
    limits = Limits(record_kb=64, tool_calls=10**5)
    code = f"for i in range(20000):\n    try:\n        {call}\n    except ToolError:\n        pass\n"
    with Sandbox(small_demo, limits, index=index) as sandbox:
        result = sandbox.execute(code)
    assert result.limit_hit == "records" and 50 < len(result.tool_calls) < 20000
    assert record_bytes(result.tool_calls) <= limits.record_bytes and result.tool_calls[-1].error.startswith("not run:")


def test_an_episodes_records_are_bounded_across_its_actions(small_demo, index):
    limits = Limits(record_kb=256, episode_record_kb=600)
    with Sandbox(small_demo, limits, index=index) as sandbox:
        results = [sandbox.execute(flood("é")) for _ in range(4)]
        quiet = sandbox.execute("6 * 7")
        late = sandbox.execute(flood("é"))
    assert [result.limit_hit for result in results] == ["records", "records", "episode_records", "episode_records"]
    assert record_bytes([call for result in results for call in result.tool_calls]) <= limits.episode_record_bytes
    assert "episode's budget for tool-call records" in results[3].tool_calls[0].error and len(results[3].tool_calls) == 1
    assert quiet.limit_hit is None and quiet.value == "42"  # an action without calls still runs
    # Once it is spent, an action's first call is its last: one record of a few hundred bytes says why.
    assert late.limit_hit == "episode_records" and len(late.tool_calls) == 1 and record_bytes(late.tool_calls) < 1_000


def test_a_fresh_episode_on_a_reused_host_gets_the_whole_budget_again(small_demo, index):
    limits = Limits(record_kb=256, episode_record_kb=300)
    with Sandbox(small_demo, limits, index=index) as first:
        assert [first.execute(flood("x")).limit_hit for _ in range(2)] == ["records", "episode_records"]
        host = first.host_pid
    with Sandbox(small_demo, limits, index=index) as second:
        assert second.execute(flood("x")).limit_hit == "records" and second.host_pid == host


@pytest.fixture(scope="module")
def astral_corpus():
    """Papers whose every paragraph is astral characters: results as wide as they come."""
    papers = tuple(
        Paper(
            id=f"wide-{number}",
            title=f"Wide {number}",
            abstract="",
            sections=(Section(name="Body", paragraphs=tuple(f"word{number} common " + ASTRAL * 2_000 for _ in range(20))),),
        )
        for number in range(10)
    )
    corpus = Corpus(papers=papers)
    return corpus, BM25Index.build(corpus)


def test_large_astral_results_are_kept_within_the_record_budget_and_say_when_they_are_not(astral_corpus):
    corpus, index = astral_corpus
    limits = Limits(record_kb=200)
    code = "for i in range(40):\n    read('wide-%d' % (i % 10), section=0, page=i % 3)\n"
    with Sandbox(corpus, limits, index=index) as sandbox:
        result = sandbox.execute(code)
    assert result.limit_hit is None and len(result.tool_calls) == 40 and all(call.error is None for call in result.tool_calls)
    kept = [call.returned for call in result.tool_calls if call.returned.text is not None]
    assert kept and sum(len(returned.text) for returned in kept) <= ACTION_RETURNED_CHARS
    assert record_bytes(result.tool_calls) <= limits.record_bytes
    cut = [call.returned for call in result.tool_calls if call.returned.text is None]
    assert cut and any("budget for tool-call records" in returned.cut for returned in cut)
    assert all(returned.sha256 and returned.chars for returned in cut)


def test_the_wall_limit_holds_with_the_reply_encoded_and_read(small_demo, index):
    """With budgets raised far past their defaults, the host keeps time for the reply it will send,
    and what this process spends reading it counts: the action ends within its wall limit."""
    limits = Limits(
        wall_seconds=1.5,
        cpu_seconds=HANG_SECONDS,
        host_seconds=HANG_SECONDS,
        tool_calls=10**6,
        record_kb=262144,
        episode_record_kb=262144,
    )
    with Sandbox(small_demo, limits, index=index) as sandbox:
        sandbox.execute("1")
        started = time.perf_counter()
        result = sandbox.execute(flood(ASTRAL, "iter(int, 1)"))  # forever
        seconds = time.perf_counter() - started
    assert result.limit_hit == "wall_clock" and len(result.tool_calls) > 100
    assert seconds < limits.wall_seconds + 0.5  # the new worker's start is the slack


def test_reading_the_reply_counts_against_the_actions_wall_limit(small_demo, index, monkeypatch):
    """A reply this process takes long to read (made slow here) puts the action past its wall limit."""
    real = ActionResult.from_json

    def slow(data):
        time.sleep(1.2)
        return real(data)

    monkeypatch.setattr(ActionResult, "from_json", staticmethod(slow))
    with Sandbox(small_demo, Limits(wall_seconds=1.0), index=index) as sandbox:
        result = sandbox.execute("hits = search('learning rate')\n6 * 7")
        monkeypatch.setattr(ActionResult, "from_json", staticmethod(real))
        after = sandbox.execute("hits")
    assert result.limit_hit == "wall_clock" and result.value == "42" and result.variables_lost
    assert "NameError" in after.error


def test_the_widest_reply_an_action_can_make_is_within_its_cap():
    """Every field at its cap, every character at its widest on the wire (an escaped control
    character or lone surrogate: 6 bytes; an astral character: 4), the records at their budget."""
    limits = Limits(output_chars=5_000, record_kb=64)
    wide = "\x01\ud800" * 5_000
    records, used = [], 0
    while True:
        record = ToolCallRecord(name="search", arguments={"query": wide[:300]}, seconds=1.0, error=wide[:1000])
        record.returned = Returned(text=ASTRAL * 200, chars=200, sha256=hashlib.sha256((ASTRAL * 200).encode()).hexdigest(), cut=None)
        size = wire.size(record.model_dump())
        if used + size > limits.record_bytes:
            break
        records.append(record)
        used += size
    paper_id = "p" * 500
    result = ActionResult(
        stdout=wide[: limits.output_chars],
        value=worker.bounded(wide, limits.output_chars, "repr"),
        error=worker.bounded(wide, worker.ERROR_CHARS, "error"),
        traceback=worker.bounded(wide, worker.TRACEBACK_CHARS, "traceback"),
        tool_calls=records,
        outcome=Outcome(
            status="submitted",
            answer=wide[:OUTCOME_CHARS],
            evidence=[Evidence(paper_id=paper_id, section=10**6, paragraph=10**6, text="") for _ in range(MAX_EVIDENCE)],
        ),
    )
    envelope = {
        "op": "result",
        "limit": "wall_clock",
        "grace": 2.0,
        "tainted": True,
        "spent": dict.fromkeys(("started", "a", "b", "c"), 1e9),
    }
    frame = wire.encode_around(envelope, "result", wire.dumps(result.to_json()))
    assert len(frame) - wire.HEADER.size <= limits.reply_cap(len(paper_id))
    assert wire.decode(frame[wire.HEADER.size :])["result"]["stdout"] == ("\x01\ufffd" * 5_000)[: limits.output_chars]


def test_an_outcome_cites_paragraphs_with_their_text_though_the_reply_carries_none(small_demo, index):
    with Sandbox(small_demo, Limits(), index=index) as sandbox:
        result = sandbox.execute("hits = search('learning rate', k=2)\nsubmit('x', evidence=hits)")
    (first, second) = result.outcome.evidence
    for item in (first, second):
        assert item.text == small_demo.paper(item.paper_id).sections[item.section].paragraphs[item.paragraph] != ""


def test_records_of_many_small_values_are_charged_what_they_cost_to_hold(small_demo, index):
    """An empty list is 3 bytes on the wire and ~64 as a Python object: charged by bytes alone, an
    action of nested evidence held ~23 times its budget in the host and in this process."""
    import tracemalloc

    from paper_explorer.tools.paper_tools import record_cost

    limits = Limits(wall_seconds=30, cpu_seconds=30, host_seconds=30, tool_calls=10**4)
    code = (
        "inner = [[] for _ in range(620)]\nfor i in range(2000):\n    try:\n        submit('x', evidence=[inner] * 4)\n"
        "    except ToolError:\n        pass\n"
    )
    with Sandbox(small_demo, limits, index=index) as sandbox:
        tracemalloc.start()
        result = sandbox.execute(code)
        held = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
    assert result.limit_hit == "records"
    assert sum(record_cost(call.model_dump()) for call in result.tool_calls) <= limits.record_bytes
    assert held < 3 * limits.record_bytes, held  # what this process holds of them: of the budget's order, not 20 times it


def test_variables_that_fill_the_memory_limit_cost_the_worker_not_the_rest_of_the_episode(small_demo, index):
    """An action that fills the memory and keeps it bound: every later action failed to even parse
    (reported as a SyntaxError), so the episode could never end. The worker is now replaced."""
    with Sandbox(small_demo, Limits(memory_mb=256), index=index) as sandbox:
        filled = sandbox.execute("x = []\nwhile True:\n    x.append('a' * 1000 + str(len(x)))")
        replaced = sandbox.execute("x = None")
        after = sandbox.execute("6 * 7")
    assert filled.error.startswith("MemoryError")
    assert replaced.limit_hit == "memory" and replaced.variables_lost and "SyntaxError" not in (replaced.error or "")
    assert after.value == "42" and after.error is None
