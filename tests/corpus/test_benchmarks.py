"""LongBench QA lines and MemAgent's HotpotQA eval files, loaded as a user loads them: each record one
question over its own documents, the context kept exactly, its sections cut without losing a character,
every bad record refused in one line that names the file, the line and the field."""

import hashlib
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paper_explorer.corpus import CorpusError, load
from paper_explorer.corpus.benchmarks import LONGBENCH_QA, block_separator, from_record, rejoin, split_context
from paper_explorer.corpus.loading import with_questions
from tests.benchmark_files import (
    EXAMPLES,
    LONGBENCH_SUBSETS,
    example_files,
    longbench_record,
    longbench_records,
    memagent_record,
    write_jsonl,
    write_memagent,
)
from tests.conftest import run_cli


def test_a_longbench_file_of_the_five_subsets_loads_one_question_per_record_over_its_own_context(longbench_file):
    records = [json.loads(line) for line in longbench_file.read_text().splitlines()]
    corpus = load(longbench_file)
    assert len(corpus.papers) == len(corpus.questions) == len(records) == 15
    assert {question.benchmark for question in corpus.questions} == {f"longbench/{subset}" for subset in LONGBENCH_SUBSETS}
    for record, paper, question in zip(records, corpus.papers, corpus.questions, strict=True):
        assert paper.context == record["context"] and paper.own_documents
        assert paper.id == question.id == question.paper_id == record["_id"]
        assert paper.split == "test" and paper.title == f"LongBench {record['dataset']} {record['_id'][:8]}"
        assert question.text == record["input"]
        # verbatim, but for qasper's "unanswerable": QASPER's unanswerable answer (the test below)
        assert [answer.free_form_answer or answer.unanswerable * "unanswerable" for answer in question.answers] == record["answers"]
    assert corpus.warnings == ()


def test_multi_document_subsets_are_one_section_per_passage_and_the_others_paragraphs_on_blank_lines(longbench_file):
    corpus = load(longbench_file)
    for paper, question in zip(corpus.papers, corpus.questions, strict=True):
        names = [section.name for section in paper.sections]
        if question.benchmark in ("longbench/hotpotqa", "longbench/2wikimqa", "longbench/musique"):
            assert names == [f"Passage {number}:" for number in range(1, 11)]
            assert block_separator(paper.context) == "\n"
        else:
            assert names == [None] and paper.sections[0].paragraphs == tuple(paper.context.split("\n\n"))
        stated = question.answers[0].free_form_answer
        if stated not in ("yes", "unanswerable"):  # qasper's yes/no and unanswerable questions aside, the text says it
            assert any(stated in text for section in paper.sections for text in section.paragraphs)


def test_memagent_eval_files_load_as_a_json_array_and_as_json_lines_alike(memagent_file, tmp_path):
    records = json.loads(memagent_file.read_text())
    corpus = load(memagent_file)
    assert [question.id for question in corpus.questions] == ["hotpotqa-20-3", "hotpotqa-20-14", "hotpotqa-20-15"]
    assert {question.benchmark for question in corpus.questions} == {"memagent/hotpotqa"}
    paper = corpus.paper("hotpotqa-20-3")
    assert paper.context == records[0]["context"] and paper.title == "MemAgent HotpotQA, 20 documents, question 3"
    assert [section.name for section in paper.sections] == [f"Document {number}:" for number in range(1, 21)]
    assert block_separator(paper.context) == "\n\n"
    as_lines = write_jsonl(tmp_path / "eval_20.jsonl", records)
    assert load(as_lines).sha256 == corpus.sha256


def test_the_supporting_documents_are_sections_that_state_the_answer():
    made = memagent_record(30, 7)
    paper, (question,) = from_record(made.record, "here")
    first, second = (paper.sections[number - 1] for number in made.supporting)
    assert question.answers[0].free_form_answer == made.answer and made.answer in second.paragraphs[0]
    assert "founded by" in first.paragraphs[0] and question.text.startswith("Where was the founder of")


