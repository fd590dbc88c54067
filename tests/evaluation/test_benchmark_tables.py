"""Per-benchmark tables (``evaluation.benchmarks``) of real runs: two scripted runs (``answer-key``:
each question's answer, or its failure, fixed in advance) on a corpus built here of LongBench
questions of all six English QA subsets and MemAgent HotpotQA questions, each table figure worked
by hand below; read back through ``explorer eval``, ``inspect``, ``compare``, ``report`` and
``schema`` as a user reads them; and a QASPER run scored before the tables existed, still read."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import pytest

from paper_explorer.corpus.collection import Corpus
from paper_explorer.corpus.schema import Answer, Paper, Question, Section
from paper_explorer.corpus.writing import write_jsonl, write_questions
from paper_explorer.evaluation import answer_metrics
from paper_explorer.evaluation.answer_metrics import HOTPOTQA_F1
from paper_explorer.evaluation.run_directory import Run
from tests.conftest import run_cli
from tests.evaluation import answer_key

WIDE = {"COLUMNS": "220"}

# id, benchmark, references, what run A answers (or how it ends), what run B answers
QUESTIONS = [
    ("nqa-1", "longbench/narrativeqa", ["He went to Paris"], "Paris", "he went to Paris."),
    ("nqa-2", "longbench/narrativeqa", ["a dog", "the hound"], {"end": "policy_error"}, "hound"),
    ("qasper-1", "longbench/qasper", ["unanswerable"], {"end": "abstain"}, "no"),
    ("hotpot-1", "longbench/hotpotqa", ["yes"], "yes, it was", "yes"),
    ("2wiki-1", "longbench/2wikimqa", ["1990"], "199", {"end": "no_answer"}),
    ("musique-1", "longbench/musique", ["Lake Geneva"], {"end": "step_limit"}, "Geneva"),
    ("mf-1", "longbench/multifieldqa_en", ["BERT"], "BERT", "GPT"),
    ("hqa-1", "memagent/hotpotqa", ["yes"], "yes, it was", "Yes."),
    ("hqa-2", "memagent/hotpotqa", ["Marie Curie"], "Curie", "no"),
]

# By hand: (EM, F1, SubEM, failed, no answer) per benchmark, each figure the mean over its questions.
EXPECTED_A = {
    # "Paris" in "he went to paris": F1 2 x 1 x 1/4 / (5/4) = 0.4, SubEM 1; the policy error scores 0
    "longbench/narrativeqa": (0.0, 0.2, 0.5, 1, 0),
    "longbench/qasper": (1.0, 1.0, 1.0, 0, 0),  # an abstention is the answer "Unanswerable"
    "longbench/hotpotqa": (0.0, 0.5, 1.0, 0, 0),  # LongBench's F1 credits "yes it was" against "yes"
    "longbench/2wikimqa": (0.0, 0.0, 1.0, 0, 0),  # "199" inside "1990": SubEM only
    "longbench/musique": (0.0, 0.0, 0.0, 1, 0),  # the step limit: failed, 0
    "longbench/multifieldqa_en": (1.0, 1.0, 1.0, 0, 0),
    "memagent/hotpotqa": (0.0, 1 / 3, 1.0, 0, 0),  # HotpotQA's F1: "yes it was" 0; "Curie" 2/3
}
EXPECTED_B = {
    "longbench/narrativeqa": (1.0, 1.0, 1.0, 0, 0),  # "hound" is "the hound", the best of two references
    "longbench/qasper": (0.0, 0.0, 0.0, 0, 0),
    "longbench/hotpotqa": (1.0, 1.0, 1.0, 0, 0),
    "longbench/2wikimqa": (0.0, 0.0, 0.0, 0, 1),  # no valid answer: 0, in the denominator
    "longbench/musique": (0.0, 2 / 3, 1.0, 0, 0),
    "longbench/multifieldqa_en": (0.0, 0.0, 0.0, 0, 0),
    "memagent/hotpotqa": (0.5, 0.5, 0.5, 0, 0),  # "no" against "Marie Curie": a decision the gold is not
}
FIVE = ("longbench/narrativeqa", "longbench/qasper", "longbench/hotpotqa", "longbench/2wikimqa", "longbench/musique")


def macro(expected: dict, figure: int) -> float:
    return sum(expected[name][figure] for name in FIVE) / 5


def benchmark_question(position: int) -> Question:
    qid, benchmark, refs, _, _ = QUESTIONS[position]
    answers = tuple(Answer(free_form_answer=ref) for ref in refs)  # one per reference, as the loaders give them
    return Question(id=qid, paper_id=f"ctx-{qid}", text=f"Question {position}: what of {qid}?", answers=answers, benchmark=benchmark)


def build_corpus(directory: Path) -> Path:
    """A paper per benchmark question (its own context), and a QASPER-style question without a benchmark."""
    questions = [benchmark_question(i) for i in range(len(QUESTIONS))]
    papers = [
        Paper(id=q.paper_id, title=f"Context of {q.id}", sections=(Section(name=None, paragraphs=(f"Passage {q.id}.",)),))
        for q in questions
    ]
    papers.append(Paper(id="qasper-paper", title="A QASPER paper", sections=(Section(name="Intro", paragraphs=("We use BERT.",)),)))
    questions.append(Question(id="plain-1", paper_id="qasper-paper", text="Which model?", answers=(Answer(extractive_spans=("BERT",)),)))
    path = directory / "bench.jsonl"
    write_jsonl(Corpus(papers=tuple(papers), questions=tuple(questions)), path)
    return path


def key(column: int) -> dict:
    return {f"Question {i}: what of {row[0]}?": row[column] for i, row in enumerate(QUESTIONS)} | {"Which model?": "BERT"}


def evaluate(directory: Path, name: str, column: int, *extra: str):
    (directory / f"{name}.json").write_text(json.dumps(key(column)))
    args = ["--split", "all", "--max-steps", "2", "--policy", "answer-key", "--answer-key", str(directory / f"{name}.json")]
    return run_cli("eval", "--corpus", str(directory / "bench.jsonl"), *args, *extra, "--out", str(directory / name), env=WIDE)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    directory = tmp_path_factory.mktemp("benchmark-tables")
    build_corpus(directory)
    with answer_key.registered():
        done = {name: evaluate(directory, name, column) for name, column in (("a", 3), ("b", 4))}
        for result in done.values():
            assert result.returncode in (0, 1), result.stderr  # 1: the answer key "collapses" onto direct submits
        yield directory, done


def table(output: str, first_cell: str) -> list[str]:
    """The cells of the row of a printed table that begins with ``first_cell``."""
    for line in output.splitlines():
        cells = [cell.strip() for cell in line.strip("│┃ ").split("│")]
        if cells[0] == first_cell:
            return cells
    raise AssertionError(f"no row {first_cell!r} in:\n{output}")


def subset_row(output: str, benchmark: str, subset: str) -> list[str]:
    """The cells of ``subset``'s row in the per-benchmark table, under the row naming ``benchmark``."""
    rows = [[cell.strip() for cell in line.strip("│┃ ").split("│")] for line in output.splitlines()]
    under = next(index for index, cells in enumerate(rows) if cells[0] == benchmark + "/")
    return next(cells for cells in rows[under + 1 :] if cells[0] == subset)


