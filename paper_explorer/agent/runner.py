"""Runs episodes: one fresh sandbox per episode, the policy, the config, the hashes."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass

from paper_explorer.agent.loop import corpus_hashes, run_episode, sandbox_limits
from paper_explorer.agent.policies import Policy
from paper_explorer.agent.trajectory import EpisodeConfig, Step, Trajectory
from paper_explorer.corpus import BM25Index, Corpus
from paper_explorer.corpus.schema import Question
from paper_explorer.tools.sandbox import Sandbox


def sandbox_isolation(corpus: Corpus, index: BM25Index, config: EpisodeConfig) -> str:
    """What the sandbox's layers give on this machine, as a worker reports it (for run manifests)."""
    with Sandbox(corpus, sandbox_limits(config), index=index) as sandbox:
        return sandbox.isolation or "language-only"


def episode_id(policy: str, question_id: str | None, question: str, sample: int = 0) -> str:
    """Deterministic: the same question, policy and sample number give the same id in every run."""
    key = question_id or "q-" + hashlib.sha256(question.encode()).hexdigest()[:12]
    return f"{key}:{policy}" + (f"#{sample}" if sample else "")


@dataclass
class EpisodeRunner:
    corpus: Corpus
    index: BM25Index
    policy: Policy
    config: EpisodeConfig

    def __post_init__(self) -> None:
        self.hashes = corpus_hashes(self.corpus, self.policy)
        self.limits = sandbox_limits(self.config)

    def run(
        self,
        text: str,
        question: Question | None = None,
        on_step: Callable[[Step], None] | None = None,
        sample: int = 0,
        policy: Policy | None = None,
    ) -> Trajectory:
        """One episode; ``sample`` numbers a question's attempts (each gets its own seed and id);
        ``policy``: this episode's own copy, when several run at once (``Policy.for_episode``)."""
        question_id = question.id if question else None
        policy = policy or self.policy
        paper_id = question.paper_id if question else None
        with Sandbox(self.corpus, self.limits, index=self.index, paper_id=paper_id) as sandbox:
            return run_episode(
                text,
                policy,
                sandbox,
                self.config,
                self.hashes,
                question_id=question_id,
                paper_id=paper_id,
                document=self.corpus.paper(paper_id).context if paper_id is not None and paper_id in self.corpus else None,
                episode_id=episode_id(policy.name, question_id, text, sample),
                sample=sample,
                on_step=on_step,
            )
