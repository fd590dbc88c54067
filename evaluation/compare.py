"""Two runs on the same questions: paired tests and the per-question differences."""

from __future__ import annotations

from evaluation.stats import abstention_fisher, bootstrap_mean_ci, exact_mcnemar
from evaluation.summary import Run


def compare_runs(a: Run, b: Run, top: int = 10) -> dict:
    """McNemar on exact-match correctness, Fisher on both abstention rows, a bootstrap interval
    of the paired F1 difference (B - A), and the questions whose F1 moved most."""
    by_a, by_b = a.by_question(), b.by_question()
    shared = [qid for qid in by_a if qid in by_b and by_a[qid].scored and by_b[qid].scored]
    differences = [by_b[qid].answer_f1 - by_a[qid].answer_f1 for qid in shared]
    moved = sorted(shared, key=lambda qid: -abs(by_b[qid].answer_f1 - by_a[qid].answer_f1))[:top]
    return {
        "run_a": str(a.directory), "run_b": str(b.directory),
        "same_corpus": a.manifest.get("hashes", {}).get("corpus_sha256") == b.manifest.get("hashes", {}).get("corpus_sha256"),
        "paired_questions": len(shared), "only_in_a": len(set(by_a) - set(by_b)), "only_in_b": len(set(by_b) - set(by_a)),
        "answer_f1": {"a": a.metrics.answer_f1, "b": b.metrics.answer_f1,
                      "paired_difference_ci95": bootstrap_mean_ci(differences)},
        "mcnemar_exact_match": exact_mcnemar([by_a[q].exact_match >= 1 for q in shared], [by_b[q].exact_match >= 1 for q in shared]),
        "fisher_abstention": [abstention_fisher(a.metrics.abstention.model_dump(), b.metrics.abstention.model_dump(), row)
                              for row in ("unanswerable", "answerable")],
        "direct_submit_rate": {"a": a.metrics.verdict.direct_submit_rate, "b": b.metrics.verdict.direct_submit_rate},
        "largest_differences": [
            {"question_id": qid, "question": by_a[qid].question, "a": by_a[qid].prediction, "b": by_b[qid].prediction,
             "f1_a": by_a[qid].answer_f1, "f1_b": by_b[qid].answer_f1}
            for qid in moved if by_a[qid].answer_f1 != by_b[qid].answer_f1
        ],
    }
