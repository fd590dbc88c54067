"""explorer decide: typed questions scored by a model's option likelihoods, as a user runs it."""

from __future__ import annotations

import json
import math

import pytest

from paper_explorer.decisions.file import load_decisions
from paper_explorer.decisions.likelihood import confidence, normalised
from paper_explorer.decisions.run import read_records
from tests.conftest import run_cli
from tests.decisions.decision_files import DOCUMENTS, write_decisions


@pytest.fixture(scope="module")
def backend(tiny_model):
    from paper_explorer.decisions.backends import LocalBackend

    return LocalBackend.load(str(tiny_model))


def test_the_shared_prefix_pass_gives_each_options_own_likelihood(backend):
    """One batched pass over the prompt's cache equals a full pass per option, for options of any
    length, one a prefix of another, in batches of any size."""
    from paper_explorer.decisions.prompts import build, load_prompts

    options = ["1", "10", "100", "yes", "a much longer option of many words and tokens", "b"]
    built = build(backend.renderer, load_prompts(), "choice", "Which?", "A document. " * 30, options, context=4096)
    assert built.prompt is not None
    separate = backend.score(built.prompt, built.options, "separate").loglikelihoods
    for batch_tokens in (1, 400, 100_000):
        backend.scorer.batch_tokens = batch_tokens
        backend.scorer.forget()
        shared = backend.score(built.prompt, built.options, "shared")
        assert shared.loglikelihoods == pytest.approx(separate, abs=1e-4)
    again = backend.score(built.prompt, built.options, "shared")
    assert again.cached_tokens == len(built.prompt) - 1  # the whole prompt but the token fed again
    assert again.loglikelihoods == pytest.approx(separate, abs=1e-4)


def test_normalised_probabilities_mass_and_confidence():
    probabilities, log_mass = normalised([math.log(0.2), math.log(0.1), math.log(0.1)])
    assert probabilities == pytest.approx([0.5, 0.25, 0.25])
    assert log_mass == pytest.approx(math.log(0.4))
    assert confidence([1 / 3] * 3) == pytest.approx(0.0)
    assert confidence([1.0, 0.0]) == pytest.approx(1.0)
    assert confidence(probabilities) == pytest.approx((3 * 0.5 - 1) / 2)


def test_decide_scores_every_kind_and_writes_a_run(tmp_path, tiny_model):
    file = write_decisions(tmp_path / "decisions.jsonl")
    result = run_cli("decide", str(file), "--model", str(tiny_model), "--out", str(tmp_path / "run"))
    assert result.returncode == 0, result.stderr
    records = {record.question_id: record for record in read_records(tmp_path / "run")}
    assert list(records) == ["q1", "q1n", "q2", "q3", "q4", "q5", "q6"]
    assert records["q1"].options == ["yes", "no", "unknown"]
    assert len(records["q3"].probabilities or []) == 10
    for record in records.values():
        assert sum(record.probabilities or []) == pytest.approx(1.0)
        assert record.predicted == record.options[max(range(len(record.options)), key=(record.probabilities or []).__getitem__)]
    assert records["q6"].correct is None and records["q6"].label is None
    assert records["q1n"].cached_tokens and records["q1n"].cached_tokens > records["q1"].document_tokens  # the document's prefix reused
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert set(metrics["kinds"]) == {"noul", "choice", "score"}
    assert metrics["kinds"]["score"]["labelled"] == 1 and metrics["kinds"]["score"]["measured"] == 2
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["kinds"] == {"noul": 3, "choice": 2, "score": 2} and manifest["backend"] == "hf"


def test_reversed_order_scores_the_options_last_first(tmp_path, tiny_model):
    file = write_decisions(tmp_path / "decisions.jsonl")
    assert run_cli("decide", str(file), "--model", str(tiny_model), "--out", str(tmp_path / "run"), "--order", "reversed").returncode == 0
    record = next(r for r in read_records(tmp_path / "run") if r.question_id == "q2")
    assert record.options == ["GPL-3.0 or later", "BSD-3-Clause", "MIT"]


def test_a_document_over_the_context_is_never_cut_silently(tmp_path, tiny_model):
    long = [{"id": "long", "text": "word " * 400, "questions": [{"id": "q", "kind": "noul", "text": "Is it long?", "label": "yes"}]}]
    file = write_decisions(tmp_path / "long.jsonl", long)
    base = ["decide", str(file), "--model", str(tiny_model), "--max-context", "200"]
    assert run_cli(*base, "--out", str(tmp_path / "refused")).returncode == 0
    [refused] = read_records(tmp_path / "refused")
    assert refused.probabilities is None and "--cut start" in (refused.not_measured or "")
    assert run_cli(*base, "--out", str(tmp_path / "cut"), "--cut", "start").returncode == 0
    [cut] = read_records(tmp_path / "cut")
    assert cut.cut is not None and cut.cut.side == "start" and cut.cut.tokens + cut.cut.kept == cut.document_tokens
    assert cut.prompt_tokens is not None and cut.prompt_tokens + max(cut.option_tokens) <= 200


