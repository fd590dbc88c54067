"""A finished run in other tools' formats: an inspect_ai eval log, a Hugging Face ``datasets`` directory.

Both are built from the run's typed records (``RunManifest``, ``Trajectory``, ``EpisodeScore``,
``RunMetrics``) and nothing else, so an export says what ``explorer inspect`` says:

- ``inspect_log`` makes an ``inspect_ai.log.EvalLog`` from inspect's own pydantic types: one
  sample per episode (id the question id, epoch the episode's sample + 1), its conversation as
  the policy saw it (each action an assistant turn whose code is also a ``python`` tool call, each
  observation that call's tool message), the final answer as the output, our scores as inspect
  scores and our detector flags in the sample's metadata. ``inspect view`` shows it as it shows
  inspect's own runs.
- ``trajectory_rows`` and ``save_dataset`` make one row per episode (ids, question, gold answers,
  status, answer, messages, steps, scores, flags, and the whole trajectory as JSON), saved with
  ``save_to_disk`` and as parquet. ``save_dataset`` takes any rows, so ``sft build`` output is
  exported through it too (by the CLI, which may read ``sft``'s records; this layer may not).

Both packages are an optional extra (``pip install -e '.[export]'``), imported only here, only
when an export runs; without them the export stops with one line that says how to install them.

Why one module of this size: both exports read the same typed records the same way, so that
what one says the other says too.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from paper_explorer.agent.policies import PolicyConfig
from paper_explorer.agent.policies.settings import model_of
from paper_explorer.agent.prompt import question_message
from paper_explorer.agent.trajectory import Step, Trajectory
from paper_explorer.corpus import Corpus
from paper_explorer.evaluation.answer_metrics import answer_metrics
from paper_explorer.evaluation.answers import references
from paper_explorer.evaluation.errors import EvaluationError
from paper_explorer.evaluation.records import RunMetrics
from paper_explorer.evaluation.run_directory import Run, finish_command
from paper_explorer.evaluation.scoring import EpisodeScore
from paper_explorer.evaluation.tokens import readings

if TYPE_CHECKING:
    from inspect_ai.log import EvalLog, EvalSample
    from inspect_ai.model import ChatMessage

INSTALL = "pip install -e '.[export]'"
TASK = "explorer-eval"
DATASET_MARKERS = ("dataset_dict.json", "state.json")  # what save_to_disk leaves at a dataset's top
PARQUET = "parquet"  # the folder of an exported dataset that holds its parquet files, one per split


@dataclass(frozen=True)
class RunRecords:
    """A finished run (``run_directory.Run``), its episodes that count, and the score of each."""

    run: Run
    trajectories: list[Trajectory]
    scores: dict[str, EpisodeScore]  # by episode id


def read_run(directory: Path) -> RunRecords:
    """The run's manifest, metrics, trajectories and scores (``Run.load``); one clear error when
    one is missing, malformed, or an episode that counts has no score."""
    run = Run.load(directory)
    scores = {score.episode_id: score for score in run.scores}
    unscored = [t.episode_id for t in run.trajectories if t.episode_id not in scores]
    if unscored:
        raise EvaluationError(
            f"{directory}: {len(unscored)} episodes have no line in scores.jsonl (first: {unscored[0]}); "
            f"{finish_command(directory)} scores them"
        )
    return RunRecords(run, run.trajectories, scores)


def gold_answers(corpus: Corpus) -> dict[str, list[str]]:
    """Each question's reference answers as QASPER's evaluator scores against them, once each."""
    return {question.id: list(dict.fromkeys(references(question))) for question in corpus.questions}


def require(module: str):
    """The optional package (inspect_ai or datasets), or one line that says how to install it."""
    try:
        return __import__(module)
    except ImportError:
        raise EvaluationError(f"this export needs the {module} package, which is not installed: {INSTALL}") from None


def model_name(policy: PolicyConfig) -> str:
    """inspect's provider/model form: ``hf/...`` and ``openai/...`` as inspect names those backends
    (a local model directory by its folder name), the model-free policies as ``explorer/NAME``."""
    given = model_of(policy)
    if given is None:
        return f"explorer/{policy.name}"
    model = Path(given).name if given.startswith(("/", ".", "~")) else given
    return f"{policy.name}/{model}"


# ---------------------------------------------------------------------------------------------
# inspect_ai


def inspect_log(records: RunRecords, gold: dict[str, list[str]] | None = None) -> EvalLog:
    """The run as an inspect eval log; ``gold`` (question id -> reference answers) fills targets."""
    require("inspect_ai")
    from inspect_ai.log import EvalConfig, EvalDataset, EvalLog, EvalPlan, EvalRevision, EvalSpec, EvalStats

    manifest, gold = records.run.manifest, gold or {}
    model = model_name(manifest.config.policy)
    samples = _unique_ids([_sample(t, records.scores[t.episode_id], gold, model) for t in records.trajectories], records.trajectories)
    # Stable across exports of the same run: inspect's ids are 22 characters (shortuuid).
    eval_id = hashlib.sha256(manifest.model_dump_json().encode()).hexdigest()[:22]
    commit, dirty = (manifest.git_commit or "").removesuffix("+dirty"), (manifest.git_commit or "").endswith("+dirty")
    spec = EvalSpec(
        eval_id=eval_id,
        run_id=eval_id,
        created=manifest.created_at,
        task=TASK,
        task_id=eval_id,
        task_args=manifest.config.model_dump(mode="json"),
        dataset=EvalDataset(
            name=", ".join(manifest.corpus) or None,
            location=", ".join(manifest.corpus) or None,
            samples=len(samples),
            sample_ids=[sample.id for sample in samples],
        ),
        model=model,
        model_args=manifest.config.policy.model_dump(mode="json", exclude_none=True),
        solver=manifest.config.policy.name,
        config=EvalConfig(epochs=max((t.sample for t in records.trajectories), default=0) + 1),
        revision=EvalRevision(type="git", origin="", commit=commit, dirty=dirty) if commit else None,
        packages=manifest.versions,
        metadata={
            "command": manifest.command,
            "hashes": manifest.hashes.model_dump(),
            "isolation": manifest.isolation,
            "hardware": manifest.hardware,
            "corpus": manifest.corpus,
        },
    )
    usage = [sample.model_usage[model] for sample in samples if model in sample.model_usage]
    return EvalLog(
        status="success",
        eval=spec,
        plan=EvalPlan(name="explorer", steps=[]),
        results=_results(records.run.metrics, len(samples)),
        stats=EvalStats(
            started_at=manifest.created_at,
            completed_at=_completed_at(records.trajectories) or manifest.created_at,
            model_usage={model: _sum_usage(usage)} if usage else {},
        ),
        samples=samples,
    )


def write_inspect_log(log: EvalLog, out: Path) -> None:
    """``write_eval_log`` in the format of ``out``'s extension (.eval or .json), whole or not at
    all: written beside ``out`` under a temporary name, then renamed over it."""
    from inspect_ai.log import write_eval_log

    if out.suffix not in (".eval", ".json"):
        raise EvaluationError(f"{out}: an inspect log is named .eval (inspect's zip format) or .json")
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.is_dir() and not out.is_symlink():
        raise EvaluationError(f"{out}: is a directory; name the inspect log's file")
    # A directory of our own (mkdtemp: created new, mode 0700), not a name guessed from the pid: a
    # link planted at a predictable name would carry the write elsewhere. The log is renamed out of
    # it over ``out``, which replaces a link at ``out`` instead of writing where it points.
    staging = Path(tempfile.mkdtemp(prefix=".", suffix=".tmp", dir=out.parent))
    try:
        temporary = staging / f"log{out.suffix}"
        write_eval_log(log, str(temporary))
        os.replace(temporary, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _sample(trajectory: Trajectory, score: EpisodeScore, gold: dict[str, list[str]], model: str) -> EvalSample:
    from inspect_ai.log import EvalSample, EvalSampleLimit
    from inspect_ai.model import ModelOutput
    from inspect_ai.scorer import Score

    # each answer metric (evaluation.answer_metrics) the line holds: an unscored line (no gold) has none
    scores = {
        metric.name: Score(value=value, answer=score.prediction)
        for metric in answer_metrics()
        if (value := score.metric(metric.name)) is not None
    }
    scores["status"] = Score(value=score.status, answer=score.prediction, explanation=trajectory.outcome.reason)
    limit = None
    if trajectory.outcome.status == "step_limit":
        limit = EvalSampleLimit(type="turn", limit=trajectory.config.max_steps, reason=trajectory.outcome.reason)
    elif trajectory.outcome.status == "context_limit":
        limit = EvalSampleLimit(type="context", limit=trajectory.config.context_chars, reason=trajectory.outcome.reason)
    elif trajectory.outcome.status == "no_answer" and (cap := _answer_cut_at(trajectory)) is not None:
        # the memory reader's answer cut at its cap; an empty answer is no limit (its reason is in the status score)
        limit = EvalSampleLimit(type="token", limit=cap, reason=trajectory.outcome.reason)
    usage = _usage(trajectory)
    return EvalSample(
        id=trajectory.question_id or trajectory.episode_id,
        epoch=trajectory.sample + 1,
        input=trajectory.question,
        target=gold.get(trajectory.question_id or "", []),
        messages=_messages(trajectory, model),
        output=ModelOutput.from_content(model, score.prediction),
        scores=scores,
        metadata=_metadata(trajectory, score),
        model_usage={model: usage} if usage else {},
        started_at=trajectory.started_at,
        total_time=trajectory.seconds,
        limit=limit,
    )


def _unique_ids(samples: list[EvalSample], trajectories: list[Trajectory]) -> list[EvalSample]:
    """inspect keys samples by (id, epoch): should two episodes share one (a free-text question
    asked twice), the later is named by its episode id instead."""
    seen = set()
    for sample, trajectory in zip(samples, trajectories):
        if (sample.id, sample.epoch) in seen:
            sample.id = trajectory.episode_id
        seen.add((sample.id, sample.epoch))
    return samples


def _messages(trajectory: Trajectory, model: str) -> list[ChatMessage]:
    """What the policy saw, as inspect's messages: system, question, then per step the action and
    its observation. An action with code is also a ``python`` tool call, answered by a tool message;
    one without (a format error) is answered by a user message, as the policy was."""
    from inspect_ai.model import ChatMessageAssistant, ChatMessageSystem, ChatMessageTool, ChatMessageUser

    messages: list[ChatMessage] = [
        ChatMessageSystem(content=trajectory.system_prompt),
        ChatMessageUser(content=question_message(trajectory.question)),
    ]
    for step in trajectory.steps:
        call = _tool_call(step)
        messages.append(ChatMessageAssistant(content=_action_content(step), tool_calls=[call] if call else None, model=model))
        metadata = _step_metadata(step)
        if call is None:
            messages.append(ChatMessageUser(content=step.observation, metadata=metadata))
        else:
            messages.append(ChatMessageTool(content=step.observation, tool_call_id=call.id, function=call.function, metadata=metadata))
    return messages


def _action_content(step: Step):
    """The action as written; a think block (thinking mode) as inspect's reasoning content before it."""
    if step.reasoning is None:
        return step.action_text
    from inspect_ai._util.content import ContentReasoning, ContentText

    return [ContentReasoning(reasoning=step.reasoning), ContentText(text=step.action_text)]


