"""``explorer schema``: the JSON Schema of a record, for readers of our files written by others."""

from __future__ import annotations

import json

import typer

from agent.config import EvalConfig, RunConfig
from agent.manifest import RunManifest
from agent.trajectory import Trajectory
from cli.errors import UsageError
from corpus.stats import CorpusStats
from evaluation.records import RunMetrics
from evaluation.scoring import EpisodeScore
from sft.records import BuildReport, CheckpointManifest, Example, TrainingSummary, ValidationRecord

SCHEMAS = {
    "trajectory": (Trajectory, "one line of trajectories.jsonl"),
    "manifest": (RunManifest, "a run directory's manifest.json"),
    "scores": (EpisodeScore, "one line of a run directory's scores.jsonl"),
    "metrics": (RunMetrics, "a run directory's metrics.json"),
    "validation": (ValidationRecord, "one line of a training run's validation.jsonl"),
    "training-summary": (TrainingSummary, "a training run's training_summary.json"),
    "example": (Example, "one line of a built dataset's train.jsonl or validation.jsonl"),
    "build-report": (BuildReport, "a built dataset's build_report.json"),
    "checkpoint-manifest": (CheckpointManifest, "a training checkpoint's explorer_manifest.json"),
    "corpus-stats": (CorpusStats, "explorer corpus stats --json"),
    "eval-config": (EvalConfig, "explorer eval --config FILE (TOML)"),
    "run-config": (RunConfig, "explorer run --config FILE (TOML)"),
}


def schema_command(
    record: str = typer.Argument("trajectory", help=f"Which record: {', '.join(SCHEMAS)}."),
) -> None:
    """Print the JSON Schema of a record (a trajectory line, a run manifest, a config file)."""
    if record not in SCHEMAS:
        raise UsageError(f"no record {record!r}; choose one of {', '.join(SCHEMAS)}")
    model, describes = SCHEMAS[record]
    schema = {"$comment": f"{describes}; written by paper-explorer", **model.model_json_schema()}
    typer.echo(json.dumps(schema, indent=2))
