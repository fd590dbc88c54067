"""``explorer run`` as a function: one episode, watched step by step, appended to an episode log.

    from paper_explorer import RunConfig, run
    episode = run(RunConfig(policy={"name": "scripted"}), question_id="q0001", out="runs")
    episode.trajectory.outcome.status, episode.gold_answer

The question is a corpus question by id (its gold answer comes back with the episode), a text of
the caller's own (no gold answer), or, when neither is named, the first answerable question of
the test split - what a bare ``explorer run`` shows. With ``out`` the trajectory is appended to
``out/trajectories.jsonl``, an episode log of its own kind (never an eval run's log, which the
line would break). A replayed episode comes back with its drift from the recording.

Bad input is one ``EvaluationError`` (or ``AgentError``, ``CorpusError``) line naming the
argument to change (``corpus.setting_names``).
"""

from __future__ import annotations

import difflib
import logging
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from paper_explorer.agent.config import RunConfig
from paper_explorer.agent.trajectory import Step, Trajectory
from paper_explorer.corpus import Corpus
from paper_explorer.corpus.schema import Question
from paper_explorer.corpus.selection import Note
from paper_explorer.corpus.setting_names import setting
from paper_explorer.evaluation.errors import EvaluationError
from paper_explorer.evaluation.records import ReplayDrift

log = logging.getLogger(__name__)

EpisodeStarts = Callable[[str, str | None, str], None]  # (question text, question id or None, policy name)


class Episode(BaseModel):
    """What ``run`` did: the trajectory, the corpus question it asked (None for a question of the
    caller's own), where it was written, and a replay's drift from its recording."""

    model_config = ConfigDict(frozen=True)

    trajectory: Trajectory
    question: Question | None
    written_to: Path | None
    replay_drift: ReplayDrift | None

    @property
    def gold_answer(self) -> str | None:
        """The question's gold answers, joined; None for a question without them."""
        if self.question is None:
            return None
        return "; ".join(answer.reference_text for answer in self.question.answers if answer.reference_text) or None


def run(
    config: RunConfig,
    *,
    question: str | None = None,
    question_id: str | None = None,
    corpus: Corpus | str | Path | None = None,
    out: str | Path | None = None,
    replay_other_corpus: bool = False,
    note: Note | None = None,
    on_start: EpisodeStarts | None = None,
    on_step: Callable[[Step], None] | None = None,
) -> Episode:
    """Run ``config``'s policy on one question and return the episode.

    ``question``: a question of your own; ``question_id``: a question of ``corpus`` (a loaded
    ``Corpus``, a file or directory, or None for the demo corpus); neither: the demo question.
    ``out``: a directory whose ``trajectories.jsonl`` the episode is appended to (None: not
    written). ``note`` hears the policy's preflight note (default: logged as a warning);
    ``on_start`` is called once the question is known, ``on_step`` after each step."""
    from paper_explorer.agent.policies import make_policy
    from paper_explorer.agent.policies.memory_reader import MemoryReaderConfig
    from paper_explorer.agent.policies.replay import Replay
    from paper_explorer.agent.runner import EpisodeRunner
    from paper_explorer.agent.writer import TrajectoryLog
    from paper_explorer.corpus import BM25Index
    from paper_explorer.evaluation.replay_drift import replay_drift
    from paper_explorer.evaluation.run import load_corpus, loaded_state_frozen, refuse_other_corpus

    text = _own_question(question, question_id)
    log_file = None if out is None else episode_log(Path(out))
    if isinstance(config.policy, MemoryReaderConfig) and config.policy.scope == "paper" and text is not None:
        raise EvaluationError(
            f"{setting('policy.scope', 'paper')} reads the question's own paper, and a question of your own has none; "
            f"use {setting('policy.scope', 'search:K')}"
        )
    policy = make_policy(config.policy, config.episode.max_steps)
    preflight = policy.preflight()
    if preflight:
        (note or _log_note)(preflight)
    loaded = load_corpus(corpus)
    refuse_other_corpus(policy, loaded.papers_sha256, replay_other_corpus)
    asked = find_question(loaded, question_id) if question_id is not None else demo_question(loaded) if text is None else None
    text = asked.text if asked is not None else text
    assert text is not None
    runner = EpisodeRunner(loaded, BM25Index.cached(loaded), policy, config.episode)
    if on_start is not None:
        on_start(text, asked.id if asked else None, policy.name)
    with loaded_state_frozen():
        trajectory = runner.run(text, asked, on_step=on_step)
    if log_file is not None:
        with TrajectoryLog(log_file) as episodes:
            episodes.append(trajectory)
    drift = replay_drift([trajectory]) if isinstance(policy, Replay) else None
    return Episode(trajectory=trajectory, question=asked, written_to=log_file, replay_drift=drift)


def _log_note(line: str) -> None:
    log.warning("%s", line)


def _own_question(question: str | None, question_id: str | None) -> str | None:
    """The caller's own question, stripped; refused when empty or given beside a question id."""
    if question is not None and question_id is not None:
        raise EvaluationError(f"pass {setting('question')} or {setting('question_id')}, not both")
    if question is not None and not question.strip():
        raise EvaluationError(f"{setting('question')} is empty; write the question to ask")
    return question.strip() if question is not None else None


def episode_log(out: Path) -> Path:
    """The log ``run`` appends to: ``out`` holds episode logs of ``run`` only, never a directory of
    another kind - an episode appended to an eval run's log would break that run (export refuses
    it, and a resume cannot mend it)."""
    from paper_explorer.evaluation.run_directory import EPISODE_LOG, TRAJECTORIES, kind_of

    if out.exists() and not out.is_dir():
        raise EvaluationError(f"{out}: is a file; {setting('out')} names a directory")
    kind = kind_of(out)
    if kind is not None and kind is not EPISODE_LOG:
        raise EvaluationError(
            f"{kind.named(out)}; explorer run appends its episode only to a log of its own: "
            f"choose another {setting('out')} ({kind.taken_by(out)})"
        )
    return out / TRAJECTORIES


def demo_question(corpus: Corpus) -> Question:
    """The first answerable question of the test split (else of the corpus): what a bare ``run`` asks."""
    if not corpus.questions:
        raise EvaluationError(f"the corpus has no questions; pass {setting('question')} with one of your own")
    test_papers = {paper.id for paper in corpus.papers if paper.split == "test"}
    answerable = [q for q in corpus.questions if q.answerable]
    pools = ([q for q in answerable if q.paper_id in test_papers], answerable, list(corpus.questions))
    return next(pool[0] for pool in pools if pool)


def find_question(corpus: Corpus, question_id: str) -> Question:
    for question in corpus.questions:
        if question.id == question_id:
            return question
    close = difflib.get_close_matches(question_id, [q.id for q in corpus.questions], n=3)
    hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
    raise EvaluationError(f"no question {question_id!r} in the corpus{hint}")