def shares(figures: dict) -> tuple:
    return (figures["exact_match"], figures["f1"], figures["sub_exact_match"], figures["failed"], figures["no_answer"])


def test_metrics_json_holds_each_benchmarks_figures_as_worked_by_hand(runs):
    directory, _ = runs
    for name, expected in (("a", EXPECTED_A), ("b", EXPECTED_B)):
        tables = json.loads((directory / name / "metrics.json").read_text())["benchmarks"]
        assert list(tables["by_benchmark"]) == sorted(expected)  # the QASPER question has no benchmark: in no table
        for benchmark, figures in tables["by_benchmark"].items():
            assert shares(figures) == pytest.approx(expected[benchmark]), (name, benchmark)
            assert figures["f1_metric"] == (HOTPOTQA_F1 if benchmark.startswith("memagent/") else "answer_f1")
        average = tables["longbench_qa"]
        assert average["missing"] == [] and average["subsets"] == list(FIVE)
        assert (average["exact_match"], average["f1"], average["sub_exact_match"]) == pytest.approx(
            (macro(expected, 0), macro(expected, 1), macro(expected, 2))
        )
        run = Run.load(directory / name)  # every figure recomputed from scores.jsonl and the log, and equal
        assert run.metrics.benchmarks is not None and run.metrics.benchmarks.by_benchmark["memagent/hotpotqa"].questions == 2
        scores = [json.loads(line) for line in (directory / name / "scores.jsonl").read_text().splitlines()]
        assert [line.get("benchmark") for line in scores] == [row[1] for row in QUESTIONS] + [None]