def _tool_call(step: Step):
    from inspect_ai.tool import ToolCall, ToolCallContent

    if step.code is None:
        return None
    return ToolCall(
        id=f"step-{step.index + 1}",
        function="python",
        arguments={"code": step.code},
        view=ToolCallContent(format="markdown", content=f"```python\n{step.code}\n```"),
    )


def _step_metadata(step: Step) -> dict[str, Any]:
    """What the host recorded about the step beyond its observation: the tools the code called, errors, limits."""
    metadata: dict[str, Any] = {"step": step.index, "tool_calls": [call.model_dump(mode="json") for call in step.tool_calls]}
    for name, value in (
        ("error", step.error),
        ("limit_hit", step.limit_hit),
        ("format_error", step.format_error or None),
        ("observation_chars_cut", step.observation_chars_cut or None),
        ("variables_lost", step.variables_lost or None),
    ):
        if value is not None:
            metadata[name] = value
    return metadata


def _metadata(trajectory: Trajectory, score: EpisodeScore) -> dict[str, Any]:
    return {
        "episode_id": trajectory.episode_id,
        "question_id": trajectory.question_id,
        "paper_id": trajectory.paper_id,
        "sample": trajectory.sample,
        "policy": trajectory.policy.name,
        "status": score.status,
        "reason": trajectory.outcome.reason,
        "steps": score.steps,
        "tool_calls": score.tool_calls,
        "tool_calls_before_end": score.tool_calls_before_end,
        "flags": [flag.to_json() for flag in score.flags],
        "type": score.type,
        "answerable": score.answerable,
        "evidence": [item.model_dump() for item in trajectory.outcome.evidence],
        "model_tokens": score.model_tokens,
    }


