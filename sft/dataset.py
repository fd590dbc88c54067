"""Trajectories -> training examples: filtered by outcome, split by paper, tokenised through the
shared renderer only (labels are -100 everywhere but assistant tokens), never cut silently.

The built directory holds ``train.jsonl`` and ``validation.jsonl`` (one example per line:
``input_ids``, ``labels``, the assistant turns with their type) and ``build_report.json`` (what
was kept, what was dropped and why, the statistics, the split check).
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from statistics import fmean

from agent.renderer import ChatRenderer
from agent.trajectory import Trajectory, without_timings
from corpus.atomic import atomic_file
from corpus.schema import Question
from evaluation.answers import best_over_references, token_f1
from evaluation.scoring import prediction

IGNORE = -100
ENDING_TOOLS = ("submit", "abstain")


@dataclass
class BuildSettings:
    min_answer_f1: float = 0.5
    keep_correct_abstentions: bool = True
    max_length: int = 8192
    overflow: str = "drop"  # or "split": keep the whole turns that fit, drop the rest (counted)
    validation_share: float = 0.2
    evaluation_papers: frozenset[str] = frozenset()


@dataclass
class Built:
    train: list[dict] = field(default_factory=list)
    validation: list[dict] = field(default_factory=list)
    dropped: Counter = field(default_factory=Counter)
    shortened: int = 0


def turn_type(step) -> str:
    """"final" when the action ends the episode (submit or abstain), else "tool"."""
    return "final" if any(call.name in ENDING_TOOLS for call in step.tool_calls) else "tool"


def keep_reason(trajectory: Trajectory, question: Question | None, settings: BuildSettings) -> str | None:
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


def tokenize_trajectory(trajectory: Trajectory, renderer: ChatRenderer) -> dict:
    """The training sequence of a whole trajectory: ids, labels and the span of every assistant turn."""
    messages = trajectory.messages()
    ids: list[int] = []
    labels: list[int] = []
    turns = []
    for position, message in enumerate(messages):
        rendered = renderer.render([message])
        start = len(ids)
        ids += rendered.ids
        labels += [token if trained else IGNORE for token, trained in zip(rendered.ids, rendered.mask)]
        if message["role"] == "assistant":
            step = trajectory.steps[(position - 2) // 2]
            trained = [i for i, m in enumerate(rendered.mask) if m]
            turns.append({"start": start + trained[0], "end": start + trained[-1] + 1, "type": turn_type(step), "end_of_turn": len(ids)})
    return {"input_ids": ids, "labels": labels, "turns": turns}


def fit(example: dict, max_length: int, overflow: str) -> dict | None:
    """The example within ``max_length``: as is, or cut after the last whole turn that fits ("split")."""
    if len(example["input_ids"]) <= max_length:
        return example
    if overflow != "split":
        return None
    kept = [turn for turn in example["turns"] if turn["end_of_turn"] <= max_length]
    if not kept:
        return None
    end = kept[-1]["end_of_turn"]
    return {**example, "input_ids": example["input_ids"][:end], "labels": example["labels"][:end], "turns": kept, "split_at_turn": len(kept)}


def is_validation(paper_id: str, share: float) -> bool:
    """A stable split by paper: the same paper always falls on the same side."""
    return int(hashlib.sha256(paper_id.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF < share


def build(trajectories: list[Trajectory], questions: dict[str, Question], renderer: ChatRenderer, settings: BuildSettings) -> Built:
    built = Built()
    seen: set[str] = set()
    for trajectory in trajectories:
        question = questions.get(trajectory.question_id or "")
        reason = keep_reason(trajectory, question, settings)
        paper_id = (question.paper_id if question else trajectory.paper_id) or ""
        if reason is None and paper_id in settings.evaluation_papers:
            reason = "its paper belongs to the evaluation split"
        content = hashlib.sha256(json.dumps(without_timings(trajectory), sort_keys=True).encode()).hexdigest()
        if reason is None and content in seen:
            reason = "duplicate episode (the same trajectory twice)"
        if reason is not None:
            built.dropped[reason] += 1
            continue
        seen.add(content)
        example = tokenize_trajectory(trajectory, renderer)
        fitted = fit(example, settings.max_length, settings.overflow)
        if fitted is None:
            built.dropped[f"longer than {settings.max_length} tokens"] += 1
            continue
        built.shortened += fitted is not example
        record = {
            "episode_id": trajectory.episode_id, "question_id": trajectory.question_id, "paper_id": paper_id,
            "question": trajectory.question, "first_action_submits": bool(fitted["turns"]) and fitted["turns"][0]["type"] == "final",
            **fitted,
        }
        (built.validation if is_validation(paper_id, settings.validation_share) else built.train).append(record)
    return built


def statistics(examples: list[dict]) -> dict:
    if not examples:
        return {"trajectories": 0}
    assistant = Counter()
    for example in examples:
        for turn in example["turns"]:
            assistant[turn["type"]] += turn["end"] - turn["start"]  # the action and its <|im_end|>
    trained = sum(assistant.values())
    return {
        "trajectories": len(examples),
        "turns_per_trajectory": fmean(len(e["turns"]) for e in examples),
        "tokens": sum(len(e["input_ids"]) for e in examples),
        "tokens_per_trajectory": fmean(len(e["input_ids"]) for e in examples),
        "max_tokens": max(len(e["input_ids"]) for e in examples),
        "trained_tokens": trained,
        "trained_token_share": {kind: count / trained for kind, count in sorted(assistant.items())} if trained else {},
        "first_action_submits_share": fmean(e["first_action_submits"] for e in examples),
    }


def split_check(built: Built, evaluation_papers: frozenset[str], evaluation_questions: frozenset[str]) -> dict:
    """No paper or question id may be shared between train, validation and evaluation."""
    train_papers = {e["paper_id"] for e in built.train}
    validation_papers = {e["paper_id"] for e in built.validation}
    train_questions = {e["question_id"] for e in built.train}
    validation_questions = {e["question_id"] for e in built.validation}
    overlaps = {
        "train_validation_papers": sorted(train_papers & validation_papers),
        "train_evaluation_papers": sorted(train_papers & evaluation_papers),
        "validation_evaluation_papers": sorted(validation_papers & evaluation_papers),
        "train_validation_questions": sorted(train_questions & validation_questions),
        "train_evaluation_questions": sorted(train_questions & evaluation_questions),
        "validation_evaluation_questions": sorted(validation_questions & evaluation_questions),
    }
    return {"pass": not any(overlaps.values()), "overlaps": {k: v[:10] for k, v in overlaps.items() if v}}


def write(built: Built, out: Path, report: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name, examples in (("train", built.train), ("validation", built.validation)):
        with atomic_file(out / f"{name}.jsonl") as handle:
            handle.writelines(json.dumps(example) + "\n" for example in examples)
    with atomic_file(out / "build_report.json") as handle:
        json.dump(report, handle, indent=2)


def load_examples(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