def test_eval_and_inspect_print_the_table_x100_with_two_decimals(runs):
    directory, done = runs
    inspected = run_cli("inspect", str(directory / "a"), env=WIDE)
    assert inspected.returncode == 0, inspected.stderr
    for output in (done["a"].stdout, inspected.stdout):
        # each subset under its benchmark's name, its F1 rule said below the table
        assert subset_row(output, "longbench", "narrativeqa") == ["narrativeqa", "2", "0.00", "20.00", "50.00", "1", "0"]
        assert subset_row(output, "memagent", "hotpotqa") == ["hotpotqa", "2", "0.00", "33.33", "100.00", "0", "0"]
        assert "F1 of longbench/: LongBench qa_f1_score" in output and "F1 of memagent/: HotpotQA F1" in output
        # the mean of the five subsets' means: EM (0+1+0+0+0)/5, F1 (0.2+1+0.5+0+0)/5, SubEM (0.5+1+1+1+0)/5
        assert table(output, "LongBench QA (mean of 5 subsets)")[1:7] == ["6", "20.00", "34.00", "70.00", "2", "0"]
    assert subset_row(done["b"].stdout, "longbench", "2wikimqa")[5:7] == ["0", "1"]  # the invalid answer, counted


def test_compare_pairs_each_benchmark_side_by_side_with_the_difference(runs):
    directory, _ = runs
    done = run_cli("compare", str(directory / "a"), str(directory / "b"), "--json")
    assert done.returncode == 0, done.stderr
    paired = json.loads(done.stdout)["benchmarks"]
    for benchmark in EXPECTED_A:
        figures = paired["by_benchmark"][benchmark]
        assert shares(figures["a"]) == pytest.approx(EXPECTED_A[benchmark]) and shares(figures["b"]) == pytest.approx(EXPECTED_B[benchmark])
        differences = [figures["difference"][name] for name in ("exact_match", "f1", "sub_exact_match")]
        assert differences == pytest.approx([b - a for a, b in zip(EXPECTED_A[benchmark][:3], EXPECTED_B[benchmark][:3])])
    narrative = paired["by_benchmark"]["longbench/narrativeqa"]
    assert narrative["questions"] == 2 and narrative["f1_difference_ci95"]["mean"] == pytest.approx(0.8)  # (0.6 + 1.0) / 2
    assert paired["longbench_qa"]["difference"]["f1"] == pytest.approx(macro(EXPECTED_B, 1) - macro(EXPECTED_A, 1))
    shown = run_cli("compare", str(directory / "a"), str(directory / "b"), env=WIDE)
    assert table(shown.stdout, "longbench/narrativeqa") == ["longbench/narrativeqa", "2", "EM", "0.00", "100.00", "+100.00", "-"]
    assert table(shown.stdout, "memagent/hotpotqa")[2:6] == ["EM", "0.00", "50.00", "+50.00"]
    assert "F1 of memagent/: HotpotQA F1" in shown.stdout and "+19.33" in shown.stdout  # LongBench's average F1: 53.33 - 34.00


