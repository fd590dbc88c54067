"""A reused episode host is a fresh one to its next episode: in what its caches hold, in how fast
they answer, and in the memory it keeps (tools.process_caches)."""

import pickle
import statistics

import pytest

from paper_explorer.corpus import BM25Index
from paper_explorer.tools import process_caches, registry
from paper_explorer.tools import sandbox as sandbox_module
from paper_explorer.tools.episode_host import IdleHosts
from paper_explorer.tools.sandbox import Limits, Sandbox
from paper_explorer.tools.zygote import Zygote
from tests.tools.host_census import CENSUS
from tests.tools.own_documents import A, mixed_corpus

LIMITS = Limits(wall_seconds=120, cpu_seconds=120, host_seconds=120, tool_calls=10_000, record_kb=8192, episode_record_kb=65536)
# State of the episode in flight, not a cache: what the census finds there is gone at reset.
PER_EPISODE = ("paper_explorer.tools.episode_host._TIMERS.clocks",)


def noisy_actions(paper_ids: list[str]) -> list[str]:
    """An episode of many distinct calls, each tool's every path: patterns (valid, invalid, too
    complex), mistyped ids and sections, queries in several scripts, quotes found and not, argument
    errors, arguments that cannot cross, a limit hit and a fresh worker, an outcome."""
    first = paper_ids[0]
    return [
        f"""
ids = {paper_ids!r}
for i in range(len(ids) * 2):
    pid = ids[i % len(ids)]
    for call in (
        lambda: extract(pid, "(?:[a-z]{{1,8}}\\\\s){{1,%d}}(?:%d|x)" % (20 + i % 5, i), k=3, regex=True),
        lambda: extract(pid, "[a-q][^u-z]{{%d}}y%d" % (10 + i % 4, i), k=20, regex=True),
        lambda: extract(pid, "(unclosed %d" % i, regex=True),
        lambda: extract(pid, "model data %d \\U0001F600 δ" % i, k=2),
        lambda: read(pid[:-1] + "zq%d" % i),
        lambda: read(pid, section="no such section %d" % i),
        lambda: read(pid, section=i % 3, page=i % 2),
        lambda: search("query %d learning rate Ωμέγα \\U0001F600" % i, k=1 + i % 7, paper_id=pid if i % 2 else None),
        lambda: search("x", paper_id=pid + "%d" % i),
        lambda: extract(pid + "-typo-%d" % i, "words"),
        lambda: submit("x", evidence=["a quote that is nowhere %d in the corpus" % i, [pid, 99, i]]),
        lambda: submit("x", evidence=[{{"paper_id": pid}}]),
        lambda: search(query=i),
        lambda: read(pid, bogus=i),
        lambda: search("q", k=lambda: i),
        lambda: search("q" * (300000 + i)),
    ):
        try:
            call()
        except ToolError:
            pass
""",
        "print('\\U0001F600' * 10**6)",  # an output limit: a fresh worker for the rest
        f"hits = search('learning rate')\nsubmit('an answer', evidence=[hits[0], [{first!r}, 0, 0]])",
        "abstain('too late')",
    ]


def census_server(corpus, index, monkeypatch) -> Zygote:
    """A fork server of episode hosts that also answer a census of their caches (tests.tools.host_census),
    serving every sandbox of the test."""
    payload = pickle.dumps((corpus, index, {}, registry.names()), protocol=pickle.HIGHEST_PROTOCOL)
    server = Zygote(kernel_fence=False, entry="tests.tools.host_census", payload=payload)
    idle = IdleHosts(server)
    monkeypatch.setattr(sandbox_module, "host_server", lambda corpus, index: (server, idle))
    return server


@pytest.fixture
def census_hosts(small_demo, index, monkeypatch):
    server = census_server(small_demo, index, monkeypatch)
    yield
    server.close()


def census(sandbox: Sandbox) -> dict:
    if sandbox.pid is None:
        sandbox.start()
    return sandbox._ask_host({"op": "execute", "code": CENSUS})["caches"]


def registered(name: str) -> bool:
    return any(name == cache.name or name.startswith((cache.name + ".", cache.name + "[")) for cache in process_caches.CACHES)


def test_every_cache_an_episode_fills_is_back_to_a_fresh_hosts_state_after_reset(small_demo, census_hosts):
    with Sandbox(small_demo, LIMITS) as first:
        fresh = census(first)
        results = [first.execute(code) for code in noisy_actions(small_demo.paper_ids)]
        after = census(first)
        host = first.host_pid
    with Sandbox(small_demo, LIMITS) as second:
        reset = census(second)
        assert second.host_pid == host  # the same process, reset
    calls = [call for result in results for call in result.tool_calls]
    assert len(calls) > 1000 and sum(1 for call in calls if call.error) > 500 and results[1].limit_hit == "output"
    assert results[2].outcome is not None and results[2].outcome.status == "submitted"

    # The census sees the caches the tools have (so its silence means something) ...
    for cache in process_caches.CACHES:
        assert any(name == cache.name or name.startswith(cache.name + ".") for name in fresh), f"the census cannot see {cache.name}"
    # ... and the episode filled what it could (the corpus's did-you-mean table was built before the fork).
    assert (
        fresh["paper_explorer.tools.paper_tools.SENTENCE_INDEXES._entries"]
        != after["paper_explorer.tools.paper_tools.SENTENCE_INDEXES._entries"]
    )
    assert fresh["paper_explorer.tools.paper_tools._id_table"] == after["paper_explorer.tools.paper_tools._id_table"]

    filled = sorted(name for name in set(fresh) | set(after) if fresh.get(name) != after.get(name))
    unlisted = [name for name in filled if not registered(name) and not name.startswith(PER_EPISODE)]
    assert not unlisted, "caches an episode filled that tools.process_caches.CACHES does not list:\n" + "\n".join(
        f"  {name}: fresh {fresh.get(name)}, after the episode {after.get(name)}" for name in unlisted
    )
    unreset = sorted(name for name in set(fresh) | set(reset) if fresh.get(name) != reset.get(name))
    assert not unreset, "caches a reset did not return to a fresh host's state:\n" + "\n".join(
        f"  {name}: fresh {fresh.get(name)}, after the episode {after.get(name)}, after reset {reset.get(name)}" for name in unreset
    )