def test_the_context_string_is_kept_as_the_record_holds_it_not_copied():
    record = memagent_record(5, 0).record
    paper, _ = from_record(record, "here")
    assert paper.context is record["context"]


def test_longbench_e_records_load_under_their_own_benchmark(tmp_path):
    record = longbench_record("hotpotqa", 0) | {"dataset": "hotpotqa_e"}
    corpus = load(write_jsonl(tmp_path / "hotpotqa_e.jsonl", [record]))
    assert corpus.questions[0].benchmark == "longbench-e/hotpotqa"
    assert corpus.papers[0].title.startswith("LongBench-E hotpotqa ")


def test_longbench_qasper_s_unanswerable_is_an_unanswerable_answer_and_abstaining_there_is_right(tmp_path):
    record = longbench_record("qasper", 0) | {"input": "What is the zorblax rate of the flimflam?", "answers": ["unanswerable"]}
    both = longbench_record("qasper", 1) | {"answers": [" Unanswerable ", "Caslomar"]}  # two annotators who disagree
    path = write_jsonl(tmp_path / "qasper.jsonl", [record, both])
    unanswerable, disputed = load(path).questions
    assert not unanswerable.answerable and unanswerable.answers[0].reference_text == "Unanswerable"
    assert disputed.answerable and [answer.kind for answer in disputed.answers] == ["none", "abstractive"]
    result = run_cli("eval", "--corpus", str(path), "--policy", "read-all", "--limit", "1", "--out", str(tmp_path / "run"))
    assert result.returncode == 0, result.stderr
    score = json.loads((tmp_path / "run" / "scores.jsonl").read_text())
    assert score["status"] == "abstained" and not score["answerable"]  # its search finds no word of the question
    assert score["answer_f1"] == score["exact_match"] == 1.0 and score["flags"] == []  # no false_abstention


def test_multifieldqa_en_loads_and_extra_keys_are_the_benchmarks_business(tmp_path):
    record = longbench_record("qasper", 0) | {"dataset": "multifieldqa_en", "retrieved": ["a passage"]}
    corpus = load(write_jsonl(tmp_path / "multifieldqa_en.jsonl", [record]))
    assert corpus.questions[0].benchmark == "longbench/multifieldqa_en" and set(LONGBENCH_QA) >= {"multifieldqa_en"}


# -- the sections give the context back, character for character ---------------------------------

EDGES = [
    "one paragraph",
    "a\n\n\n\nb",  # three blank lines: a "" placeholder between
    "\n\nstarts and ends with blank lines\n\n",
    "  spaces  \n\n\t\n\ntrailing ",
    "Passage 1:\nTitle\nText\n\nPassage 2:\nTitle\nText",  # LongBench with a blank line between
    "Passage 1:\nA\nPassage 2:\nB\nPassage 4:\nC",  # a gap in the numbers: the rest stays in block 2
    "Document 1:\n\nDocument 2:\nx",  # an empty document
    "Document 1:\nA\n\nDocument 2:\nB\nDocument 3:\nC",  # a line break where the others have a blank line
    "Passage 1:",  # no line after the header: not the block layout
    "Passage 1:\n",
    "Passage 1:\nx\nPassage 2:\n",
    "Story with\nPassage 2:\nin its text",
    "windows\r\n\r\nline ends\r\n",
    "Passage 1:\nemoji 🙂 and U+2028\u2028inside\nPassage 2:\nlast",
]


@pytest.mark.parametrize("context", EDGES)
def test_edge_contexts_rejoin_exactly(context):
    assert rejoin(split_context(context), block_separator(context)) == context


PIECES = ["Passage 2:\n", "Document 2:\n", "Passage ", "Document ", "1", "2", "3", ":", "\n", "\n\n", "x", " ", "\r"]


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(["", "Passage 1:\n", "Document 1:\n"]), st.lists(st.sampled_from(PIECES), max_size=40))
def test_any_context_rejoins_exactly(start, parts):
    context = start + "".join(parts)
    assert rejoin(split_context(context), block_separator(context)) == context