def _answer_cut_at(trajectory: Trajectory) -> int | None:
    """The tokens at which the memory reader's final answer was cut (None: it was not cut)."""
    for reading in readings(trajectory):
        if reading.answer is not None and reading.answer.generation.hit_cap:
            return reading.answer.generation.generated_tokens
    return None


def _usage(trajectory: Trajectory):
    """Tokens the model policies reported (prompt and generated): each step's generation and the
    memory reader's update and answer calls; None for policies without a model."""
    from inspect_ai.model import ModelUsage

    generations = [step.generation for step in trajectory.steps if step.generation is not None]
    for reading in readings(trajectory):
        generations += [update.generation for update in reading.updates]
        generations += [reading.answer.generation] if reading.answer is not None else []
    if not generations:
        return None
    prompt = sum(g.prompt_tokens or g.usage_prompt_tokens or 0 for g in generations)
    generated = sum(g.generated_tokens or 0 for g in generations)
    return ModelUsage(input_tokens=prompt, output_tokens=generated, total_tokens=prompt + generated)


def _sum_usage(usages: list):
    from inspect_ai.model import ModelUsage

    prompt, generated = sum(u.input_tokens for u in usages), sum(u.output_tokens for u in usages)
    return ModelUsage(input_tokens=prompt, output_tokens=generated, total_tokens=prompt + generated)


