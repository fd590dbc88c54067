"""What one tool call can cost the host, at its worst arguments, before and after bounding it.

    python bench/tool_costs.py                  # 5,000 generated papers; writes bench/RESULTS.md
    python bench/tool_costs.py --papers 1000 --no-write

Each row is one call (or one action's worth of calls) with the arguments that cost the most:
the longest query of the corpus's most common words at k=50, quotes that a linear scan finds
only at the end of the corpus, a quote that misses, unknown paper ids, a regex whose RE2 DFA
gives up, extract over many papers, the last page of a huge paragraph. "before" runs
``OldPaperTools``: the tools as they were before their costs were bounded, kept below method for
method (quote look-up by normalising every paragraph, difflib over every paper id, a sentence
index per paper per episode kept for the episode, every sentence tried by a regex, paging that
copies the rest of a long paragraph per page, a paper-restricted search that reads every
posting). Both run in this process on the same corpus and index; times are medians.

The large corpus is generated (``corpus.generate``); per-paper worst cases use one long
synthetic paper (2,000 paragraphs, ~0.9 M characters, and a section holding one 2 M-character
paragraph), since generated papers are short.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import gc
import os
import random
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import re2  # noqa: E402

from bench.common import write_results  # noqa: E402
from paper_explorer.corpus import BM25, BM25Index, Corpus, DemoConfig, Paper, Section, generate, tokenize  # noqa: E402
from paper_explorer.corpus.index import QuoteText, quote_form  # noqa: E402
from paper_explorer.tools import layout, paper_tools  # noqa: E402
from paper_explorer.tools.catalog import search as search_tool  # noqa: E402
from paper_explorer.tools.catalog import submit as submit_tool  # noqa: E402
from paper_explorer.tools.catalog.extract import REGEX_MEMORY, ExtractArgs  # noqa: E402
from paper_explorer.tools.catalog.read import ReadArgs  # noqa: E402
from paper_explorer.tools.catalog.search import SearchArgs  # noqa: E402
from paper_explorer.tools.catalog.submit import SubmitArgs  # noqa: E402
from paper_explorer.tools.errors import ToolError  # noqa: E402
from paper_explorer.tools.layout import PAGE_CHARS  # noqa: E402
from paper_explorer.tools.paper_tools import PaperTools, sentences, shown  # noqa: E402

WORST_REGEX = r"(.{0,50}a){10}q"  # RE2's DFA runs out of states and its NFA walks ~4,500 instructions a byte


# -- the tools before their costs were bounded ------------------------------------------------------


def old_closest(wanted: str, candidates: list[str], n: int = 3) -> list[str]:
    close = difflib.get_close_matches(wanted, candidates, n=20, cutoff=0.6)

    def rank(candidate: str) -> tuple:
        ratio = difflib.SequenceMatcher(None, wanted, candidate).ratio()
        return (-round(ratio, 6), wanted not in candidate, candidate)

    return sorted(close, key=rank)[:n]


def old_pages(entries: list[str], budget: int) -> list[list[str]]:
    pieces: list[str] = []
    for entry in entries:
        while len(entry) > budget:
            pieces.append(entry[:budget] + " [continues]")
            entry = "[continued] " + entry[budget:]
        pieces.append(entry)
    pages: list[list[str]] = [[]]
    used = 0
    for piece in pieces:
        if pages[-1] and used + len(piece) > budget:
            pages.append([])
            used = 0
        pages[-1].append(piece)
        used += len(piece) + 2
    return pages


def old_top_k(bm25: BM25, query_tokens: list[str], k: int, within: slice) -> list[tuple[int, float]]:
    """BM25.top_k as it was: every posting of every query token read, then the range kept."""
    matched = np.zeros(bm25.n_docs, dtype=bool)
    scores = np.zeros(bm25.n_docs, dtype=np.float64)
    for token in query_tokens:
        term = bm25.vocabulary.get(token)
        if term is not None:
            start, end = bm25.indptr[term], bm25.indptr[term + 1]
            scores[bm25.indices[start:end]] += bm25.weights[start:end]
            matched[bm25.indices[start:end]] = True
    candidates = np.flatnonzero(matched)
    candidates = candidates[(candidates >= within.start) & (candidates < within.stop)]
    order = np.lexsort((candidates, -scores[candidates]))[:k]
    return [(int(candidates[i]), float(scores[candidates[i]])) for i in order]


class OldPaperTools(PaperTools):
    """PaperTools with the methods whose cost was unbounded as they were written before."""

    def __init__(self, corpus: Corpus, index: BM25Index) -> None:
        super().__init__(corpus, index)
        self._old_sentence_indexes: dict[str, tuple[list[tuple[int, int, str]], BM25]] = {}
        # the registered tools' functions, replaced by the old ones below (called as (episode, args))
        old = {
            "search": OldPaperTools._search,
            "read": OldPaperTools._read,
            "extract": OldPaperTools._extract,
            "submit": OldPaperTools._submit,
        }
        self._tools = {name: dataclasses.replace(tool, function=old.get(name, tool.function)) for name, tool in self._tools.items()}

    def _search(self, args: SearchArgs) -> list[dict]:
        if args.paper_id is None:
            return search_tool.search(self, args)
        self.paper(args.paper_id)
        ranked = old_top_k(self.index.bm25, self.index.tokenize(args.query), args.k, self.index._paper_ranges[args.paper_id])
        return [{"paragraph": doc, "score": round(score, 3)} for doc, score in ranked]

    def _read(self, args: ReadArgs) -> str:
        paper = self.paper(args.paper_id)
        section = paper.sections[self.section_number(paper, args.section)]
        pages = old_pages([f"[{i}] {text}" for i, text in enumerate(section.paragraphs) if text], PAGE_CHARS)
        return "\n\n".join(pages[args.page])

    def _extract(self, args: ExtractArgs) -> list[dict]:
        paper = self.paper(args.paper_id)
        located, bm25 = self._old_sentences_of(paper)
        if args.regex:
            options = re2.Options()
            options.log_errors = False
            options.case_sensitive = False
            options.max_mem = REGEX_MEMORY
            pattern = re2.compile(args.query, options)
            ranked = [(i, 1.0) for i, (_, _, text) in enumerate(located) if pattern.search(text)][: args.k]
        else:
            ranked = bm25.top_k(tokenize(args.query), args.k)
        return [{"sentence": located[i][2], "score": round(score, 3)} for i, score in ranked]

    def _old_sentences_of(self, paper: Paper) -> tuple[list[tuple[int, int, str]], BM25]:
        if paper.id not in self._old_sentence_indexes:
            located = [
                (s, p, sentence)
                for s, section in enumerate(paper.sections)
                for p, text in enumerate(section.paragraphs)
                if text
                for sentence in sentences(text)
            ]
            self._old_sentence_indexes[paper.id] = (located, BM25.build([tokenize(s) for _, _, s in located]))
        return self._old_sentence_indexes[paper.id]

    def _submit(self, args: SubmitArgs) -> str:
        evidence = [self._old_evidence(position, item) for position, item in enumerate(args.evidence)]
        return f"submitted {args.answer!r} with {len(evidence)} evidence paragraph(s)"

    def _old_evidence(self, position: int, item) -> dict:
        if isinstance(item, list):
            paper = self.paper(item[0])
            return {"paper_id": paper.id, "section": item[1], "paragraph": item[2]}
        quote = " ".join(item.split()).lower()
        for paragraph in self.corpus.paragraphs():
            if quote in " ".join(paragraph.text.split()).lower():
                return {"paper_id": paragraph.paper_id, "section": paragraph.section_index, "paragraph": paragraph.paragraph_index}
        raise ToolError(f"evidence {position}: no paragraph contains the quote {shown(item)}")

    def paper(self, paper_id: str) -> Paper:
        if paper_id in self.corpus:
            return self.corpus.paper(paper_id)
        close = old_closest(paper_id, self.corpus.paper_ids)
        raise ToolError(f"no paper {paper_id!r}; did you mean {', '.join(map(repr, close))}?")


# -- worst arguments --------------------------------------------------------------------------------


def common_words(index: BM25Index, count: int) -> list[str]:
    frequency = np.diff(index.bm25.indptr)
    words = list(index.bm25.vocabulary)
    return [words[i] for i in np.argsort(-frequency, kind="stable")[:count]]


def late_quotes(index: BM25Index, count: int, weak: bool) -> list[str]:
    """Quotes from the corpus's last paper that no earlier paragraph holds (a linear scan reads
    all the corpus to find each); ``weak``: with no inner word to look them up by."""
    last = index.paragraphs[-1].paper_id
    rng = random.Random(0)
    texts = [p.text for p in index.paragraphs if p.paper_id == last]
    quotes: list[str] = []
    for _ in range(20_000):
        text = rng.choice(texts)
        start = rng.randrange(len(text))
        quote = text[start : start + (rng.randrange(10, 16) if weak else 60)]
        plan = index.plan_quote(quote)
        if len(quote_form(quote)) >= 10 and plan.scans_everything == weak and quote not in quotes:
            found = index.find_planned(plan)
            if found is not None and index.paragraphs[found].paper_id == last:
                quotes.append(quote)
        if len(quotes) == count:
            return quotes
    raise RuntimeError(f"found {len(quotes)} of {count} late quotes (weak={weak})")


def long_paper_corpus() -> Corpus:
    rng = random.Random(0)
    words = "alpha beta gamma delta model data analysis result aaaa ab ba".split()
    body = tuple(" ".join(rng.choice(words) for _ in range(80)) + ". Next sentence here." for _ in range(2000))
    huge = " ".join(rng.choice(words) for _ in range(400_000))[:2_000_000]
    paper = Paper(id="long", title="Long", sections=(Section(name="Body", paragraphs=body), Section(name="Appendix", paragraphs=(huge,))))
    return Corpus(papers=(paper,))


def median_seconds(function, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        try:
            function()
        except ToolError:
            pass  # the refusals and misses are what is timed
        times.append(time.perf_counter() - started)
    return statistics.median(times)


@dataclass(frozen=True)
class Case:
    tool: str
    what: str
    on_long_paper: bool  # run on the long paper's corpus instead of the large one
    call: Callable[[dict], object]  # given the tools' functions
    warm: Callable[[dict], object] | None = None  # run once, untimed, on tools then kept for every run
    fresh: bool = False  # an empty sentence cache for every run (as in a new process)


def cases(corpus: Corpus, index: BM25Index, long_corpus: Corpus, papers_extracted: int) -> list[Case]:
    query = " ".join(common_words(index, 80))[:500]
    strong, weak = late_quotes(index, 20, weak=False), late_quotes(index, 20, weak=True)
    longest = max(index.paragraphs, key=lambda p: len(p.text)).text
    missing_long = "q" + quote_form(longest)[1:]
    misses = [f"{word} zq{i} {word}" for i, word in enumerate(query.split()[:20])]
    middle = corpus.papers[len(corpus.papers) // 2].id
    typo = middle[:-2] + middle[-1]
    many = [paper.id for paper in corpus.papers[:papers_extracted]]
    huge = long_corpus.papers[0].sections[1].paragraphs[0]
    last_page = len(layout.pages([f"[0] {huge}"], PAGE_CHARS)) - 1
    build_long = lambda f: f["extract"]("long", "alpha")  # noqa: E731 - builds the paper's sentence index
    return [
        Case("search", "500-character query of the 80 most common words, k=50", False, lambda f: f["search"](query, k=50)),
        Case("search", "the same query within one paper, k=50", False, lambda f: f["search"](query, k=50, paper_id=middle)),
        Case("submit", "20 quotes found only in the last paper", False, lambda f: f["submit"]("x", evidence=strong)),
        Case("submit", "20 quotes with no uncommon word, found only in the last paper", False, lambda f: f["submit"]("x", evidence=weak)),
        Case(
            "submit",
            f"1 quote that misses, as long as the longest paragraph ({len(longest):,} characters)",
            False,
            lambda f: f["submit"]("x", evidence=[missing_long]),
        ),
        Case("submit", "20 quotes that miss (the first miss ends the call)", False, lambda f: f["submit"]("x", evidence=misses)),
        Case("read", f"unknown paper id, a typo of one ({typo!r})", False, lambda f: f["read"](typo)),
        Case("read", "unknown paper id of 200 characters", False, lambda f: f["read"]((middle * 40)[:200])),
        Case(
            "extract",
            f"regex {WORST_REGEX} on a generated paper",
            False,
            lambda f: f["extract"](middle, WORST_REGEX, regex=True, k=20),
            warm=lambda f: f["extract"](middle, "x"),
        ),
        Case(
            "extract",
            f"regex {WORST_REGEX} on the long paper",
            True,
            lambda f: f["extract"]("long", WORST_REGEX, regex=True, k=20),
            warm=build_long,
        ),
        Case(
            "extract",
            r"regex alpha \S+ beta on the long paper, k=20",
            True,
            lambda f: f["extract"]("long", r"alpha \S+ beta", regex=True, k=20),
            warm=build_long,
        ),
        Case(
            "extract",
            "words, on the long paper in a new process (builds its sentence index)",
            True,
            lambda f: f["extract"]("long", "alpha beta", k=20),
            fresh=True,
        ),
        Case(
            "extract",
            f"words, on {len(many)} papers in one action of a new process",
            False,
            lambda f: [f["extract"](paper_id, "learning rate", k=20) for paper_id in many],
            fresh=True,
        ),
        Case("read", f"the last page of a {len(huge):,}-character paragraph", True, lambda f: f["read"]("long", section=1, page=last_page)),
        Case("search", "k=50 over long paragraphs (each hit's snippet)", True, lambda f: f["search"]("alpha beta gamma", k=50)),
    ]


def time_case(case: Case, make: type[PaperTools], corpus: Corpus, index: BM25Index, repeats: int) -> float:
    """Median seconds of the case's call: on warmed tools kept for every run, or on new tools
    (a new episode: a submit ends one) each run."""
    if case.warm is not None:
        functions = make(corpus, index).functions()
        case.warm(functions)
        return median_seconds(lambda: case.call(functions), repeats)

    def run_once() -> None:
        if case.fresh:
            paper_tools.SENTENCE_INDEXES.clear()
        case.call(make(corpus, index).functions())

    return median_seconds(run_once, repeats)


def sentence_index_memory(corpus: Corpus, papers: int) -> tuple[float, float]:
    """MiB kept after extracting from ``papers`` papers: by one old episode, by the bounded cache."""
    ids = [paper.id for paper in corpus.papers[:papers]]
    index = BM25Index.build(Corpus(papers=corpus.papers[:1]))  # the tools' own index is not measured
    kept = []
    for make in (OldPaperTools, PaperTools):
        paper_tools.SENTENCE_INDEXES.clear()
        gc.collect()
        tracemalloc.start()
        tools = make(corpus, index)
        for paper_id in ids:
            tools.functions()["extract"](paper_id, "learning rate")
        kept.append(tracemalloc.get_traced_memory()[0] / 2**20)
        tracemalloc.stop()
        del tools
    paper_tools.SENTENCE_INDEXES.clear()
    return kept[0], kept[1]


def run(papers: int, repeats: int, old_repeats: int, papers_extracted: int) -> str:
    started = time.perf_counter()
    corpus = generate(DemoConfig(papers=papers, seed=0))
    index = BM25Index.build(corpus)
    build_s = time.perf_counter() - started
    started = time.perf_counter()
    QuoteText.build(index.paragraphs)
    quote_text_s = time.perf_counter() - started
    long_corpus = long_paper_corpus()
    long_index = BM25Index.build(long_corpus)
    rows = []
    for case in cases(corpus, index, long_corpus, papers_extracted):
        on = (long_corpus, long_index) if case.on_long_paper else (corpus, index)
        before = time_case(case, OldPaperTools, *on, old_repeats)
        after = time_case(case, PaperTools, *on, repeats)
        rows.append((case.tool, case.what, before, after))
        print(f"{case.tool}: {case.what}: before {before * 1000:.1f} ms, after {after * 1000:.1f} ms", file=sys.stderr)
    old_mib, new_mib = sentence_index_memory(corpus, papers_extracted)
    lines = [
        "| tool | worst arguments | before ms | after ms | before / after |",
        "|---|---|---:|---:|---:|",
    ]
    for tool, what, before, after in rows:
        lines.append(f"| {tool} | {what.replace('|', '&#124;')} | {before * 1000:,.1f} | {after * 1000:,.1f} | {before / after:,.1f}x |")
    text_mib = len(index.quotes.text) / 2**20
    load = os.getloadavg()[0]
    lines += [
        "",
        f"- Corpus: {papers:,} generated papers, {len(index.paragraphs):,} paragraphs; index built in {build_s:.1f} s, of which "
        f"{quote_text_s:.1f} s for the quote text (every paragraph in quote form, kept once per corpus beside the index and in its "
        f"cache file: {text_mib:.0f} MiB).",
        f"- A quote with no uncommon word costs one scan of the quote text; a submit may spend {submit_tool.QUOTE_SCANS} "
        "(the row of 20 such quotes: 3 scans, then the 4th is refused).",
        f"- Long paper: {sum(len(p) for s in long_corpus.papers[0].sections for p in s.paragraphs):,} characters.",
        f"- Sentence indexes kept after extract over {papers_extracted} papers: {old_mib:.0f} MiB by one episode before "
        f"(every paper, until the episode ends), {new_mib:.0f} MiB after (at most {paper_tools.SENTENCE_INDEX_PAPERS} papers and "
        f"{paper_tools.SENTENCE_INDEX_CHARS:,} characters per process, shared by its episodes).",
        f"- Medians of {repeats} runs after, {old_repeats} before. The machine has 2 cores shared with other sessions' work "
        f"(load average {load:.1f} when this finished), so the figures are noisy; the ratios are what to read.",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--papers", type=int, default=5000, help="generated papers in the large corpus")
    parser.add_argument("--repeats", type=int, default=5, help="runs per case, after")
    parser.add_argument("--old-repeats", type=int, default=3, help="runs per case, before (some take seconds)")
    parser.add_argument("--extract-papers", type=int, default=500, help="papers one action extracts from")
    parser.add_argument("--no-write", action="store_true", help="print the table without updating bench/RESULTS.md")
    args = parser.parse_args()
    text = run(args.papers, args.repeats, args.old_repeats, args.extract_papers)
    print(text)
    if not args.no_write:
        write_results("## Tool call costs (bench/tool_costs.py)", "python bench/tool_costs.py", ("numpy", "google-re2"), text)


if __name__ == "__main__":
    main()