def test_every_loaded_paper_rejoins_to_its_context(longbench_file, memagent_file):
    papers = [*load(longbench_file).papers, *load(memagent_file).papers]
    for paper in papers:
        assert rejoin(paper.sections, block_separator(paper.context)) == paper.context


# -- refusals: one line naming the file, the line (or record) and the field -------------------------


def refused(tmp_path, records, name="bad.jsonl") -> str:
    path = write_jsonl(tmp_path / name, records)
    with pytest.raises(CorpusError) as raised:
        load(path)
    message = str(raised.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize("subset", ["gov_report", "multifieldqa_zh", "triviaqa", "narrativeqa_e", "passage_count"])
def test_a_subset_that_is_not_english_qa_is_refused_naming_the_line_and_what_is_supported(tmp_path, subset):
    records = [longbench_record("hotpotqa", 0), longbench_record("hotpotqa", 1) | {"dataset": subset}]
    message = refused(tmp_path, records)
    assert message.startswith(f"{tmp_path / 'bad.jsonl'}:2: LongBench subset {subset!r} is not supported")
    assert "narrativeqa, qasper, multifieldqa_en, hotpotqa, 2wikimqa, musique" in message and "hotpotqa_e" in message


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        ({"_id": None}, "field '_id': input should be a valid string"),
        ({"answers": "Paris"}, "field 'answers': input should be a valid list"),
        ({"answers": ["Paris", 3]}, "field 'answers[1]': input should be a valid string"),
        ({"answers": []}, "field 'answers' holds no answer (it is empty)"),
        ({"answers": ["", "  "]}, "field 'answers' holds no answer (each is blank)"),
        ({"input": "   "}, "field 'input' (the question) is blank"),
        ({"context": ""}, "field 'context': string should have at least 1 character"),
        ({"context": " \n\n\t\n"}, "field 'context' (the question's own documents) is only whitespace"),
        ({"_id": "   "}, "field '_id' is only whitespace"),
        ({"length": "9000"}, "field 'length': input should be a valid integer"),
    ],
)
def test_a_longbench_line_with_a_bad_field_is_refused_naming_it(tmp_path, change, fragment):
    message = refused(tmp_path, [longbench_record("musique", 0) | change])
    assert message.startswith(f"{tmp_path / 'bad.jsonl'}:1: ") and fragment in message, message


@pytest.mark.parametrize("missing", ["_id", "input", "context", "answers", "dataset"])
def test_a_longbench_line_missing_a_key_is_refused_naming_it(tmp_path, missing):
    record = {key: value for key, value in longbench_record("musique", 0).items() if key != missing}
    assert f"bad.jsonl:1: field '{missing}' is missing; add it" in refused(tmp_path, [record])


def test_a_memagent_record_with_a_bad_field_is_refused_naming_its_place_in_the_array(tmp_path):
    good = memagent_record(4, 0).record
    path = write_memagent(tmp_path / "eval_4.json", [good, good | {"index": 1, "num_docs": "4"}])
    with pytest.raises(CorpusError, match=r"eval_4\.json: record #1: field 'num_docs': input should be a valid integer"):
        load(path)
    without = {key: value for key, value in good.items() if key != "num_docs"}
    path = write_memagent(tmp_path / "eval_4b.json", [without])
    with pytest.raises(CorpusError, match=r"eval_4b\.json: record #0: field 'num_docs' is missing"):
        load(path)


def test_an_id_longer_than_the_tools_take_is_refused_naming_what_makes_it(tmp_path):
    message = refused(tmp_path, [longbench_record("hotpotqa", 0) | {"_id": "f" * 201}])
    assert "bad.jsonl:1: the record's id (_id) is 201 characters" in message and "ids of at most 200" in message
    huge = memagent_record(4, 0).record | {"num_docs": 10**99, "index": 10**99}  # numbers of 100 digits: JSON's bound
    path = write_memagent(tmp_path / "eval_4.json", [huge])
    with pytest.raises(
        CorpusError, match=r"eval_4\.json: record #0: the record's id \(hotpotqa-\{num_docs\}-\{index\}\) is 210 characters"
    ):
        load(path)


