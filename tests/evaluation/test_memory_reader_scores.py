"""The evaluation side of the memory reader: both SubEM variants on hand-worked examples, tokens
spent (``evaluation.tokens``) on hand-built trajectories, and the no_answer outcome scored zero
and counted in metrics.json, the abstention table, inspect, compare and both reports.

The runs are real scripted runs (``explorer eval``) whose trajectories are then given what the
memory reader and a model policy record (a ``Reading``, ``Generation`` token counts, a no_answer
outcome), rescored with ``evaluation.scoring`` and read back through the CLI."""

from __future__ import annotations

import json
import shutil
from statistics import fmean, median

import pytest

from paper_explorer.agent.trajectory import Generation, MemoryAnswer, Outcome, Reading, Served, StepPolicyInfo, Trajectory
from paper_explorer.agent.writer import read_trajectories
from paper_explorer.corpus.loading import load
from paper_explorer.evaluation.answers import sub_exact_match, substring_exact_match
from paper_explorer.evaluation.compare import RunComparison
from paper_explorer.evaluation.records import RunMetrics
from paper_explorer.evaluation.run_directory import Run
from paper_explorer.evaluation.tokens import model_tokens
from tests.conftest import rescored, run_cli

WIDE = {"COLUMNS": "220"}
CUT = "the final answer was cut at its cap of 64 tokens"


@pytest.mark.parametrize(
    "prediction, reference, whole_tokens, substring",
    [
        ("1", "10", 0.0, 1.0),  # a character substring only
        ("10", "1", 0.0, 1.0),  # either way round
        ("cat", "concatenate", 0.0, 1.0),
        ("BERT", "We fine-tune BERT.", 1.0, 1.0),  # whole tokens: both accept
        ("We fine-tune BERT and RoBERTa", "BERT", 1.0, 1.0),  # the prediction holds the reference
        ("The BERT!", "bert", 1.0, 1.0),  # normalised first: case, punctuation, articles
        ("GPT", "BERT", 0.0, 0.0),
        ("", "10", 0.0, 0.0),  # empty on either side scores zero ("" is in every string)
        ("10", "", 0.0, 0.0),
        ("   ", "10", 0.0, 0.0),  # whitespace only: empty after normalisation
        ("?!.", "10", 0.0, 0.0),  # punctuation only
        ("the", "the theory", 0.0, 0.0),  # an article only: empty after normalisation
        ("1 0", "10", 0.0, 0.0),  # "1 0" is not a substring of "10"
    ],
)
def test_both_sub_exact_match_variants(prediction, reference, whole_tokens, substring):
    assert sub_exact_match(prediction, reference) == whole_tokens
    assert substring_exact_match(prediction, reference) == substring


# -- hand-built trajectories --------------------------------------------------------------------


def served(tokens: int) -> Served:
    return Served(source="policy", tokens=tokens, sha256="0" * 64, tokenizer_sha256="1" * 64, reply_sha256="2" * 64)


def reading(model_tokens: int, document: int = 900, unread: int = 100, cut_answer: bool = False) -> Reading:
    answer = None
    if cut_answer:
        answer = MemoryAnswer(
            text="an answer that runs on",
            answer=None,
            invalid="cut at the answer cap",
            memory_tokens_in=32,
            served=served(120),
            generation=Generation(prompt_tokens=120, generated_tokens=64, hit_cap=True),
        )
    return Reading(
        scope="search:2",
        papers=["p"],
        document_tokens=document,
        read_tokens=document - unread,
        unread_tokens=unread,
        pages=2,
        passes=1,
        answer=answer,
        model_tokens=model_tokens,
    )


