"""A run's headline figures from its trajectories: answer F1, exact match, the abstention table."""

from __future__ import annotations

from collections import Counter
from statistics import fmean

from agent.trajectory import Trajectory
from corpus.schema import Question
from evaluation.answers import ABSTENTION, best_over_references, exact_match, is_answerable, token_f1


def prediction(trajectory: Trajectory) -> str:
    """What the episode answered; an abstention - or no answer at all - is "Unanswerable"."""
    outcome = trajectory.outcome
    return outcome.answer if outcome.status == "submitted" and outcome.answer is not None else ABSTENTION


def run_metrics(trajectories: list[Trajectory], questions: dict[str, Question]) -> dict:
    scored = [(t, questions[t.question_id]) for t in trajectories if t.question_id in questions]
    table = {"answerable": {"answered": 0, "abstained": 0}, "unanswerable": {"answered": 0, "abstained": 0}}
    f1s, ems = [], []
    for trajectory, question in scored:
        predicted = prediction(trajectory)
        f1s.append(best_over_references(token_f1, predicted, question))
        ems.append(best_over_references(exact_match, predicted, question))
        row = "answerable" if is_answerable(question) else "unanswerable"
        table[row]["abstained" if predicted == ABSTENTION else "answered"] += 1

    def rate(row: str, column: str) -> float | None:
        total = sum(table[row].values())
        return table[row][column] / total if total else None

    return {
        "episodes": len(trajectories),
        "scored": len(scored),
        "answer_f1": fmean(f1s) if f1s else None,
        "exact_match": fmean(ems) if ems else None,
        "abstention": table,
        "false_abstention_rate": rate("answerable", "abstained"),
        "missed_abstention_rate": rate("unanswerable", "answered"),
        "status": dict(sorted(Counter(t.outcome.status for t in trajectories).items())),
        "mean_steps": fmean(len(t.steps) for t in trajectories) if trajectories else None,
        "mean_tool_calls": fmean(sum(len(s.tool_calls) for s in t.steps) for t in trajectories) if trajectories else None,
        # model policies: what the server or the generation cap did to the run
        "api_retries": sum((s.generation or {}).get("api_retries", 0) for t in trajectories for s in t.steps),
        "parity_warnings": sum(1 for t in trajectories for s in t.steps if (s.generation or {}).get("parity_warning")),
        "hit_cap_steps": sum(1 for t in trajectories for s in t.steps if (s.generation or {}).get("hit_cap")),
    }