def test_both_reports_show_the_tables(runs, tmp_path):
    directory, _ = runs
    assert run_cli("report", str(directory / "a"), "--out", str(tmp_path / "a.html")).returncode == 0
    page = (tmp_path / "a.html").read_text()
    rows = re.search(r'<table id="benchmarks">(.*?)</table>', page, re.S)
    assert rows is not None
    assert "<td>memagent/hotpotqa</td><td>2</td><td>0.00</td><td>33.33</td><td>100.00</td>" in rows.group(1)
    assert f"<td>{html.escape('LongBench QA (mean of 5 subsets)')}</td><td>6</td><td>20.00</td><td>34.00</td>" in rows.group(1)
    done = run_cli("report", str(directory / "a"), str(directory / "b"), "--out", str(tmp_path / "ab.html"))
    assert done.returncode == 0, done.stderr
    paired = re.search(r'<table id="paired-benchmarks">(.*?)</table>', (tmp_path / "ab.html").read_text(), re.S)
    assert (
        paired is not None
        and "<td>longbench/narrativeqa</td><td>2</td><td>EM</td><td>0.00</td><td>100.00</td><td>+100.00</td>" in paired.group(1)
    )


def test_the_schemas_describe_the_tables(runs):
    metrics = json.loads(run_cli("schema", "metrics").stdout)
    tables = metrics["properties"]["benchmarks"]
    assert "BenchmarkTables" in json.dumps(tables) and {"BenchmarkFigures", "MacroAverage"} <= set(metrics["$defs"])
    assert set(metrics["$defs"]["BenchmarkFigures"]["properties"]) >= {
        "questions",
        "exact_match",
        "f1",
        "sub_exact_match",
        "failed",
        "no_answer",
    }
    scores = json.loads(run_cli("schema", "scores").stdout)
    assert "benchmark" in scores["properties"] and scores["properties"][HOTPOTQA_F1]["title"].startswith("HotpotQA F1")


def test_without_all_five_subsets_the_average_says_which_are_missing(runs):
    directory, _ = runs
    dropped = ("longbench/musique", "longbench/qasper")
    questions = [benchmark_question(i) for i, row in enumerate(QUESTIONS) if row[1] not in dropped]
    write_questions(questions, directory / "four.jsonl")
    with answer_key.registered():
        done = evaluate(directory, "four", 3, "--questions", str(directory / "four.jsonl"))
    assert done.returncode in (0, 1), done.stderr
    assert "LongBench QA (mean of 5 subsets): not reported, no question of longbench/qasper, longbench/musique" in done.stdout
    average = json.loads((directory / "four" / "metrics.json").read_text())["benchmarks"]["longbench_qa"]
    assert average["missing"] == ["longbench/qasper", "longbench/musique"] and average["f1"] is None


def test_a_run_scored_before_the_tables_and_hotpotqa_f1_is_still_read(tmp_path):
    """A QASPER run whose lines lack hotpotqa_f1 and whose metrics.json lacks benchmarks, as older versions wrote them."""
    saved = dict(answer_metrics._registry)
    del answer_metrics._registry[HOTPOTQA_F1]
    try:
        done = run_cli("eval", "--split", "all", "--limit", "3", "--out", str(tmp_path / "old"))
    finally:
        answer_metrics._registry.clear()
        answer_metrics._registry.update(saved)
    assert done.returncode == 0, done.stderr
    path = tmp_path / "old" / "metrics.json"
    metrics = json.loads(path.read_text())
    del metrics["benchmarks"]
    path.write_text(json.dumps(metrics, indent=2))
    assert all(HOTPOTQA_F1 not in json.loads(line) for line in (tmp_path / "old" / "scores.jsonl").read_text().splitlines())
    run = Run.load(tmp_path / "old")
    assert run.metrics.benchmarks is None and run.metrics.metric(HOTPOTQA_F1) is None
    shown = run_cli("inspect", str(tmp_path / "old"), env=WIDE)
    assert shown.returncode == 0 and "per benchmark" not in shown.stdout
    report = run_cli("report", str(tmp_path / "old"), "--out", str(tmp_path / "old.html"))  # every line recomputed with the corpus
    assert report.returncode == 0, report.stderr
    assert 'id="benchmarks"' not in (tmp_path / "old.html").read_text()
