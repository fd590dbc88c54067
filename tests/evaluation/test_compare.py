"""explorer compare on two runs that only partly overlap, checked against figures recomputed here
from scores.jsonl (plain JSON, on the paired questions only) and scipy."""

import json
import shutil
from statistics import fmean

import pytest
from scipy import stats as scipy_stats

from paper_explorer.evaluation.compare import RunComparison, RunSetting, compared_part, confound_note, setting_differences
from paper_explorer.evaluation.run import load_corpus
from tests.conftest import rescored, run_cli

WIDE = {"COLUMNS": "220"}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """On the bundled demo corpus: A answers 40 questions by single-shot RAG, B 30 by the scripted
    policy, C 35 by direct submit - so every pair overlaps only partly."""
    directory = tmp_path_factory.mktemp("compare")
    for name, policy, limit in (("a", "single-shot-rag", 40), ("b", "scripted", 30), ("c", "direct-submit", 35)):
        done = run_cli("eval", "--split", "all", "--limit", str(limit), "--policy", policy, "--out", str(directory / name))
        assert done.returncode == 0, done.stderr
    # A without its first 5 questions: against B (A's first 30) the overlap is partial on both sides
    shutil.copytree(directory / "a", directory / "a-tail")
    lines = (directory / "a" / "trajectories.jsonl").read_text().splitlines(keepends=True)
    (directory / "a-tail" / "trajectories.jsonl").write_text("".join(lines[5:]))
    rescored(directory / "a-tail", load_corpus(None))  # the demo corpus the runs were made on
    return directory


def scores(run) -> dict[str, dict]:
    lines = [json.loads(line) for line in (run / "scores.jsonl").read_text().splitlines() if line.strip()]
    return {s["question_id"]: s for s in lines if s.get("answer_f1") is not None}


def expected(run_a, run_b) -> dict:
    """The comparison recomputed independently: paired = question ids scored in both runs."""
    a, b = scores(run_a), scores(run_b)
    paired = [q for q in a if q in b]
    only_a, only_b = [q for q in a if q not in b], [q for q in b if q not in a]

    def discordant(outcome, questions):
        return (
            sum(1 for q in questions if outcome(a[q]) and not outcome(b[q])),
            sum(1 for q in questions if outcome(b[q]) and not outcome(a[q])),
        )

    def table(side, gold):
        rows = [side[q] for q in paired if side[q]["answerable"] is gold]
        return [sum(1 for s in rows if s["abstained"]), sum(1 for s in rows if not s["abstained"])]

    return {
        "paired": paired,
        "only_a": only_a,
        "only_b": only_b,
        "f1_a": fmean(a[q]["answer_f1"] for q in paired),
        "f1_b": fmean(b[q]["answer_f1"] for q in paired),
        "em_a": fmean(a[q]["exact_match"] for q in paired),
        "em_b": fmean(b[q]["exact_match"] for q in paired),
        "unpaired_f1_a": fmean(a[q]["answer_f1"] for q in only_a) if only_a else None,
        "unpaired_f1_b": fmean(b[q]["answer_f1"] for q in only_b) if only_b else None,
        "em_discordant": discordant(lambda s: s["exact_match"] >= 1, paired),
        "abstained_discordant": discordant(lambda s: s["abstained"], paired),
        "answerable_discordant": discordant(lambda s: s["abstained"], [q for q in paired if a[q]["answerable"]]),
        "unanswerable_discordant": discordant(lambda s: s["abstained"], [q for q in paired if not a[q]["answerable"]]),
        "fisher_tables": {
            gold: [table(a, answerable), table(b, answerable)] for gold, answerable in (("unanswerable", False), ("answerable", True))
        },
    }


def binomial_p(only_a, only_b):
    n = only_a + only_b
    return 1.0 if n == 0 else scipy_stats.binomtest(only_a, n, 0.5).pvalue


def compare_json(run_a, run_b) -> RunComparison:
    done = run_cli("compare", str(run_a), str(run_b), "--json")
    assert done.returncode == 0, done.stderr
    return RunComparison.model_validate_json(done.stdout)  # the typed record, extra fields forbidden


