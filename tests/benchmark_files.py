"""Files in LongBench's and MemAgent's layouts, built from generated words (never real data).

Deterministic: the same arguments give the same bytes. The layouts are the benchmarks' own:

* LongBench v1 lines (``{input, context, answers, length, dataset, language, all_classes, _id}``),
  one per line, for the five subsets of the released table: narrativeqa (a story, hard-wrapped
  lines in blank-line paragraphs), qasper (a paper: headings and paragraphs), and the multi-document
  hotpotqa, 2wikimqa and musique, whose context is ``"Passage 1:\\n{title}\\n{text}\\nPassage 2:\\n..."``.
  Each question's answer is stated in its context (a two-hop bridge in the multi-document ones).
* MemAgent's HotpotQA eval files (``eval_{N}.json``): a JSON array written as its
  ``different_docs_eval.py`` writes it (``json.dump(..., indent=4)``), ``{context, input, answers,
  num_docs, index}``, the context ``"Document {i}:\\n{title}\\n{text}"`` blocks joined by a blank line,
  two of them the answer's supporting documents.

``memagent_long_record`` makes one context of about 224,000 Qwen3-8B tokens (1,600 documents, as
MemAgent's 224k set ``eval_1600.json``): ``tests/corpus/test_benchmarks.py`` counts them with the
real tokenizer. The fixtures in ``tests/conftest.py`` build each file once per test session.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass
from pathlib import Path

LONGBENCH_SUBSETS = ("narrativeqa", "qasper", "hotpotqa", "2wikimqa", "musique")
MULTI_DOCUMENT = ("hotpotqa", "2wikimqa", "musique")

# Plain English words for the text between the facts, and syllables for the names: nothing here is
# anyone's sentence; a context is a seeded draw of them.
FILLER = (
    "the of and a to in is was for on with as by at from that it an be this which are his her "
    "their its one two three after before during first later early long small large old new river "
    "town city county village school church railway station bridge road valley island coast "
    "north south east west century year season record album song film novel series team club "
    "league match player coach member family house court office building market harbour "
    "museum library company band group party army navy war treaty council election district "
    "region province state country border line route journey voyage winter summer spring "
    "autumn morning evening work study history story letter report paper book chapter scene"
).split()
SYLLABLES = "ka lo mi ren to va sel dor an bri cas fen gal hol ith jun kor lem mar nol or pel qui ros sul tam ur vel wen yar zo".split()
KINDS = ("magazine", "football club", "rock band", "film studio", "university", "newspaper", "railway company", "theatre")


class Words:
    """A seeded source of generated names and sentences."""

    def __init__(self, seed: int | str) -> None:
        self.random = random.Random(seed)

    def name(self, syllables: int = 3) -> str:
        return "".join(self.random.choice(SYLLABLES) for _ in range(syllables)).capitalize()

    def person(self) -> str:
        return f"{self.name(2)} {self.name(3)}"

    def sentence(self, words: int) -> str:
        chosen = [self.name() if self.random.random() < 0.12 else self.random.choice(FILLER) for _ in range(words)]
        return " ".join(chosen).capitalize() + "."

    def text(self, sentences: int, words: int = 14) -> str:
        return " ".join(self.sentence(words + self.random.randint(-4, 4)) for _ in range(sentences))


@dataclass(frozen=True)
class Bridge:
    """A two-hop question and the two documents that answer it: the first names the founder of
    ``subject``, the second says where the founder was born."""

    question: str
    answer: str
    documents: tuple[tuple[str, str], tuple[str, str]]  # (title, text), twice


def bridge(words: Words) -> Bridge:
    subject, founder, place = words.name(), words.person(), words.name()
    kind = words.random.choice(KINDS)
    first = (subject, f"{subject} is a {kind} founded by {founder}. {words.text(3)}")
    second = (founder, f"{founder} was born in {place}. {words.text(3)}")
    return Bridge(f"Where was the founder of the {kind} {subject} born?", place, (first, second))


def _identifier(*parts: object) -> str:
    """A 48-hex-digit id like LongBench's ``_id``, from the record's seed."""
    return hashlib.sha256("-".join(map(str, parts)).encode()).hexdigest()[:48]


# -- LongBench -------------------------------------------------------------------------------------


def longbench_record(subset: str, number: int, seed: int = 34, passages: int = 10) -> dict:
    """One LongBench line of ``subset`` (one of LONGBENCH_SUBSETS, or any name for a refusal test)."""
    words = Words(f"{seed}-{subset}-{number}")
    if subset == "narrativeqa":
        context, question, answers = _story(words)
    elif subset == "qasper":
        context, question, answers = _paper(words, number)
    else:
        context, question, answers = _passages(words, passages)
    return {
        "input": question,
        "context": context,
        "answers": answers,
        "length": len(context.split()) + len(question.split()),
        "dataset": subset,
        "language": "en",
        "all_classes": None,
        "_id": _identifier(seed, subset, number),
    }


def _story(words: Words) -> tuple[str, str, list[str]]:
    hero, place = words.person(), words.name()
    paragraphs = [words.text(4) for _ in range(12)]
    paragraphs[7] = f"At dawn {hero} hid the brass lantern in {place}, and told no one. " + words.text(2)
    wrapped = ["\n".join(_wrap(paragraph, 60)) for paragraph in paragraphs]
    title = f"THE {words.name().upper()} OF {words.name().upper()}"
    context = f"{title}\n\nCHAPTER I\n\n" + "\n\n".join(wrapped)
    return context, f"Where did {hero} hide the brass lantern?", [place, f"In {place}"]


def _wrap(text: str, width: int) -> list[str]:
    lines, line = [], ""
    for word in text.split():
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    return [*lines, line]


def _paper(words: Words, number: int) -> tuple[str, str, list[str]]:
    dataset, baseline = words.name().upper(), words.name()
    sections = {
        "Introduction": [words.text(4), words.text(3)],
        "Method": [words.text(4), f"We train on the {dataset} corpus and compare with {baseline}. " + words.text(2)],
        "Results": [words.text(4), "Our code is released with the paper. " + words.text(2)],
        "Conclusion": [words.text(3)],
    }
    context = "\n\n".join(f"{name}\n" + "\n\n".join(paragraphs) for name, paragraphs in sections.items())
    questions = [
        (f"Which corpus do they train on besides comparing with {baseline}?", [dataset, f"the {dataset} corpus"]),
        ("Do they release their code?", ["yes", "Yes"]),
        ("What hardware do they train on?", ["unanswerable"]),
    ]
    question, answers = questions[number % len(questions)]
    return context, question, answers


def _passages(words: Words, count: int) -> tuple[str, str, list[str]]:
    found = bridge(words)
    documents = [(words.name(), words.text(3)) for _ in range(count - 2)]
    first, second = sorted(words.random.sample(range(count), 2))
    documents.insert(first, found.documents[0])
    documents.insert(second, found.documents[1])
    context = "\n".join(f"Passage {i}:\n{title}\n{text}" for i, (title, text) in enumerate(documents, 1))
    return context, found.question, [found.answer]


def longbench_records(per_subset: int = 3, seed: int = 34, subsets: tuple[str, ...] = LONGBENCH_SUBSETS) -> list[dict]:
    return [longbench_record(subset, number, seed) for subset in subsets for number in range(per_subset)]


def write_jsonl(path: Path, records: list[dict]) -> Path:
    """One record per line, as LongBench's files hold them."""
    path.write_text("".join(json.dumps(record, ensure_ascii=False) + "\n" for record in records), encoding="utf-8")
    return path


