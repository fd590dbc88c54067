"""LongBench QA lines and MemAgent's HotpotQA eval files: each record is one question over its own documents.

Two layouts, recognised from the content by ``corpus.loading`` (a record with a ``context`` or an
``input`` that is neither our JSONL nor QASPER's; ``layout``):

* LongBench v1 (THUDM/LongBench, ``data/<subset>.jsonl`` in its ``data.zip``): one JSON object per
  line, ``{input, context, answers, length, dataset, language, all_classes, _id}``. Accepted: the
  English QA subsets LongBench scores with ``qa_f1_score`` (``LONGBENCH_QA``), and LongBench-E's
  (``<subset>_e``, the same fields; ``LONGBENCH_E_QA``); any other ``dataset`` is refused in one line.
  ``input``, ``context``, ``answers``, ``dataset`` and ``_id`` are required; ``length``, ``language``
  and ``all_classes`` are type-checked when present and otherwise unused.
* MemAgent's HotpotQA eval files (BytedTsinghua-SIA/hotpotqa, ``eval_{N}.json``, written by its
  ``taskutils/memory_data/different_docs_eval.py``): a JSON array, ``{context, input, answers,
  num_docs, index}`` per item, the context N passages ``"Document {i}:\\n{title}\\n{text}"`` joined by a
  blank line. One record per line (JSONL) loads too. ``index`` is the question's position in
  HotpotQA's dev set, so ``hotpotqa-{num_docs}-{index}`` names it in every ``eval_{N}`` file.

A record becomes one ``Paper`` and one ``Question``:

* the paper: ``context`` exactly as given (nothing stripped: the reader decides), a short title
  (``LongBench hotpotqa 3e2f1a2b``), split ``test`` (these are evaluation sets; ``--split-of``
  overrides it, ``corpus.splits``), and the context cut into sections for the code agent's
  ``search`` and ``read`` (below). Its id is the question's: the paper is that question's own
  document set (``Paper.own_documents``).
* the question: id LongBench's ``_id``, or ``hotpotqa-{num_docs}-{index}`` for MemAgent; text
  ``input``; one free-form ``Answer`` per string of ``answers``, kept verbatim (the benchmark's
  metric reads them; "yes" stays a string), except "unanswerable": LongBench's qasper subset
  writes QASPER's unanswerable answer so (its prompt asks for that word where the article does not
  answer), so it is an unanswerable ``Answer``, whose reference text scores the same and on
  which an abstention counts as right, not as a false abstention; ``benchmark``
  ``longbench/<subset>``, ``longbench-e/<subset>`` or ``memagent/hotpotqa``.

Sections: the context cut at line breaks only, so that nothing is lost (``rejoin`` puts it back):

* Block layout: a context that starts with the line ``Document 1:`` or ``Passage 1:`` (MemAgent's
  and LongBench's multi-document subsets) is cut before each next header line ``Document 2:``,
  ``Passage 3:``, ... (numbered on from 1, each on a line of its own): one section per block, named
  by its header line, whose paragraphs are the block's text after the header split on blank lines.
  Blocks are joined by the context's own separator: a blank line when its second header follows
  one (MemAgent's ``"\\n\\n".join``), else one line break (``block_separator``). So a context is
  ``separator.join(name + "\\n" + "\\n\\n".join(paragraphs) for each section)``.
* Otherwise (a story, a paper): one section without a name whose paragraphs are the context split
  on blank lines (``"\\n\\n"``): the context is ``"\\n\\n".join(paragraphs)``.

Consecutive blank lines leave ``""`` paragraphs: the schema's placeholders, kept so the text is
whole, never indexed or shown. Whitespace is never trimmed (a trimmed paragraph would not
rejoin). Splitting is linear in the context's length, and the context string is kept as the
record holds it, not copied.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from paper_explorer.corpus.errors import CorpusError, from_validation_error
from paper_explorer.corpus.schema import PAPER_ID_CHARS, Answer, Paper, Question, Section, Split

LONGBENCH_QA = ("narrativeqa", "qasper", "multifieldqa_en", "hotpotqa", "2wikimqa", "musique")
"""LongBench's English QA subsets, those its eval.py scores with qa_f1_score (triviaqa, also scored
so, is few-shot learning: its context is examples, not documents)."""
LONGBENCH_E_QA = ("qasper", "multifieldqa_en", "hotpotqa", "2wikimqa")
"""The QA subsets LongBench-E has (pred.py's --e list), whose ``dataset`` is ``<subset>_e``."""
BLOCK_WORDS = ("Document", "Passage")  # MemAgent's DOCUMENT_PROMPT; LongBench's multi-document subsets
PARAGRAPH_BREAK = "\n\n"
SPLIT: Split = "test"  # evaluation sets, both
UNANSWERABLE = "unanswerable"  # LongBench qasper's answer where the article does not answer (dataset2prompt.json)

Layout = Literal["longbench", "memagent"]
LONGBENCH_KEYS = frozenset({"_id", "dataset", "length", "language", "all_classes"})
MEMAGENT_KEYS = frozenset({"num_docs", "index"})


class _Raw(BaseModel):
    # Other keys are the benchmark's business (LongBench's retrieval variants add ``retrieved``); types are ours.
    model_config = ConfigDict(extra="ignore", strict=True)

    context: str = Field(min_length=1)
    input: str = Field(min_length=1)
    answers: list[str]


class RawLongBench(_Raw):
    """One LongBench (or LongBench-E) line."""

    dataset: str
    id: str = Field(alias="_id", min_length=1)
    length: int | None = None
    language: str | None = None
    all_classes: list[str] | None = None


class RawMemAgent(_Raw):
    """One record of MemAgent's ``eval_{N}.json``."""

    num_docs: int = Field(ge=1)
    index: int = Field(ge=0)


def layout(raw: dict) -> Layout | None:
    """Which benchmark a record is from: it holds a ``context`` or an ``input`` (no layout of ours
    has either at its top) and is not one of our own layouts (``paper``: explorer JSONL;
    ``full_text``: QASPER's). None when it is not a benchmark record."""
    if not {"context", "input"} & raw.keys() or "paper" in raw or "full_text" in raw:
        return None
    return "memagent" if MEMAGENT_KEYS & raw.keys() and not LONGBENCH_KEYS & raw.keys() else "longbench"


def from_record(raw: dict, place: str) -> tuple[Paper, list[Question]]:
    """The paper and question a benchmark record makes; CorpusError naming ``place`` and the field."""
    keys = raw.keys()
    if MEMAGENT_KEYS & keys and LONGBENCH_KEYS & keys:
        raise CorpusError(
            f"{place}: a record with both LongBench's keys ({', '.join(sorted(LONGBENCH_KEYS & keys))}) and MemAgent's "
            f"({', '.join(sorted(MEMAGENT_KEYS & keys))}); a file holds one benchmark's records, as its authors wrote them"
        )
    if not (MEMAGENT_KEYS | LONGBENCH_KEYS) & keys:
        raise CorpusError(
            f"{place}: a record with {' and '.join(sorted({'context', 'input'} & keys))} but neither LongBench's _id and dataset "
            "nor MemAgent's num_docs and index; "
            "expected a LongBench line or a record of MemAgent's eval files"
        )
    if layout(raw) == "memagent":
        return _from_memagent(_validated(RawMemAgent, raw, place), place)
    return _from_longbench(_validated(RawLongBench, raw, place), place)


def _validated(model: type[_Raw], raw: dict, place: str):
    if model is RawMemAgent and isinstance(raw.get("context"), list):
        raise CorpusError(
            f"{place}: field 'context' is a list of document numbers, as MemAgent writes its eval files of more than "
            "10,000 documents (generate_index_only): their text is in HotpotQA's dev set, not in the file; "
            "only files whose context is the text load"
        )
    try:
        return model.model_validate(raw)
    except ValidationError as error:
        raise from_validation_error(error, place) from None


def _from_longbench(raw: RawLongBench, place: str) -> tuple[Paper, list[Question]]:
    subset, e = (raw.dataset.removesuffix("_e"), True) if raw.dataset.endswith("_e") else (raw.dataset, False)
    if subset not in (LONGBENCH_E_QA if e else LONGBENCH_QA):
        supported = ", ".join(LONGBENCH_QA) + "; LongBench-E's " + ", ".join(f"{name}_e" for name in LONGBENCH_E_QA)
        raise CorpusError(f"{place}: LongBench subset {raw.dataset!r} is not supported; supported: the English QA subsets {supported}")
    if raw.id.isspace():
        raise CorpusError(f"{place}: field '_id' is only whitespace; give the record its id, or delete it")
    benchmark = f"longbench-e/{subset}" if e else f"longbench/{subset}"
    title = f"{'LongBench-E' if e else 'LongBench'} {subset} {raw.id[:8]}"
    return _paper_and_question(raw, raw.id, "_id", title, benchmark, place)


def _from_memagent(raw: RawMemAgent, place: str) -> tuple[Paper, list[Question]]:
    identifier = f"hotpotqa-{raw.num_docs}-{raw.index}"
    title = f"MemAgent HotpotQA, {raw.num_docs} documents, question {raw.index}"
    return _paper_and_question(raw, identifier, "hotpotqa-{num_docs}-{index}", title, "memagent/hotpotqa", place)


def _paper_and_question(raw: _Raw, identifier: str, id_from: str, title: str, benchmark: str, place: str) -> tuple[Paper, list[Question]]:
    """``identifier``: the question's and its paper's id, as ``id_from`` says it is made."""
    if len(identifier) > PAPER_ID_CHARS:
        raise CorpusError(
            f"{place}: the record's id ({id_from}) is {len(identifier)} characters, {identifier[:40]!r}...; "
            f"the tools read papers by ids of at most {PAPER_ID_CHARS}: fix the record, or delete it"
        )
    if not any(answer.strip() for answer in raw.answers):
        shown = "it is empty" if not raw.answers else "each is blank"
        raise CorpusError(f"{place}: field 'answers' holds no answer ({shown}); give the record at least one answer, or delete it")
    if not raw.input.strip():
        raise CorpusError(f"{place}: field 'input' (the question) is blank; write the question, or delete the record")
    if raw.context.isspace():  # not strip(): that would copy a context of hundreds of kilobytes
        raise CorpusError(
            f"{place}: field 'context' (the question's own documents) is only whitespace; give the record its context, or delete it"
        )
    try:
        paper = Paper(id=identifier, title=title, sections=split_context(raw.context), split=SPLIT, context=raw.context)
        question = Question(
            id=identifier,
            paper_id=identifier,
            text=raw.input,
            answers=tuple(_answer(answer) for answer in raw.answers),
            benchmark=benchmark,
        )
    except ValidationError as error:
        raise from_validation_error(error, place) from None
    return paper, [question]


def _answer(text: str) -> Answer:
    """One string of a record's ``answers``: "unanswerable" (any case, surrounding space aside) is
    QASPER's unanswerable answer as LongBench's qasper subset writes it; anything else, verbatim."""
    if text.strip().lower() == UNANSWERABLE:
        return Answer(unanswerable=True)
    return Answer(free_form_answer=text)


# -- sections -------------------------------------------------------------------------------------


def _block_word(context: str) -> str | None:
    return next((word for word in BLOCK_WORDS if context.startswith(f"{word} 1:\n")), None)


def block_separator(context: str) -> str:
    """What joins a block-layout context's blocks: a blank line when its second header follows one
    (MemAgent's layout), else a line break (and for a context of one block, or none)."""
    word = _block_word(context)
    return "\n\n" if word is not None and f"\n\n{word} 2:\n" in context else "\n"


def split_context(context: str) -> tuple[Section, ...]:
    """The context as sections, by the module's rule; ``rejoin`` gives the context back exactly."""
    word = _block_word(context)
    if word is None:
        return (Section(name=None, paragraphs=tuple(context.split(PARAGRAPH_BREAK))),)
    separator = block_separator(context)
    sections = []
    name, start, number = f"{word} 1:", len(f"{word} 1:\n"), 2
    while True:
        header = f"{separator}{word} {number}:\n"
        at = context.find(header, start)  # each find starts where the last block ended: one pass over the text
        end = len(context) if at < 0 else at
        sections.append(Section(name=name, paragraphs=tuple(context[start:end].split(PARAGRAPH_BREAK))))
        if at < 0:
            return tuple(sections)
        name, start, number = f"{word} {number}:", at + len(header), number + 1


def rejoin(sections: Sequence[Section], separator: str) -> str:
    """The text ``split_context`` cut into ``sections``, given its ``block_separator``."""
    if len(sections) == 1 and sections[0].name is None:
        return PARAGRAPH_BREAK.join(sections[0].paragraphs)
    return separator.join(f"{section.name}\n" + PARAGRAPH_BREAK.join(section.paragraphs) for section in sections)
