"""``explorer schema``: the JSON Schema of a record, for readers of our files written by others.

Records are named by module and class and imported only for the one printed, so that
``explorer --help`` never loads the statistics (scipy) that the scores' module needs.
"""

from __future__ import annotations

import json
from importlib import import_module

import typer

from paper_explorer.cli.errors import UsageError

SCHEMAS = {
    "trajectory": ("paper_explorer.agent.trajectory:Trajectory", "one line of trajectories.jsonl"),
    "manifest": ("paper_explorer.agent.manifest:RunManifest", "a run directory's manifest.json"),
    "scores": ("paper_explorer.evaluation.scoring:EpisodeScore", "one line of a run directory's scores.jsonl"),
    "metrics": ("paper_explorer.evaluation.records:RunMetrics", "a run directory's metrics.json"),
    "validation": ("paper_explorer.sft.records:ValidationRecord", "one line of a training run's validation.jsonl"),
    "training-summary": ("paper_explorer.sft.records:TrainingSummary", "a training run's training_summary.json"),
    "example": ("paper_explorer.sft.records:Example", "one line of a built dataset's train.jsonl or validation.jsonl"),
    "build-report": ("paper_explorer.sft.records:BuildReport", "a built dataset's build_report.json"),
    "checkpoint-manifest": ("paper_explorer.sft.records:CheckpointManifest", "a training checkpoint's explorer_manifest.json"),
    "corpus-stats": ("paper_explorer.corpus.stats:CorpusStats", "explorer corpus stats --json"),
    "question": (
        "paper_explorer.corpus.schema:Question",
        "one line of a questions file (explorer eval --questions FILE; explorer questions init starts one)",
    ),
    "questions-check": ("paper_explorer.corpus.questions_file:QuestionsSummary", "explorer questions check --json"),
    "eval-config": ("paper_explorer.agent.config:EvalConfig", "explorer eval --config FILE (TOML)"),
    "run-config": ("paper_explorer.agent.config:RunConfig", "explorer run --config FILE (TOML)"),
    "train-config": ("paper_explorer.sft.config:TrainConfig", "explorer train --config FILE (TOML)"),
    "build-config": ("paper_explorer.sft.config:BuildConfig", "explorer sft build --config FILE (TOML)"),
    "improve-settings": (
        "paper_explorer.sft.config:ImproveSettings",
        "explorer improve --config FILE (TOML); an improve run's improve.json",
    ),
    "rl-config": ("paper_explorer.rl.config:RLConfig", "explorer rl --config FILE (TOML), and an rl run's rl.json"),
    "rl-round": ("paper_explorer.rl.records:RoundRecord", "an rl round's round.json"),
    "rl-reward": ("paper_explorer.rl.records:EpisodeReward", "one line of an rl round's rewards.jsonl"),
    "rl-sequence": ("paper_explorer.rl.sequences:TrainingSequence", "one line of an rl round's batch.jsonl"),
    "decision": ("paper_explorer.decisions.schema:DecisionDocument", "one line of a typed decision file (explorer decide FILE)"),
    "decision-record": ("paper_explorer.decisions.records:DecisionRecord", "one line of a decide run's decisions.jsonl"),
    "decision-metrics": ("paper_explorer.decisions.records:DecisionMetrics", "a decide run's metrics.json"),
    "rl-summary": ("paper_explorer.rl.records:RLSummary", "an rl run's rl_summary.json"),
}


def record_model(record: str):
    """The pydantic model of a record named in SCHEMAS."""
    module, _, name = SCHEMAS[record][0].partition(":")
    return getattr(import_module(module), name)


def schema_command(
    record: str = typer.Argument("trajectory", help=f"Which record: {', '.join(SCHEMAS)}."),
) -> None:
    """Print the JSON Schema of a record (a trajectory line, a run manifest, a config file)."""
    if record not in SCHEMAS:
        raise UsageError(f"no record {record!r}; choose one of {', '.join(SCHEMAS)}")
    describes = SCHEMAS[record][1]
    schema = {"$comment": f"{describes}; written by paper-explorer", **record_model(record).model_json_schema()}
    typer.echo(json.dumps(schema, indent=2))