@pytest.mark.parametrize("pair", [("a", "b"), ("b", "a"), ("a", "c"), ("c", "b"), ("a-tail", "b"), ("b", "a-tail")])
def test_every_headline_figure_is_on_the_paired_questions(runs, pair):
    run_a, run_b = runs / pair[0], runs / pair[1]
    want, got = expected(run_a, run_b), compare_json(run_a, run_b)
    assert got.paired_questions == len(want["paired"]) > 0 and got.same_corpus is True
    if "a-tail" in pair:
        assert want["only_a"] and want["only_b"]
    assert got.answer_f1.a == pytest.approx(want["f1_a"]) and got.answer_f1.b == pytest.approx(want["f1_b"])
    ci = got.answer_f1.paired_difference_ci95
    assert ci.mean == pytest.approx(want["f1_b"] - want["f1_a"]) and ci.low <= ci.mean <= ci.high
    exact = got.metric("exact_match")
    assert exact is not None and exact.a == pytest.approx(want["em_a"]) and exact.b == pytest.approx(want["em_b"])
    assert exact.difference == pytest.approx(want["em_b"] - want["em_a"])
    for gold, test in zip(("unanswerable", "answerable"), got.fisher_abstention):
        assert test.row == gold and test.design == "unpaired" and test.table == want["fisher_tables"][gold]
        assert test.p_value == pytest.approx(scipy_stats.fisher_exact(want["fisher_tables"][gold]).pvalue)
    assert got.unpaired.only_in_a == len(want["only_a"]) and got.unpaired.only_in_b == len(want["only_b"])
    for mine, theirs in ((got.unpaired.answer_f1_a, want["unpaired_f1_a"]), (got.unpaired.answer_f1_b, want["unpaired_f1_b"])):
        assert mine == pytest.approx(theirs) if theirs is not None else mine is None


@pytest.mark.parametrize("pair", [("a", "b"), ("a", "c"), ("a-tail", "b")])
def test_mcnemar_counts_discordant_pairs_and_matches_binomtest(runs, pair):
    run_a, run_b = runs / pair[0], runs / pair[1]
    want, got = expected(run_a, run_b), compare_json(run_a, run_b)
    tests = [got.mcnemar_exact_match, *got.mcnemar_abstention]
    keys = ["em_discordant", "abstained_discordant", "answerable_discordant", "unanswerable_discordant"]
    assert [t.outcome for t in tests] == ["exact match", "abstained", "abstained (answerable gold)", "abstained (unanswerable gold)"]
    for test, key in zip(tests, keys):
        assert (test.only_a, test.only_b) == want[key], test.outcome
        assert test.both + test.only_a + test.only_b + test.neither == test.pairs
        assert test.p_value == pytest.approx(binomial_p(*want[key]), rel=1e-12)
    assert tests[2].pairs + tests[3].pairs == got.paired_questions


def test_the_fixture_really_distinguishes_paired_from_whole_run_figures(runs):
    # B (scripted, 30) is A's first 30 questions: A's whole-run F1 and abstention table differ from its paired ones
    got = compare_json(runs / "a", runs / "b")
    whole_a = json.loads((runs / "a" / "metrics.json").read_text())
    assert got.paired_questions == 30 and got.unpaired.only_in_a == 10 and got.unpaired.only_in_b == 0
    assert got.answer_f1.a != pytest.approx(whole_a["answer_f1"])
    assert got.abstention.a.model_dump() != whole_a["abstention"]
    # the paired abstention decisions differ far beyond chance: B abstains on unanswerable questions, A never does
    assert got.mcnemar_abstention[0].only_b > 10 and got.mcnemar_abstention[0].only_a == 0 and got.mcnemar_abstention[0].p_value < 1e-4


def test_text_output_labels_paired_and_unpaired_and_prints_readable_p(runs):
    want = expected(runs / "a", runs / "b")
    shown = run_cli("compare", str(runs / "a"), str(runs / "b"), env=WIDE)
    assert shown.returncode == 0, shown.stderr
    text = shown.stdout
    assert "30 paired questions" in text and "exact McNemar" in text and "primary" in text
    assert "Fisher exact on unanswerable" in text and "unpaired-design test" in text
    assert "NOT comparable" in text
    f1_row = next(line for line in text.splitlines() if line.startswith("│ answer F1 "))
    cells = [cell.strip() for cell in f1_row.strip("│").split("│")]
    assert cells[1:3] == [f"{want['f1_a']:.3f}", f"{want['f1_b']:.3f}"]
    abstained = next(line for line in text.splitlines() if line.startswith("│ abstained  "))
    assert "p < 1e-4" in abstained  # a tiny p is bounded, never rounded to zero
    assert "0.0000" not in text and "p = 0.000 " not in text and "p = 0.000\n" not in text
    other = run_cli("compare", str(runs / "a"), str(runs / "c"), env=WIDE).stdout
    em_row = next(line for line in other.splitlines() if line.startswith("│ exact match ") and "p =" in line)
    assert f"p = {binomial_p(*expected(runs / 'a', runs / 'c')['em_discordant']):.3f}" in em_row


