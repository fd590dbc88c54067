"""Questions that bring their own documents, as the benchmark loaders make them (a LongBench or
MemAgent record: one paper per question, its context verbatim, its passages as sections), beside
QASPER-like shared papers: the corpora the question-scope tests run episodes on."""

import random
import unicodedata

from paper_explorer.corpus import Corpus, DemoConfig, generate
from paper_explorer.corpus.benchmarks import split_context
from paper_explorer.corpus.loading import from_parts
from paper_explorer.corpus.schema import Answer, Paper, Question

WORDS = "zebra river savanna learning rate model data foal grass herd migration season water dataset training".split()


def own_documents(paper_id: str, passages: list[str]) -> Paper:
    """A paper as the benchmark loaders make one: the context as given ("Document i:" passages, as
    MemAgent's HotpotQA files hold them), and its passages as sections for search and read."""
    context = "\n\n".join(f"Document {i}:\n{passage}" for i, passage in enumerate(passages, 1))
    return Paper(id=paper_id, title="", sections=split_context(context), split="test", context=context)


def passages(seed: int, count: int, extra: str) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 30))).capitalize() + f". {extra} {i}." for i in range(count)]


A = own_documents("lb-A", ["Zebras graze in the savanna near the Okavango river.", *passages(1, 12, "Savanna learning rate")])
B = own_documents("lb-B", ["Emperor penguins nest on the Ross ice shelf.", *passages(2, 6, "Penguin learning rate")])
A_QUESTION = Question(
    id="lb-A-q",
    paper_id="lb-A",
    text="Where do zebras graze near the Okavango river?",
    answers=(Answer(free_form_answer="the savanna", evidence=(A.sections[0].paragraphs[0],)),),
    benchmark="longbench/hotpotqa",
)
B_QUESTION = Question(
    id="lb-B-q",
    paper_id="lb-B",
    text="Where do emperor penguins nest?",
    answers=(Answer(free_form_answer="the Ross ice shelf"),),
    benchmark="longbench/hotpotqa",
)


def lookalikes(paper_id: str) -> list[str]:
    """Spellings of an id a model might try: case, spaces, another dash, Cyrillic and full-width
    lookalikes, a zero-width space, a compatibility form."""
    cyrillic = str.maketrans("aceopxABCEHKMOPTX", "асеорхАВСЕНКМОРТХ")
    return [
        paper_id,
        paper_id.upper(),
        paper_id.lower(),
        f" {paper_id}",
        f"{paper_id} ",
        paper_id.replace("-", "\u2010"),
        paper_id.replace("-", "_"),
        paper_id.translate(cyrillic),
        "".join(chr(ord(c) + 0xFEE0) if "!" <= c <= "~" else c for c in paper_id),
        paper_id + "\u200b",
        unicodedata.normalize("NFKD", paper_id),
    ]


def shared_papers() -> tuple[list[Paper], list[Question]]:
    """QASPER-like shared papers (the demo generator's), all in the test split, and their questions."""
    demo = generate(DemoConfig(papers=4, seed=11))
    return [paper.model_copy(update={"split": "test"}) for paper in demo.papers], list(demo.questions)


def mixed_corpus() -> Corpus:
    """The shared papers, then A and B, each with its question."""
    papers, questions = shared_papers()
    return from_parts([*papers, A, B], [*questions, A_QUESTION, B_QUESTION])


def long_context(paper_id: str, documents: int = 1_600) -> Paper:
    """A context of the size of MemAgent's HotpotQA 224k set: ``documents`` "Document i:" passages of
    ~580 characters, about 0.93 MB and 138k words in all at the default."""
    parts = passages(5, documents * 4, "Long context")
    return own_documents(paper_id, [" ".join(parts[i : i + 4]) for i in range(0, len(parts), 4)])