def test_memagent_files_that_store_document_numbers_are_refused_saying_why(tmp_path):
    record = memagent_record(4, 0).record | {"context": [17, 3, 99, 4], "num_docs": 12800}
    path = write_memagent(tmp_path / "eval_12800.json", [record])
    with pytest.raises(CorpusError, match=r"record #0: field 'context' is a list of document numbers.*generate_index_only"):
        load(path)


def test_a_duplicate_id_is_refused_as_for_qasper(tmp_path):
    record = longbench_record("hotpotqa", 0)
    assert "bad.jsonl:2: paper" in (message := refused(tmp_path, [record, record])) and "duplicate paper id (first in" in message
    repeated = memagent_record(4, 0).record
    path = write_memagent(tmp_path / "eval_4.json", [repeated, repeated])
    with pytest.raises(CorpusError, match="duplicate paper id"):
        load(path)


def test_records_that_mix_or_miss_both_benchmarks_keys_are_refused(tmp_path):
    mixed = longbench_record("hotpotqa", 0) | {"num_docs": 10, "index": 2}
    assert "both LongBench's keys" in refused(tmp_path, [mixed])
    bare = {"context": "some text", "input": "a question?", "answers": ["x"]}
    assert "with context and input but neither LongBench's _id and dataset nor MemAgent's num_docs and index" in refused(
        tmp_path, [bare], "bare.jsonl"
    )


# -- splits, hashes, stats ----------------------------------------------------------------------------


def test_records_are_in_the_test_split_unless_split_of_says_otherwise(longbench_file):
    assert {paper.split for paper in load(longbench_file).papers} == {"test"}
    stated = load(longbench_file, split_of={str(longbench_file.resolve()): "validation"})
    assert {paper.split for paper in stated.papers} == {"validation"}


def test_a_questions_file_of_benchmark_records_joins_the_corpus_as_own_document_papers(small_demo, longbench_file, memagent_file):
    joined = with_questions(small_demo, longbench_file)
    assert len(joined.papers) == len(small_demo.papers) + 15 and len(joined.questions) == 15
    assert all(joined.paper(question.paper_id).own_documents for question in joined.questions)
    assert joined.file_sha256 == {str(longbench_file): hashlib.sha256(longbench_file.read_bytes()).hexdigest()}
    loaded = load(longbench_file, questions=memagent_file)
    assert len(loaded.papers) == 18 and [q.benchmark for q in loaded.questions] == ["memagent/hotpotqa"] * 3
    with pytest.raises(CorpusError, match="duplicate paper id.*give the file as questions or in corpus, not both"):
        load(longbench_file, questions=longbench_file)


def test_a_benchmark_record_given_as_questions_with_the_id_of_a_corpus_paper_says_how_to_mend_it(small_demo, longbench_file, tmp_path):
    result = run_cli("eval", "--corpus", str(longbench_file), "--questions", str(longbench_file), "--out", str(tmp_path / "twice"))
    assert result.returncode == 2 and result.stderr.count("\n") == 1
    assert "give the file as --questions or in --corpus, not both" in result.stderr, result.stderr
    taken = write_jsonl(tmp_path / "taken.jsonl", [longbench_record("hotpotqa", 0) | {"_id": small_demo.papers[0].id}])
    with pytest.raises(CorpusError, match=r"taken\.jsonl:1: .*duplicate paper id \(first in the corpus\); another paper of the corpus"):
        with_questions(small_demo, taken)