def with_steps(trajectory: Trajectory, generations: list[Generation | None], last_reading: Reading | None = None) -> Trajectory:
    """The trajectory with its steps' generation records replaced (one per step, from the first),
    and a reading record on its last step."""
    steps = [step.model_copy(update={"generation": generation}) for step, generation in zip(trajectory.steps, generations)]
    steps += trajectory.steps[len(generations) :]
    if last_reading is not None:
        steps[-1] = steps[-1].model_copy(update={"policy_info": StepPolicyInfo(reading=last_reading)})
    return trajectory.model_copy(update={"steps": steps})


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A scripted run ("code") on a 10-paper corpus, and a copy of it made into a reader run."""
    directory = tmp_path_factory.mktemp("memory-reader-scores")
    corpus = directory / "small.jsonl"
    assert run_cli("corpus", "generate", "--papers", "10", "--seed", "3", "--out", str(corpus)).returncode == 0
    done = run_cli(
        "eval", "--corpus", str(corpus), "--split", "all", "--limit", "6", "--policy", "scripted", "--out", str(directory / "code")
    )
    assert done.returncode == 0, done.stderr
    shutil.copytree(directory / "code", directory / "reader")
    return directory


def rewrite(run, trajectories: list[Trajectory], corpus) -> tuple[list, RunMetrics]:
    """The run's log, scores.jsonl and metrics.json rewritten as explorer eval writes them."""
    (run / "trajectories.jsonl").write_text("".join(t.model_dump_json() + "\n" for t in trajectories))
    loaded = Run.load(rescored(run, corpus))
    return loaded.scores, loaded.metrics


@pytest.fixture(scope="module")
def scored(runs):
    """The code run with model generations on its steps (prompt 1000 + 100 i, 20 generated each);
    the reader run with a Reading on each episode (model tokens 5000 + 1000 i), its first episode
    ended in no_answer (its final answer cut at the cap), and another seed in its manifest and episodes."""
    corpus = load(runs / "small.jsonl")
    code = read_trajectories(runs / "code" / "trajectories.jsonl")
    code = [with_steps(t, [Generation(prompt_tokens=1000 + 100 * i, generated_tokens=20) for i in range(len(t.steps))]) for t in code]
    reader = read_trajectories(runs / "reader" / "trajectories.jsonl")
    reader = [with_steps(t, [], reading(5000 + 1000 * n, document=900 + n, cut_answer=n == 0)) for n, t in enumerate(reader)]
    reader[0] = reader[0].model_copy(update={"outcome": Outcome(status="no_answer", reason=CUT)})
    reader = [t.model_copy(update={"config": t.config.model_copy(update={"seed": 1})}) for t in reader]  # the manifest's seed
    manifest = json.loads((runs / "reader" / "manifest.json").read_text())
    manifest["config"]["episode"]["seed"] = 1
    (runs / "reader" / "manifest.json").write_text(json.dumps(manifest))
    return {"code": (code, *rewrite(runs / "code", code, corpus)), "reader": (reader, *rewrite(runs / "reader", reader, corpus))}


def test_model_tokens_sum_prompt_and_generated_tokens_over_every_model_call(runs):
    trajectory = read_trajectories(runs / "code" / "trajectories.jsonl")[0]
    assert len(trajectory.steps) >= 2
    assert model_tokens(trajectory) is None  # the scripted policy made no model call
    both = with_steps(trajectory, [Generation(prompt_tokens=300, generated_tokens=40), Generation(prompt_tokens=350, generated_tokens=12)])
    assert model_tokens(both) == 300 + 40 + 350 + 12  # each prompt counted in full, cached or not
    missing = with_steps(trajectory, [Generation(generated_tokens=40), Generation(prompt_tokens=350, cached_tokens=300)])
    assert model_tokens(missing) == 40 + 350  # a count not recorded counts 0; the cache saves nothing here
    chat = with_steps(trajectory, [Generation(usage_prompt_tokens=500, generated_tokens=7)])
    assert model_tokens(chat) == 507  # a chat API's own count of the prompt stands in for the renderer's
    assert model_tokens(with_steps(trajectory, [], reading(4321))) == 4321  # the reader's own total
    mixed = with_steps(trajectory, [Generation(prompt_tokens=10, generated_tokens=2)], reading(100))
    assert model_tokens(mixed) == 112
    assert model_tokens(with_steps(trajectory, [Generation()])) == 0  # a model call with no counts recorded: 0, not None