def _completed_at(trajectories: list[Trajectory]) -> str | None:
    from datetime import datetime, timedelta

    ends = [datetime.fromisoformat(t.started_at) + timedelta(seconds=t.seconds) for t in trajectories]
    return max(ends).isoformat(timespec="seconds") if ends else None


def _results(metrics: RunMetrics, samples: int):
    """The run's answer metrics as inspect scores (a mean each, with its bootstrap interval where the
    metric declares one), and the whole of metrics.json in the results' metadata."""
    from inspect_ai.log import EvalMetric, EvalResults, EvalScore

    scores = []
    for metric in answer_metrics():
        name, value = metric.name, metrics.metric(metric.name)
        if value is None:
            continue
        figures = {"mean": EvalMetric(name="mean", value=value)}
        interval = metrics.interval(name)
        if interval is not None and interval.low is not None and interval.high is not None:
            figures["ci95_low"] = EvalMetric(name="ci95_low", value=interval.low)
            figures["ci95_high"] = EvalMetric(name="ci95_high", value=interval.high)
        scores.append(
            EvalScore(
                name=name, scorer=name, scored_samples=metrics.scored, unscored_samples=metrics.episodes - metrics.scored, metrics=figures
            )
        )
    return EvalResults(
        total_samples=samples,
        completed_samples=samples,
        scores=scores,
        metadata={"explorer_metrics": metrics.model_dump(mode="json", by_alias=True)},
    )


# ---------------------------------------------------------------------------------------------
# Hugging Face datasets


def trajectory_features():
    """The columns of an exported run, one row per episode (every score None when unscored)."""
    require("datasets")
    from datasets import Features, List, Value

    text, integer, number = Value("string"), Value("int32"), Value("float64")
    return Features(
        {
            "episode_id": text,
            "question_id": text,
            "sample": integer,
            "paper_id": text,
            "policy": text,
            "question": text,
            "target": List(text),
            "status": text,
            "answer": text,
            "reason": text,
            "evidence": List({"paper_id": text, "section": integer, "paragraph": integer, "text": text}),
            "messages": List({"role": text, "content": text}),
            "steps": List(
                {
                    "index": integer,
                    "action_text": text,
                    "reasoning": text,
                    "code": text,
                    "observation": text,
                    "error": text,
                    "limit_hit": text,
                    "format_error": Value("bool"),
                    "tool_calls": List({"name": text, "arguments": text, "error": text}),  # arguments as JSON text: any shape
                }
            ),
            "num_steps": integer,
            "tool_calls": integer,
            "tool_calls_before_end": integer,
            "benchmark": text,  # Question.benchmark ("longbench/hotpotqa"); None for QASPER and users' questions
            "type": text,
            "answerable": Value("bool"),
            **{metric.name: number for metric in answer_metrics()},
            "model_tokens": Value("int64"),  # evaluation.tokens.model_tokens; None for policies without a model
            "flags": List({"detector": text, "step": integer, "text": text}),
            "trajectory": text,  # the whole record: Trajectory.model_validate_json(row["trajectory"])
        }
    )


def trajectory_rows(records: RunRecords, gold: dict[str, list[str]] | None = None) -> list[dict[str, Any]]:
    gold = gold or {}
    return [_row(trajectory, records.scores[trajectory.episode_id], gold) for trajectory in records.trajectories]