def test_corpus_stats_pins_each_file_and_counts_questions_per_benchmark(longbench_file, memagent_file):
    result = run_cli("corpus", "stats", "--corpus", str(longbench_file), "--questions", str(memagent_file), "--json")
    assert result.returncode == 0, result.stderr
    stats = json.loads(result.stdout)
    assert stats["file_sha256"] == {str(path): hashlib.sha256(path.read_bytes()).hexdigest() for path in (longbench_file, memagent_file)}
    assert stats["questions_per_benchmark"] == {"memagent/hotpotqa": 3} and stats["papers"] == 18
    table = run_cli("corpus", "stats", "--corpus", str(longbench_file), env={"COLUMNS": "200"})
    labels = [line.split("│")[1].strip() for line in table.stdout.splitlines() if line.startswith("│") and line.split("│")[1].strip()]
    expected = [key if key.endswith("sha256") else key.replace("_", " ") for key in stats]
    assert labels == expected  # the table and --json in one order
    digest = hashlib.sha256(longbench_file.read_bytes()).hexdigest()
    assert f"{digest}  {longbench_file}" in table.stdout  # as sha256sum prints it


def test_questions_without_a_benchmark_count_as_none(small_demo):
    from paper_explorer.corpus.index import BM25Index
    from paper_explorer.corpus.stats import corpus_stats

    stats = corpus_stats(small_demo, BM25Index.cached(small_demo), 0.0)
    assert stats.questions_per_benchmark == {"none": len(small_demo.questions)} and stats.file_sha256 == {}


# -- eval takes them from --questions or --corpus, without other flags --------------------------------


def test_eval_runs_a_longbench_file_given_as_questions_over_the_demo_corpus(longbench_file, tmp_path):
    result = run_cli("eval", "--questions", str(longbench_file), "--out", str(tmp_path / "run"))
    assert result.returncode == 0, result.stderr
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["config"]["questions"] == 15 and manifest["config"]["split"] == "test"
    assert manifest["file_sha256"] == {str(longbench_file.resolve()): hashlib.sha256(longbench_file.read_bytes()).hexdigest()}
    resumed = run_cli("eval", "--out", str(tmp_path / "run"), "--resume", "--questions", str(longbench_file))
    assert resumed.returncode == 0, resumed.stderr


def test_eval_runs_a_memagent_file_given_as_the_corpus(memagent_file, tmp_path):
    result = run_cli("eval", "--corpus", str(memagent_file), "--out", str(tmp_path / "run"))
    assert result.returncode == 0, result.stderr
    lines = (tmp_path / "run" / "trajectories.jsonl").read_text().splitlines()
    assert [json.loads(line)["question_id"] for line in lines] == ["hotpotqa-20-3", "hotpotqa-20-14", "hotpotqa-20-15"]


def test_a_bad_record_given_as_questions_is_one_line_and_exit_2(tmp_path):
    path = write_jsonl(tmp_path / "bad.jsonl", [longbench_record("hotpotqa", 0) | {"dataset": "lcc"}])
    result = run_cli("eval", "--questions", str(path), "--out", str(tmp_path / "run"))
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith(f"error: {path}:1: LongBench subset 'lcc' is not supported")


# -- the 224k-token file --------------------------------------------------------------------------------


def test_the_224k_file_loads_whole_one_section_per_document(memagent_224k):
    corpus = load(memagent_224k.path)
    paper = corpus.paper(memagent_224k.question_id)
    assert paper.context == memagent_224k.context and len(paper.sections) == 1_600
    assert memagent_224k.answer in paper.sections[memagent_224k.supporting[1] - 1].paragraphs[0]
    assert rejoin(paper.sections, block_separator(paper.context)) == paper.context


def test_the_224k_context_is_about_224k_tokens_of_the_real_qwen3_tokenizer(memagent_224k, qwen3_tokenizer):
    from tokenizers import Tokenizer

    tokens = len(Tokenizer.from_file(str(qwen3_tokenizer / "tokenizer.json")).encode(memagent_224k.context, add_special_tokens=False))
    assert 220_000 <= tokens <= 228_000, tokens


def test_the_builders_are_deterministic_and_the_docs_examples_are_theirs():
    assert longbench_records() == longbench_records()
    assert memagent_record(40, 2).record == memagent_record(40, 2).record
    for name, data in example_files().items():
        assert (EXAMPLES / name).read_bytes() == data, f"docs/examples/benchmarks/{name}: run python -m tests.benchmark_files"