def test_resume_scores_only_what_is_missing_and_refuses_other_settings(tmp_path, tiny_model):
    file = write_decisions(tmp_path / "decisions.jsonl")
    out = tmp_path / "run"
    assert run_cli("decide", str(file), "--model", str(tiny_model), "--out", str(out)).returncode == 0
    lines = (out / "decisions.jsonl").read_bytes().splitlines(keepends=True)
    (out / "decisions.jsonl").write_bytes(b"".join(lines[:3]) + lines[3][:20])  # a kill mid-line
    assert run_cli("decide", str(file), "--model", str(tiny_model), "--out", str(out)).returncode == 2
    resumed = run_cli("decide", str(file), "--model", str(tiny_model), "--out", str(out), "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert [r.question_id for r in read_records(out)] == ["q1", "q1n", "q2", "q3", "q4", "q5", "q6"]
    other = run_cli("decide", str(file), "--model", str(tiny_model), "--out", str(out), "--resume", "--order", "reversed")
    assert other.returncode == 2 and "order" in other.stderr


@pytest.mark.parametrize(
    ("change", "said"),
    [
        (lambda d: d[0]["questions"][2].update(label="Apache-2.0"), "label 'Apache-2.0' is not one of the options"),
        (lambda d: d[0]["questions"][2].update(options=["MIT"]), "needs 2 to 160 options"),
        (lambda d: d[0]["questions"][2].update(options=[str(n) for n in range(161)], label=None), "needs 2 to 160 options"),
        (lambda d: d[0]["questions"][0].update(options=["no", "yes", "unknown"]), "yes, no, unknown in that order"),
        (lambda d: d[1]["questions"][0].update(id="q1"), "question id 'q1' is also on line 1"),
        (lambda d: d[1]["questions"][0].update(negation_of="q1"), "which is no noul question of document 'd2'"),
        (lambda d: d[0].update(paragraphs=["x"]), "give the document one way"),
        (lambda d: d[0].update(text=None, paper="p1"), "give the corpus it is in with --corpus"),
        (lambda d: d[0]["questions"][2].update(kind="multiple"), "kind"),
    ],
)
def test_a_bad_decision_file_is_one_line_naming_its_place(tmp_path, tiny_model, change, said):
    documents = json.loads(json.dumps(DOCUMENTS))
    change(documents)
    file = write_decisions(tmp_path / "bad.jsonl", documents)
    result = run_cli("decide", str(file), "--model", str(tiny_model), "--out", str(tmp_path / "run"))
    assert result.returncode == 2
    assert said in result.stderr and "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert str(file) in result.stderr
    assert not (tmp_path / "run").exists()


def test_a_paper_of_the_corpus_is_read_as_its_text(tmp_path, small_demo):
    corpus = small_demo
    paper = corpus.papers[0]
    file = write_decisions(
        tmp_path / "paper.jsonl", [{"id": "p", "paper": paper.id, "questions": [{"id": "q", "kind": "noul", "text": "Is it?"}]}]
    )
    [asked] = load_decisions(file, corpus).asked
    assert asked.document.startswith(paper.title.strip()) and paper.sections[0].paragraphs[0].strip() in asked.document


def test_the_python_api_decides_a_file_and_reads_the_run_back(tmp_path, tiny_model):
    from paper_explorer import DecisionRun, decide
    from paper_explorer.decisions.errors import DecisionError

    file = write_decisions(tmp_path / "decisions.jsonl")
    decided = decide(file, model=str(tiny_model), out=tmp_path / "run")
    assert isinstance(decided, DecisionRun) and set(decided.metrics.kinds) == {"noul", "choice", "score"}
    assert decided.by_question()["q2"].options == ["MIT", "BSD-3-Clause", "GPL-3.0 or later"]
    with pytest.raises(DecisionError, match="cut='middle': choose none, start, end"):
        decide(file, model=str(tiny_model), out=tmp_path / "other", cut="middle")


class FailingFirst:
    """A backend whose first ``failures`` scoring calls fail, as a server that was down."""

    def __init__(self, backend, failures: int) -> None:
        self.backend, self.failures = backend, failures
        self.name, self.renderer, self.max_context = backend.name, backend.renderer, backend.max_context

    def settings(self):
        return self.backend.settings()

    def score(self, prompt, options, mode="shared"):
        if self.failures:
            self.failures -= 1
            raise OSError("connection refused")
        return self.backend.score(prompt, options, mode)


def test_resume_retries_the_questions_not_measured_when_asked(tmp_path, backend, tiny_model):
    from paper_explorer.decisions.run import DecideSettings, decide

    decisions = load_decisions(write_decisions(tmp_path / "decisions.jsonl"))
    out = tmp_path / "run"
    decide(decisions, FailingFirst(backend, 2), out, DecideSettings())
    first = read_records(out)
    assert [r.question_id for r in first if not r.measured] == ["q1", "q1n"] and "connection refused" in (first[0].not_measured or "")
    decide(decisions, backend, out, DecideSettings(), resume=True)  # a plain resume keeps them as recorded
    assert [r.question_id for r in read_records(out) if not r.measured] == ["q1", "q1n"]
    notes: list[str] = []
    metrics = decide(decisions, FailingFirst(backend, 1), out, DecideSettings(), resume=True, retry_not_measured=True, note=notes.append)
    assert "retrying 2 questions recorded not measured" in notes
    middle = read_records(out)  # q1 failed again, q1n is measured now
    assert [r.question_id for r in middle] == ["q1", "q1n", "q2", "q3", "q4", "q5", "q6"]
    assert [r.question_id for r in middle if not r.measured] == ["q1"] and metrics.not_measured == 1
    decide(decisions, backend, out, DecideSettings(), resume=True, retry_not_measured=True)
    assert all(r.measured for r in read_records(out))
    assert len((out / "decisions.jsonl").read_bytes().splitlines()) == 7  # one line a question again
    result = run_cli("inspect", str(out))
    assert result.returncode == 0, result.stderr
    assert (
        run_cli(
            "decide", str(tmp_path / "decisions.jsonl"), "--model", str(tiny_model), "--out", str(out), "--retry-not-measured"
        ).returncode
        == 2
    )