def _row(trajectory: Trajectory, score: EpisodeScore, gold: dict[str, list[str]]) -> dict[str, Any]:
    messages = [{"role": "system", "content": trajectory.system_prompt}, {"role": "user", "content": question_message(trajectory.question)}]
    for step in trajectory.steps:
        messages += [{"role": "assistant", "content": step.action_text}, {"role": "user", "content": step.observation}]
    steps = [
        {
            "index": step.index,
            "action_text": step.action_text,
            "reasoning": step.reasoning,
            "code": step.code,
            "observation": step.observation,
            "error": step.error,
            "limit_hit": step.limit_hit,
            "format_error": step.format_error,
            "tool_calls": [{"name": call.name, "arguments": json.dumps(call.arguments), "error": call.error} for call in step.tool_calls],
        }
        for step in trajectory.steps
    ]
    return {
        "episode_id": trajectory.episode_id,
        "question_id": trajectory.question_id,
        "sample": trajectory.sample,
        "paper_id": trajectory.paper_id,
        "policy": trajectory.policy.name,
        "question": trajectory.question,
        "target": gold.get(trajectory.question_id or "", []),
        "status": score.status,
        "answer": score.prediction,
        "reason": trajectory.outcome.reason,
        "evidence": [item.model_dump() for item in trajectory.outcome.evidence],
        "messages": messages,
        "steps": steps,
        "num_steps": score.steps,
        "tool_calls": score.tool_calls,
        "tool_calls_before_end": score.tool_calls_before_end,
        "benchmark": score.benchmark,
        "type": score.type,
        "answerable": score.answerable,
        **{metric.name: score.metric(metric.name) for metric in answer_metrics()},
        "model_tokens": score.model_tokens,
        "flags": [flag.to_json() for flag in score.flags],
        "trajectory": trajectory.model_dump_json(),
    }


def is_dataset_directory(path: Path) -> bool:
    """A directory ``save_dataset`` (or ``save_to_disk``) wrote: the only kind ``--force`` replaces."""
    return path.is_dir() and any((path / marker).is_file() for marker in DATASET_MARKERS)


def save_dataset(out: Path, splits: dict[str, list[dict[str, Any]]], features, single: str | None = None) -> dict[str, Path]:
    """Save rows as a Hugging Face dataset directory (``datasets.load_from_disk(out)``) with a
    parquet file per split in ``out/parquet/`` (``load_dataset("parquet", data_files=...)``).

    ``single`` names the one split that is saved as a plain ``Dataset``; otherwise a
    ``DatasetDict`` of every split. The directory is built beside ``out`` and renamed into place,
    so ``out`` is whole or absent; an existing ``out`` is replaced only when it is a dataset
    directory (the caller refuses it without --force). Returns the parquet file of each split
    that has rows (``load_dataset`` refuses an empty one; ``load_from_disk`` keeps it)."""
    datasets = require("datasets")
    datasets.disable_progress_bars()
    if out.exists() and not (is_dataset_directory(out) or (out.is_dir() and not any(out.iterdir()))):
        raise EvaluationError(f"{out}: exists and is not a dataset directory; name a new directory")
    # Column-wise, so that an empty split (sft build may leave validation empty) still has every column.
    built = {
        name: datasets.Dataset.from_dict({column: [row[column] for row in rows] for column in features}, features=features)
        for name, rows in splits.items()
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    # Built inside a directory of our own (mkdtemp), never at a predictable name a link could be planted at.
    staging = Path(tempfile.mkdtemp(prefix=".", suffix=".tmp", dir=out.parent))
    temporary, old = staging / "dataset", staging / "old"
    try:
        # datasets writes no shard for an empty split unless told to, and then cannot load it back.
        shards = {name: 1 if len(dataset) == 0 else None for name, dataset in built.items()}
        if single is not None:
            built[single].save_to_disk(str(temporary), num_shards=shards[single])
        else:
            datasets.DatasetDict(built).save_to_disk(str(temporary), num_shards=shards)
        (temporary / PARQUET).mkdir()
        for name, dataset in built.items():
            if len(dataset):  # load_dataset("parquet") refuses a split with no rows
                dataset.to_parquet(str(temporary / PARQUET / f"{name}.parquet"))
        if out.exists():
            out.rename(old)
        temporary.rename(out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return {name: out / PARQUET / f"{name}.parquet" for name, dataset in built.items() if len(dataset)}
