"""``explorer sft teach`` as a function: gold-guided teacher trajectories for a split's questions.

    from paper_explorer import TeachConfig, teach
    report = teach(TeachConfig(limit=12), out="teacher.jsonl")  # the demo corpus's train split
    report.written, report.statuses

The teacher (``sft.teacher.Teacher``) acts through the real tools and loop, so its observations
are real; its choices come from the gold annotation. Trajectories are appended to ``out``: a
rerun after an interruption writes only the questions the file does not hold yet.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from paper_explorer.agent.config import Split
from paper_explorer.agent.trajectory import MAX_STEPS
from paper_explorer.corpus import Corpus
from paper_explorer.corpus.selection import Note, log_note
from paper_explorer.corpus.setting_names import setting
from paper_explorer.sft.errors import TrainingError


class TeachConfig(BaseModel):
    """Which questions the teacher answers, and how. Each field's description is its flag's help
    (``explorer sft teach``, made by ``cli.flags``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    split: Split | None = Field(
        None, description="Questions of which split: train, validation, test or all (default train; all when the corpus has no splits)."
    )
    split_of: dict[str, str] = Field(default_factory=dict, description="Corpus file -> split, for files whose names do not say.")
    limit: int | None = Field(None, ge=1, description="Only the first N questions.")
    direct: bool = Field(False, description="Submit the gold answer as the first action (reproduces the shortcut).")
    thinking: bool = Field(False, description="Write each action's reasoning as a Qwen3 think block (thinking-mode data).")
    max_steps: int = Field(10, ge=1, le=MAX_STEPS, description="Actions per episode.")
    tokenizer: Path | None = Field(None, description="Record the prompts this tokenizer's renderer would serve (for check-parity).")


class TeachReport(BaseModel):
    """What ``teach`` wrote: how many questions were selected, how many episodes this call added
    (by outcome status), and how many the file held already."""

    model_config = ConfigDict(frozen=True)

    out: Path
    questions: int
    written: int
    already_written: int
    statuses: dict[str, int]


def teach(
    config: TeachConfig,
    *,
    out: str | Path,
    corpus: Corpus | str | Path | None = None,
    questions: str | Path | None = None,
    note: Note = log_note,
) -> TeachReport:
    """Append a teacher trajectory to ``out`` (a .jsonl file) for each selected question it lacks.

    ``corpus``: a loaded ``Corpus``, a file or directory, or None for the demo corpus;
    ``questions``: a JSONL file of questions that replaces the corpus's own. ``note`` hears which
    split was chosen when none was named (default: logged as a warning)."""
    from paper_explorer.agent.runner import EpisodeRunner
    from paper_explorer.agent.trajectory import EpisodeConfig
    from paper_explorer.agent.writer import TrajectoryLog, read_trajectories
    from paper_explorer.corpus import BM25Index
    from paper_explorer.corpus.selection import select_questions
    from paper_explorer.evaluation.run import load_corpus
    from paper_explorer.sft.teacher import Teacher

    out = Path(out)
    if out.is_dir():
        raise TrainingError(f"{out}: is a directory; {setting('out')} names the trajectories .jsonl file to write")
    loaded = load_corpus(corpus, questions, config.split_of or None)
    selected = select_questions(loaded, config.split, config.limit, default="train", note=note)
    teacher = Teacher(loaded, direct=config.direct, thinking=config.thinking)
    if config.tokenizer is not None:
        from paper_explorer.agent.renderer import ChatRenderer

        teacher.renderer = ChatRenderer.from_directory(config.tokenizer)
    runner = EpisodeRunner(loaded, BM25Index.cached(loaded), teacher, EpisodeConfig(max_steps=config.max_steps))
    statuses: Counter[str] = Counter()
    with TrajectoryLog(out) as log:
        done = {t.question_id for t in read_trajectories(out)}
        todo = [q for q in selected if q.id not in done]
        for question in todo:
            trajectory = runner.run(question.text, question)
            log.append(trajectory)
            statuses[trajectory.outcome.status] += 1
    return TeachReport(
        out=out,
        questions=len(selected),
        written=len(todo),
        already_written=len(selected) - len(todo),
        statuses=dict(sorted(statuses.items())),
    )
