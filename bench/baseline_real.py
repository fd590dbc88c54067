"""The scripted baseline against always-abstain on a corpus and a question set of your own.

    python bench/baseline_real.py CORPUS QUESTIONS.jsonl [--policy scripted] [--limit N]

CORPUS is anything ``explorer eval --corpus`` takes (QASPER v0.3 JSON, Hugging Face rows or
explorer JSONL); QUESTIONS is a JSONL of ``corpus.Question`` lines (the ``--questions`` file of
``explorer eval``), or ``-`` to use the corpus's own questions. Nothing is written: it prints,
for each policy, answer F1 overall and on the answerable and unanswerable halves, and the false
and missed abstention rates.

Always-abstain is the floor a reader must beat on a set that is half unanswerable: it scores 1
on every unanswerable question and 0 on every answerable one. It runs through the same episode
loop and scorer as the scripted policy, so the two numbers differ only in the policy.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from paper_explorer.agent.policies import Policy, Reply, make_config, make_policy  # noqa: E402
from paper_explorer.agent.policies.base import action  # noqa: E402
from paper_explorer.agent.runner import EpisodeRunner  # noqa: E402
from paper_explorer.agent.trajectory import EpisodeConfig  # noqa: E402
from paper_explorer.corpus import BM25Index, load  # noqa: E402
from paper_explorer.evaluation.scoring import EpisodeScore, score_episode  # noqa: E402


class AlwaysAbstain(Policy):
    """Abstains at once, without a tool: the floor on a half-unanswerable set."""

    name = "always-abstain"

    def act(self, messages: list[dict[str, str]]) -> Reply:
        return Reply(action('abstain("Always abstain.")'))


def run(policy: Policy, runner_for, questions) -> list[EpisodeScore]:
    runner = runner_for(policy)
    return [score_episode(runner.run(question.text, question), question) for question in questions]


def mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def summary(name: str, scores: list[EpisodeScore], seconds: float) -> str:
    answerable = [s for s in scores if s.answerable]
    unanswerable = [s for s in scores if not s.answerable]
    return (
        f"{name:<16} {mean([s.answer_f1 for s in scores]):>7.3f} {mean([s.answer_f1 for s in answerable]):>10.3f} "
        f"{mean([s.answer_f1 for s in unanswerable]):>12.3f} {mean([float(s.abstained) for s in answerable]):>9.2f} "
        f"{mean([float(not s.abstained) for s in unanswerable]):>8.2f} {seconds:>6.1f}s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("corpus", type=Path)
    parser.add_argument("questions", help="JSONL of questions, or - for the corpus's own")
    parser.add_argument("--policy", default="scripted", help="the policy to compare with always-abstain (default scripted)")
    parser.add_argument("--limit", type=int, default=None, help="only the first N questions")
    args = parser.parse_args()

    corpus = load(args.corpus, None if args.questions == "-" else args.questions)
    questions = [q for q in corpus.questions if q.answers][: args.limit]
    index = BM25Index.cached(corpus)

    def runner_for(policy: Policy) -> EpisodeRunner:
        return EpisodeRunner(corpus, index, policy, EpisodeConfig())

    answerable = sum(q.answerable for q in questions)
    print(f"{len(questions)} questions with gold answers: {answerable} answerable, {len(questions) - answerable} unanswerable")
    print(f"{'policy':<16} {'F1':>7} {'answerable':>10} {'unanswerable':>12} {'false_abs':>9} {'missed':>8} {'time':>7}")
    for policy in (AlwaysAbstain(), make_policy(make_config(args.policy))):
        started = time.perf_counter()
        scores = run(policy, runner_for, questions)
        print(summary(policy.name, scores, time.perf_counter() - started))


if __name__ == "__main__":
    main()
