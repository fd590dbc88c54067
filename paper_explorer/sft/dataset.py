"""Trajectories -> training examples: filtered by outcome, split by paper, tokenised through the
shared renderer only (labels are -100 everywhere but assistant tokens), never cut silently.

The built directory holds ``train.jsonl`` and ``validation.jsonl`` (one ``sft.records.Example``
per line: ``input_ids``, ``labels``, the assistant turns with their type) and
``build_report.json`` (a ``BuildReport``: what was kept, what was dropped and why, the
statistics, the split check, the parity check).
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from statistics import fmean
from typing import NamedTuple

import paper_explorer.corpus.files as files
from paper_explorer.agent.renderer import ChatRenderer
from paper_explorer.agent.trajectory import Trajectory, ending_step, is_direct_submit, research_before_end, without_timings
from paper_explorer.corpus.files import atomic_file
from paper_explorer.corpus.jsonl import JsonLinesError, read_records, write_records
from paper_explorer.corpus.schema import Question
from paper_explorer.evaluation.answers import best_over_references, token_f1
from paper_explorer.evaluation.scoring import prediction
from paper_explorer.sft.config import BuildConfig
from paper_explorer.sft.errors import TrainingError
from paper_explorer.sft.records import BuildReport, DataStatistics, Example, SplitCheck, Turn

IGNORE = -100


@dataclass
class Built:
    train: list[Example] = field(default_factory=list)
    validation: list[Example] = field(default_factory=list)
    dropped: Counter = field(default_factory=Counter)
    shortened: int = 0


def turn_types(trajectory: Trajectory) -> list[str]:
    """Per step, "final" for the action that ended the episode with an answer or an abstention
    (``agent.trajectory.ending_step``: a failed submit ends nothing), else "tool"."""
    end = ending_step(trajectory)
    return ["final" if index == end else "tool" for index in range(len(trajectory.steps))]


def keep_reason(trajectory: Trajectory, question: Question | None, settings: BuildConfig) -> str | None:
    """None to keep the trajectory, else why it is dropped."""
    if question is None:
        return "no gold question (free-text or unknown question id)"
    status = trajectory.outcome.status
    if status == "abstained":
        if question.answerable:
            return "false abstention"
        return None if settings.keep_correct_abstentions else "abstention (not kept)"
    if status != "submitted":
        return f"ended with {status}"
    if not question.answerable:
        return "answered an unanswerable question"
    f1 = best_over_references(token_f1, prediction(trajectory), question)
    return None if f1 >= settings.min_answer_f1 else f"answer F1 below {settings.min_answer_f1}"


class Tokenized(NamedTuple):
    input_ids: list[int]
    labels: list[int]
    turns: list[Turn]


def tokenize_trajectory(trajectory: Trajectory, renderer: ChatRenderer, train_thinking: bool = False) -> Tokenized:
    """The training sequence of a whole trajectory: ids, labels and the span of every assistant turn."""
    rendered = renderer.render(trajectory.messages(), train_thinking=train_thinking)
    labels = [token if trained else IGNORE for token, trained in zip(rendered.ids, rendered.mask)]
    turns = [
        Turn(start=start, end=end, type=kind, end_of_turn=end_of_turn)
        for kind, (start, end, end_of_turn) in zip(turn_types(trajectory), rendered.turns)
    ]
    return Tokenized(rendered.ids, labels, turns)


def fit(example: Example, max_length: int, overflow: str) -> Example | None:
    """The example within ``max_length``: as is, or cut after the last whole turn that fits ("split")."""
    if len(example.input_ids) <= max_length:
        return example
    if overflow != "split":
        return None
    kept = [turn for turn in example.turns if turn.end_of_turn <= max_length]
    if not kept:
        return None
    end = kept[-1].end_of_turn
    return example.model_copy(
        update={"input_ids": example.input_ids[:end], "labels": example.labels[:end], "turns": kept, "split_at_turn": len(kept)}
    )


def is_validation(paper_id: str, share: float) -> bool:
    """A stable split by paper: the same paper always falls on the same side."""
    return int(hashlib.sha256(paper_id.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF < share


def build(
    trajectories: list[Trajectory],
    questions: dict[str, Question],
    renderer: ChatRenderer,
    settings: BuildConfig,
    evaluation_papers: frozenset[str] = frozenset(),
) -> Built:
    """The examples of ``trajectories`` under ``settings``; a trajectory on one of ``evaluation_papers``
    (those of ``settings.evaluation_split``) is never trained on."""
    built = Built()
    seen: set[str] = set()
    candidates = []
    for trajectory in trajectories:
        question = questions.get(trajectory.question_id or "")
        reason = keep_reason(trajectory, question, settings)
        paper_id = (question.paper_id if question else trajectory.paper_id) or ""
        if reason is None and paper_id in evaluation_papers:
            reason = "its paper belongs to the evaluation split"
        content = hashlib.sha256(json.dumps(without_timings(trajectory), sort_keys=True).encode()).hexdigest()
        if reason is None and content in seen:
            reason = "duplicate episode (the same trajectory twice)"
        if reason is not None:
            built.dropped[reason] += 1
            continue
        seen.add(content)
        candidates.append((trajectory, question, paper_id))
    if settings.best_of is not None:
        candidates = best_attempts(candidates, settings.best_of, built.dropped)
    for trajectory, _question, paper_id in candidates:
        ids, labels, turns = tokenize_trajectory(trajectory, renderer, settings.train_thinking)
        example = Example(
            episode_id=trajectory.episode_id,
            question_id=trajectory.question_id,
            paper_id=paper_id,
            question=trajectory.question,
            first_action_submits=is_direct_submit(trajectory),
            input_ids=ids,
            labels=labels,
            turns=turns,
        )
        fitted = fit(example, settings.max_length, settings.overflow)
        if fitted is None:
            built.dropped[f"longer than {settings.max_length} tokens"] += 1
            continue
        built.shortened += fitted is not example
        (built.validation if is_validation(paper_id, settings.validation_share) else built.train).append(fitted)
    return built


def research_calls(trajectory: Trajectory) -> int:
    """Searches, reads and extracts that succeeded before the end (``agent.trajectory.research_before_end``)."""
    return sum(1 for _ in research_before_end(trajectory))


def best_attempts(candidates: list, keep: int, dropped: Counter) -> list:
    """Per question, the ``keep`` best of its successful attempts: the highest answer F1, then the
    fewest steps, then the most tool use. An attempt that did not look - a direct submit
    (``agent.trajectory.is_direct_submit``): its first action already ends the episode, whatever
    else it called, or it answers after actions whose research all failed or that did none - is
    never kept: not even a correct abstention is worth teaching unless the policy looked first."""
    by_question: dict[str, list] = {}
    for candidate in candidates:
        trajectory, question, _ = candidate
        if not trajectory.steps or is_direct_submit(trajectory):
            dropped["best-of: it submits or abstains before any research result (a direct submit)"] += 1
            continue
        by_question.setdefault(question.id, []).append(candidate)

    def rank(candidate) -> tuple:
        trajectory, question, _ = candidate
        f1 = best_over_references(token_f1, prediction(trajectory), question) if question.answerable else 1.0
        return (-f1, len(trajectory.steps), -research_calls(trajectory))

    chosen = []
    for attempts in by_question.values():
        ordered = sorted(attempts, key=rank)
        chosen += ordered[:keep]
        if len(ordered) > keep:
            dropped[f"best-of: not among the best {keep} attempts of its question"] += len(ordered) - keep
    kept = {id(candidate) for candidate in chosen}
    return [c for c in candidates if id(c) in kept]  # in the order they were read


def statistics(examples: list[Example]) -> DataStatistics:
    if not examples:
        return DataStatistics()
    assistant: Counter[str] = Counter()
    for example in examples:
        for turn in example.turns:
            assistant[turn.type] += turn.end - turn.start  # the action and its <|im_end|>
    trained = sum(assistant.values())
    return DataStatistics(
        trajectories=len(examples),
        turns_per_trajectory=fmean(len(e.turns) for e in examples),
        tokens=sum(len(e.input_ids) for e in examples),
        tokens_per_trajectory=fmean(len(e.input_ids) for e in examples),
        max_tokens=max(len(e.input_ids) for e in examples),
        trained_tokens=trained,
        trained_token_share={kind: count / trained for kind, count in sorted(assistant.items())} if trained else {},
        first_action_submits_share=fmean(e.first_action_submits for e in examples),
    )


def split_check(built: Built, evaluation_papers: frozenset[str], evaluation_questions: frozenset[str]) -> SplitCheck:
    """No paper or question id may be shared between train, validation and evaluation."""
    train_papers = {e.paper_id for e in built.train}
    validation_papers = {e.paper_id for e in built.validation}
    # a question of the user's own (no id) is no id to share
    train_questions = {e.question_id for e in built.train if e.question_id is not None}
    validation_questions = {e.question_id for e in built.validation if e.question_id is not None}
    overlaps = {
        "train_validation_papers": sorted(train_papers & validation_papers),
        "train_evaluation_papers": sorted(train_papers & evaluation_papers),
        "validation_evaluation_papers": sorted(validation_papers & evaluation_papers),
        "train_validation_questions": sorted(train_questions & validation_questions),
        "train_evaluation_questions": sorted(train_questions & evaluation_questions),
        "validation_evaluation_questions": sorted(validation_questions & evaluation_questions),
    }
    return SplitCheck(passed=not any(overlaps.values()), overlaps={k: v[:10] for k, v in overlaps.items() if v})


def write(built: Built, out: Path, report: BuildReport) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name, examples in (("train", built.train), ("validation", built.validation)):
        write_records(out / f"{name}.jsonl", examples, exclude_none=True)
    with atomic_file(out / "build_report.json") as handle:
        handle.write(report.model_dump_json(indent=2))


def load_examples(path: Path) -> list[Example]:
    """A built split's examples (lines split as bytes on \\n only: a trajectory's text may hold U+2028);
    a bad line is one TrainingError naming file and line. A missing file is FileNotFoundError, for
    the caller to name."""
    try:
        return read_records(path, Example, what="training example", inside=path.parent)
    except JsonLinesError as error:
        raise TrainingError(f"{error}; rebuild the data with explorer sft build") from None


def load_report(data: Path) -> BuildReport:
    """The dataset's build report; a missing one is FileNotFoundError and an invalid one a
    ValidationError, for the caller to word; a file that is not one to read is a TrainingError line."""
    try:
        data_bytes = files.read_bytes(data / "build_report.json", limit=files.DOCUMENT_BYTES, inside=data, what="build report")
    except files.FileRefused as error:
        raise TrainingError(str(error)) from None
    return BuildReport.model_validate_json(files.without_bom(data_bytes))