def test_no_answer_is_scored_zero_and_kept_in_the_denominator(scored):
    trajectories, scores, metrics = scored["reader"]
    first = scores[0]
    assert first.status == "no_answer" and first.prediction == "" and first.scored
    for name in ("answer_f1", "exact_match", "sub_exact_match", "sub_exact_match_substring", "evidence_f1_strict"):
        assert first.metric(name) == 0.0, name
    assert not first.abstained
    assert [flag.text for flag in first.flags if flag.detector == "invalid_answer"] == [CUT]
    assert any(flag.detector == "no_answer" for flag in first.flags)  # the umbrella flag: ended without answering
    assert metrics.scored == 6 and metrics.status["no_answer"] == 1
    assert metrics.answer_f1 == pytest.approx(fmean(s.answer_f1 for s in scores))  # six in the denominator, one a zero
    assert metrics.metric("sub_exact_match_substring") == pytest.approx(fmean(s.value("sub_exact_match_substring") for s in scores))
    row = metrics.abstention.answerable if first.answerable else metrics.abstention.unanswerable
    assert row.no_answer == 1 and row.undecided() == 1
    rows = [counts for _, counts in metrics.abstention.rows()]
    assert sum(c.answered for c in rows) == sum(1 for s in scores if s.status == "submitted")  # never counted as answered
    assert sum(c.answered + c.abstained for c in rows) == 5 and sum(c.undecided() for c in rows) == 1
    assert metrics.detector_rates["invalid_answer"] == pytest.approx(1 / 6)


def test_tokens_spent_are_in_the_scores_and_metrics(scored):
    trajectories, scores, metrics = scored["code"]
    expected = [sum(1000 + 100 * i + 20 for i in range(len(t.steps))) for t in trajectories]
    assert [s.model_tokens for s in scores] == expected
    assert metrics.mean_model_tokens == pytest.approx(fmean(expected)) and metrics.median_model_tokens == pytest.approx(median(expected))
    assert metrics.mean_document_tokens is None and metrics.mean_unread_tokens is None
    _, scores, metrics = scored["reader"]
    assert [s.model_tokens for s in scores] == [5000 + 1000 * n for n in range(6)]
    assert [s.document_tokens for s in scores] == [900 + n for n in range(6)] and {s.unread_tokens for s in scores} == {100}
    assert metrics.mean_model_tokens == 7500.0 and metrics.median_model_tokens == 7500.0
    assert metrics.mean_document_tokens == pytest.approx(902.5) and metrics.mean_unread_tokens == 100.0


def test_inspect_shows_no_answer_both_sub_ems_and_tokens(runs, scored):
    done = run_cli("inspect", str(runs / "reader"), env=WIDE)
    assert done.returncode == 0, done.stderr
    text = done.stdout
    assert "SubEM (whole tokens)" in text and "SubEM (substring, LongBench)" in text
    assert "model tokens per episode, mean" in text and "7,500" in text and "document tokens" in text
    assert "no_answer" in text and "1 episodes ended in no_answer" in text and "invalid_answer" in text
    header = next(line for line in text.splitlines() if "gold \\ ended" in line)
    assert header.split("┃")[-2].strip() == "no_answer"  # a column of its own
    worst = next(line for line in text.splitlines() if line.startswith("│ demo") and "invalid_answer" in line)
    assert "0.00" in worst and "5,000" in worst  # its F1 and tokens spent
    flagged = run_cli("inspect", str(runs / "reader"), "--flag", "invalid_answer", env=WIDE)
    assert flagged.returncode == 0 and "1 of 6 episodes" in flagged.stdout and "cut at its cap" in flagged.stdout


