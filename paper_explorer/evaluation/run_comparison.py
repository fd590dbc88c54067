"""``explorer compare`` as a function: two runs compared on the questions both scored.

    from paper_explorer import compare
    comparison = compare("runs/base", "runs/adapter")
    comparison.answer_f1.paired_difference_ci95, comparison.mcnemar_exact_match.p_value

The statistics and the ``RunComparison`` record are ``evaluation.compare``'s; this module loads
the runs, says what a reader of the figures must know (several samples per question: the first
is paired), and refuses two runs that share no scored question.
"""

from __future__ import annotations

from pathlib import Path

from paper_explorer.corpus.selection import Note, log_note
from paper_explorer.evaluation.compare import RunComparison, compare_runs
from paper_explorer.evaluation.errors import EvaluationError
from paper_explorer.evaluation.run_directory import Run


def compare(run_a: Run | str | Path, run_b: Run | str | Path, *, top: int = 10, note: Note = log_note) -> RunComparison:
    """Paired comparison of ``run_b`` with the reference ``run_a`` (each a ``Run`` or a run
    directory): F1 and exact match with a bootstrap interval of the F1 difference, exact McNemar
    on correctness and abstention, Fisher as the unpaired-design test, and the ``top`` questions
    whose F1 moved most. ``note`` hears what the figures leave out (default: logged as a warning)."""
    runs = loaded(run_a), loaded(run_b)
    comparison = compare_runs(*runs, top=top)
    for run in runs:
        if any(score.sample for score in run.scores):
            note(
                f"{run.directory} has several samples per question; the comparison pairs each question's first "
                "(its pass@k and majority vote are in its metrics.json)"
            )
    if comparison.paired_questions == 0:
        raise EvaluationError(
            f"the runs share no scored question ({comparison.unpaired.only_in_a} scored only in A, "
            f"{comparison.unpaired.only_in_b} only in B); compare runs of the same split"
        )
    return comparison


def loaded(run: Run | str | Path) -> Run:
    """A run as given, or the finished run in a directory (``Run.load``: checked)."""
    return run if isinstance(run, Run) else Run.load(run)