def test_an_episode_over_its_own_documents_leaves_a_reused_host_as_a_fresh_one(monkeypatch):
    """A question with its own documents: its tools, their index and sentence index are made for the
    episode and gone at reset; the next episode's host is in every cache a fresh one."""
    corpus = mixed_corpus()
    index = BM25Index.build(corpus)
    server = census_server(corpus, index, monkeypatch)
    try:
        with Sandbox(corpus, LIMITS, index=index) as first:
            fresh = census(first)
            host = first.host_pid
        with Sandbox(corpus, LIMITS, index=index, paper_id=A.id) as own:
            results = [own.execute(code) for code in noisy_actions([A.id])]
            assert own.host_pid == host and own.documents == "own"
        with Sandbox(corpus, LIMITS, index=index) as after:
            reset = census(after)
            assert after.host_pid == host
    finally:
        server.close()
    calls = [call for result in results for call in result.tool_calls]
    assert len(calls) > 30 and results[2].outcome is not None and results[2].outcome.evidence[0].paper_id == A.id
    unreset = sorted(name for name in set(fresh) | set(reset) if fresh.get(name) != reset.get(name))
    assert not unreset, "caches an own-documents episode left in a reset host:\n" + "\n".join(
        f"  {name}: fresh {fresh.get(name)}, after reset {reset.get(name)}" for name in unreset
    )


def host_memory(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:")) * 1024


def dfa_heavy(number: int) -> str:
    """A pattern whose RE2 program is small but whose DFA fills its memory budget on a paper's text."""
    return f"[a-q][^u-z]{{{12 + number % 4}}}(?:x|{number}|[e-g]{{3}})"


EXTRACTS = "for p in {patterns!r}:\n    extract({paper!r}, p, k=20, regex=True)\n"


def test_a_reset_host_keeps_no_memory_of_large_patterns(small_demo, index):
    """128 patterns that each fill RE2's memory budget: re2.compile's cache kept them all, +45 MB
    in the host after its reset (the issue's attack: +76 MB)."""
    patterns = [dfa_heavy(number) for number in range(128)]
    paper = small_demo.paper_ids[0]
    with Sandbox(small_demo, LIMITS, index=index) as first:
        first.execute("1")
        host, fresh = first.host_pid, host_memory(first.host_pid)
        result = first.execute(EXTRACTS.format(patterns=patterns, paper=paper))
        assert result.error is None and len(result.tool_calls) == 128
    with Sandbox(small_demo, LIMITS, index=index) as second:
        second.execute("1")
        assert second.host_pid == host
        assert host_memory(host) - fresh < 12 * 2**20


def test_a_pattern_an_earlier_episode_used_is_no_faster_for_the_next(small_demo, index):
    """The issue's timing channel: a reused host compiled the last episode's patterns ~10x faster
    than new ones. Same-shaped patterns, asked in turn in one action, compare their medians."""
    earlier = [dfa_heavy(number) for number in range(100, 140)]
    new = [dfa_heavy(number) for number in range(200, 240)]
    paper = small_demo.paper_ids[0]
    with Sandbox(small_demo, LIMITS, index=index) as first:
        first.execute(EXTRACTS.format(patterns=earlier, paper=paper))
        host = first.host_pid
    with Sandbox(small_demo, LIMITS, index=index) as second:
        mixed = [pattern for pair in zip(earlier, new) for pattern in pair]
        result = second.execute(EXTRACTS.format(patterns=mixed, paper=paper))
        assert second.host_pid == host and result.error is None
    seconds = {call.arguments["query"]: call.seconds for call in result.tool_calls}
    ratio = statistics.median(seconds[pattern] for pattern in earlier) / statistics.median(seconds[pattern] for pattern in new)
    assert ratio > 0.6, f"a pattern of the last episode took {ratio:.2f}x a new one's time"


NESTED_SUBMITS = (
    "inner = [[] for _ in range(620)]\nfor i in range(400):\n    try:\n        submit('x', evidence=[inner] * 4)\n"
    "    except ToolError:\n        pass\n"
)


def test_a_reset_host_keeps_no_memory_of_an_episode_of_many_small_values(small_demo, index):
    """Failing submits whose evidence held thousands of empty lists: the names the tools looked up per
    call sat in CPython's type method cache and pinned the blocks the episode allocated, +80 MB in
    the host after its reset."""
    limits = Limits(wall_seconds=30, cpu_seconds=30, host_seconds=30, tool_calls=10**4)
    with Sandbox(small_demo, limits, index=index) as first:
        first.execute("1")
        host, fresh = first.host_pid, host_memory(first.host_pid)
        for _ in range(4):
            first.execute(NESTED_SUBMITS)
    with Sandbox(small_demo, limits, index=index) as second:
        second.execute("1")
        assert second.host_pid == host
        assert host_memory(host) - fresh < 12 * 2**20
