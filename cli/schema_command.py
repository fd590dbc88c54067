"""``explorer schema``: the JSON Schema of a record, for readers of our files written by others.

Records are named by module and class and imported only for the one printed, so that
``explorer --help`` never loads the statistics (scipy) that the scores' module needs.
"""

from __future__ import annotations

import json
from importlib import import_module

import typer

from cli.errors import UsageError

SCHEMAS = {
    "trajectory": ("agent.trajectory:Trajectory", "one line of trajectories.jsonl"),
    "manifest": ("agent.manifest:RunManifest", "a run directory's manifest.json"),
    "scores": ("evaluation.scoring:EpisodeScore", "one line of a run directory's scores.jsonl"),
    "metrics": ("evaluation.records:RunMetrics", "a run directory's metrics.json"),
    "validation": ("sft.records:ValidationRecord", "one line of a training run's validation.jsonl"),
    "training-summary": ("sft.records:TrainingSummary", "a training run's training_summary.json"),
    "example": ("sft.records:Example", "one line of a built dataset's train.jsonl or validation.jsonl"),
    "build-report": ("sft.records:BuildReport", "a built dataset's build_report.json"),
    "checkpoint-manifest": ("sft.records:CheckpointManifest", "a training checkpoint's explorer_manifest.json"),
    "corpus-stats": ("corpus.stats:CorpusStats", "explorer corpus stats --json"),
    "question": (
        "corpus.schema:Question",
        "one line of a questions file (explorer eval --questions FILE; explorer questions init starts one)",
    ),
    "questions-check": ("corpus.questions_file:QuestionsSummary", "explorer questions check --json"),
    "eval-config": ("agent.config:EvalConfig", "explorer eval --config FILE (TOML)"),
    "run-config": ("agent.config:RunConfig", "explorer run --config FILE (TOML)"),
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