def test_runs_without_a_shared_question_or_with_a_question_twice_are_one_line(runs, tmp_path):
    questions = tmp_path / "other.jsonl"  # the demo corpus's questions under other ids
    questions.write_text(
        "".join(q.model_copy(update={"id": f"other-{q.id}"}).model_dump_json() + "\n" for q in load_corpus(None).questions)
    )
    moved = tmp_path / "moved"
    done = run_cli("eval", "--split", "all", "--limit", "5", "--questions", str(questions), "--out", str(moved))
    assert done.returncode == 0, done.stderr
    for flags in ([], ["--json"]):
        done = run_cli("compare", str(runs / "a"), str(moved), *flags)
        assert done.returncode == 2 and "share no scored question" in done.stderr and "Traceback" not in done.stderr
    twice = tmp_path / "twice"  # a question scored twice: a line of scores.jsonl repeated is no line of the log's
    shutil.copytree(runs / "b", twice)
    lines = (twice / "scores.jsonl").read_text().splitlines()
    (twice / "scores.jsonl").write_text("\n".join(lines + lines[:1]) + "\n")
    done = run_cli("compare", str(runs / "a"), str(twice))
    assert done.returncode == 2 and f"scores.jsonl:{len(lines) + 1}: episode" in done.stderr and "is scored again" in done.stderr


# -- what is compared, and what confounds it (issue 37) -------------------------------------------


def setting(**changes) -> RunSetting:
    base = {
        "policy": "hf",
        "model": "models/smollm2",
        "adapter": None,
        "seed": 0,
        "selected_questions_sha256": "q",
        "policy_settings": {"temperature": 0.0, "max_new_tokens": 96},
        "episode": {"max_steps": 5},
        "prompt_template_sha256": "p",
    }
    return RunSetting.model_validate(base | changes)


@pytest.mark.parametrize(
    ("b", "compared", "confounds"),
    [
        ({"adapter": "sft/checkpoint-16"}, ["adapter"], []),  # base against its adapter: the adapter is the comparison
        ({"model": "models/qwen3"}, ["model"], []),
        ({"model": "models/qwen3", "adapter": "a"}, ["model", "adapter"], []),
        ({"adapter": "a", "seed": 1, "episode": {"max_steps": 8}}, ["adapter"], ["seed", "max_steps"]),
        ({"adapter": "a", "policy_settings": {"temperature": 0.7, "max_new_tokens": 96}}, ["adapter"], ["temperature"]),
        ({"adapter": "a", "prompt_template_sha256": "other"}, ["adapter"], ["prompt template"]),
        # another policy: its own settings mean other things, so they are part of the policy compared
        ({"policy": "openai", "policy_settings": {"temperature": 0.7}}, ["policy"], []),
        ({"policy": "scripted", "selected_questions_sha256": "other"}, ["policy"], ["question selection"]),
        ({"seed": 1}, [], ["seed"]),  # one policy, one change: the seed is what is compared
        ({"seed": 1, "policy_settings": {"temperature": 0.7, "max_new_tokens": 96}}, [], ["seed", "temperature"]),
    ],
)
def test_the_confound_note_names_only_what_else_differs(b, compared, confounds):
    a, other = setting(), setting(**b)
    assert compared_part(a, other) == compared and setting_differences(a, other) == confounds


def test_the_note_reads_as_the_comparison_was_meant(runs):
    def note(compared, differs):
        template = compare_json(runs / "a", runs / "b")
        return confound_note(template.model_copy(update={"compared": compared, "setting_differs": differs}))

    assert note(["adapter"], []) is None and note([], ["seed"]) is None
    assert note(["adapter"], ["seed", "max_steps"]) == (
        "the runs differ in seed, max_steps besides the adapter: a paired difference measures that too"
    )
    assert (
        note([], ["seed", "temperature"])
        == "the runs of one policy differ in seed, temperature: a paired difference measures them all at once"
    )


def test_two_runs_of_one_policy_that_differ_in_two_settings_say_so(tmp_path):
    for name, flags in (("x", ["--seed", "0"]), ("y", ["--seed", "1", "--max-steps", "4"])):
        done = run_cli("eval", "--split", "all", "--limit", "3", "--out", str(tmp_path / name), *flags)
        assert done.returncode == 0, done.stderr
    done = run_cli("compare", str(tmp_path / "x"), str(tmp_path / "y"), env=WIDE)
    assert done.returncode == 0, done.stderr
    assert "note: the runs of one policy differ in seed, max_steps: a paired difference measures them all at once" in done.stdout