# -- MemAgent --------------------------------------------------------------------------------------

LONG_DOCUMENTS = 1_600  # eval_1600.json: MemAgent's 224k-token HotpotQA set
LONG_SENTENCES = 6.84  # per document, on average: ~140 Qwen3 tokens each, ~224,000 for 1,600 (counted by a test)


@dataclass(frozen=True)
class MemAgentRecord:
    record: dict
    answer: str
    supporting: tuple[int, int]  # the numbers of the two answer-bearing documents ("Document {i}:")


def memagent_record(num_docs: int, index: int, seed: int = 801, sentences: float = 2) -> MemAgentRecord:
    """One record of MemAgent's ``eval_{num_docs}.json``: ``num_docs`` documents, two of them the
    bridge; the others hold ``sentences`` sentences on average (the whole number below or above)."""
    words = Words(f"{seed}-{num_docs}-{index}")
    found = bridge(words)
    whole, part = divmod(sentences, 1)
    documents = [(words.name(), words.text(int(whole) + (words.random.random() < part))) for _ in range(num_docs - 2)]
    first, second = sorted(words.random.sample(range(num_docs), 2))
    documents.insert(first, found.documents[0])
    documents.insert(second, found.documents[1])
    context = "\n\n".join(f"Document {i}:\n{title}\n{text}" for i, (title, text) in enumerate(documents, 1))
    record = {"context": context, "input": found.question, "answers": [found.answer], "num_docs": num_docs, "index": index}
    return MemAgentRecord(record, found.answer, (first + 1, second + 1))


def memagent_long_record(index: int = 0) -> MemAgentRecord:
    """The one ~224k-token context: 1,600 documents of six or seven sentences."""
    return memagent_record(LONG_DOCUMENTS, index, sentences=LONG_SENTENCES)


def write_memagent(path: Path, records: list[dict]) -> Path:
    """A JSON array, as MemAgent writes its eval files (``json.dump(..., ensure_ascii=False, indent=4)``)."""
    with path.open("w", encoding="utf-8") as handle:
        json.dump(records, handle, ensure_ascii=False, indent=4)
    return path


@dataclass(frozen=True)
class LongContextFile:
    """MemAgent's eval_1600.json layout holding the one long record."""

    path: Path
    question_id: str  # as the loader names it: hotpotqa-{num_docs}-{index}
    answer: str
    supporting: tuple[int, int]
    context: str


def write_long_file(directory: Path) -> LongContextFile:
    long = memagent_long_record()
    path = write_memagent(directory / "eval_1600.json", [long.record])
    question_id = f"hotpotqa-{long.record['num_docs']}-{long.record['index']}"
    return LongContextFile(path, question_id, long.answer, long.supporting, long.record["context"])


# -- the small files docs/benchmarks.md runs its commands on -------------------------------------

EXAMPLES = Path(__file__).resolve().parent.parent / "docs" / "examples" / "benchmarks"


def example_files() -> dict[str, bytes]:
    """docs/examples/benchmarks/: one LongBench record of each subset of the released table (six
    passages where there are passages), and MemAgent's layout with two questions over twelve documents."""
    longbench = [longbench_record(subset, 0, passages=6) for subset in LONGBENCH_SUBSETS]
    memagent = [memagent_record(12, index).record for index in (5, 8)]
    return {
        "longbench.jsonl": "".join(json.dumps(record, ensure_ascii=False) + "\n" for record in longbench).encode(),
        "eval_12.json": json.dumps(memagent, ensure_ascii=False, indent=4).encode(),
    }


if __name__ == "__main__":  # python -m tests.benchmark_files: write docs/examples/benchmarks/ again
    EXAMPLES.mkdir(parents=True, exist_ok=True)
    for name, data in example_files().items():
        (EXAMPLES / name).write_bytes(data)