def test_compare_pairs_a_reader_with_a_code_agent_and_pairs_tokens(runs, scored):
    code_scores, reader_scores = scored["code"][1], scored["reader"][1]
    done = run_cli("compare", str(runs / "code"), str(runs / "reader"), "--json")
    assert done.returncode == 0, done.stderr
    got = RunComparison.model_validate_json(done.stdout)
    # both runs' trajectories are the scripted policy's here: one policy, only the seed changed, which is what is compared
    assert got.paired_questions == 6 and got.setting_differs == ["seed"] and got.compared == []
    assert (got.setting_a.seed, got.setting_b.seed) == (0, 1)
    tokens = got.model_tokens
    assert tokens.pairs == 6 and tokens.a == pytest.approx(fmean(s.model_tokens for s in code_scores)) and tokens.b == 7500.0
    differences = [y.model_tokens - x.model_tokens for x, y in zip(code_scores, reader_scores)]
    assert tokens.paired_difference_ci95.mean == pytest.approx(fmean(differences))
    assert tokens.paired_difference_ci95.low <= tokens.paired_difference_ci95.mean <= tokens.paired_difference_ci95.high
    for name in ("sub_exact_match", "sub_exact_match_substring"):
        figure = got.metric(name)
        assert figure is not None and figure.b == pytest.approx(fmean(s.value(name) for s in reader_scores))
        assert figure.difference == pytest.approx(figure.b - figure.a)
    assert [t.outcome for t in got.mcnemar_answers] == ["exact match", "SubEM (whole tokens)", "SubEM (substring, LongBench)"]
    # the no_answer episode is a wrong answer in every correctness test and no decision in the abstention tests
    assert all(t.pairs == 6 for t in got.mcnemar_answers)
    assert got.mcnemar_abstention[0].pairs == 5
    row = got.abstention.b.answerable if reader_scores[0].answerable else got.abstention.b.unanswerable
    assert row.no_answer == 1
    text = run_cli("compare", str(runs / "code"), str(runs / "reader"), env=WIDE).stdout
    assert "note: the runs" not in text
    spent = next(line for line in text.splitlines() if "model tokens per episode (6 pairs)" in line)
    assert "7,500" in spent and f"{fmean(differences):+,.0f}" in spent
    assert "SubEM (substring, LongBench)" in text and "A neither" in text


def test_reports_show_no_answer_and_tokens(runs, scored, tmp_path):
    done = run_cli("report", str(runs / "reader"), "--out", str(tmp_path / "reader.html"))
    assert done.returncode == 0, done.stderr
    page = (tmp_path / "reader.html").read_text()
    assert "<th>no answer</th></tr>" in page
    row = "answerable" if scored["reader"][1][0].answerable else "unanswerable"
    counts = scored["reader"][2].abstention.answerable if row == "answerable" else scored["reader"][2].abstention.unanswerable
    cells = f"<td>{counts.answered}</td><td>{counts.abstained}</td><td>0</td><td>0</td><td>0</td><td>1</td></tr>"
    assert f"<tr><th>{row}</th>{cells}" in page
    assert "<tr><th>mean_model_tokens: model tokens per episode, mean</th><td>7,500</td></tr>" in page
    assert "sub_exact_match_substring: SubEM (substring, LongBench)" in page and "<th>model tokens</th>" in page
    assert '"model_tokens": 5000' in page and '"status": "no_answer"' in page  # the episode rows' data
    compared = run_cli("report", str(runs / "code"), str(runs / "reader"), "--out", str(tmp_path / "both.html"))
    assert compared.returncode == 0, compared.stderr
    both = (tmp_path / "both.html").read_text()
    assert "model tokens per episode (6 pairs)" in both and "SubEM (whole tokens)" in both and "<th>tokens B</th>" in both
    assert "besides the" not in both and "B neither" in both


def test_the_inspect_export_says_the_answer_was_cut(runs, scored, tmp_path):
    log_module = pytest.importorskip("inspect_ai.log")
    done = run_cli("export", str(runs / "reader"), "--to", "inspect", str(tmp_path / "reader.eval"))
    assert done.returncode == 0, done.stderr
    samples = {s.metadata["episode_id"]: s for s in log_module.read_eval_log(str(tmp_path / "reader.eval")).samples}
    first = samples[scored["reader"][1][0].episode_id]
    assert first.limit.type == "token" and first.limit.limit == 64 and first.limit.reason == CUT
    assert first.scores["status"].value == "no_answer" and first.scores["sub_exact_match_substring"].value == 0.0
    assert first.metadata["model_tokens"] == 5000
    assert first.model_usage["explorer/scripted"].input_tokens == 120  # the reader's answer call, the one with counts here
