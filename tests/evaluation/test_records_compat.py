"""The typed records write what users read, and read what older versions wrote: a run manifest made
from its typed config and hashes, a manifest without the fields added since, and the statistics'
records (Fisher's test, a bootstrap interval) as ``explorer compare`` and a preregistered run wrote
them before the two shared one record."""

import json

from paper_explorer import EvalConfig, Run, evaluate
from paper_explorer.evaluation.records import FisherTest, MeanInterval, PreregistrationResult
from paper_explorer.evaluation.run_directory import MANIFEST

# manifest.json's keys, and its config's, as every version since manifest_version 2 wrote them
MANIFEST_KEYS = [
    "manifest_version",
    "created_at",
    "command",
    "corpus",
    "config",
    "hashes",
    "isolation",
    "versions",
    "git_commit",
    "hardware",
]
CONFIG_KEYS = [
    "policy",
    "episode",
    "split",
    "split_of",
    "limit",
    "shard",
    "workers",
    "concurrency",
    "ray",
    "samples",
    "max_consecutive_errors",
    "preregistration",
    "questions",
    "selected_questions_sha256",
]


def test_the_manifest_written_from_typed_records_keeps_its_json(tmp_path):
    evaluate(EvalConfig(limit=2), out=tmp_path / "run")
    written = json.loads((tmp_path / "run" / MANIFEST).read_text())
    assert list(written) == MANIFEST_KEYS and list(written["config"]) == CONFIG_KEYS
    assert set(written["hashes"]) == {"corpus_sha256", "questions_sha256", "prompt_template_sha256"}
    assert written["config"]["questions"] == 2 and len(written["config"]["selected_questions_sha256"]) == 64


def test_a_run_whose_manifest_predates_the_newer_settings_loads_and_resumes(tmp_path):
    evaluate(EvalConfig(limit=2), out=tmp_path / "run")
    path = tmp_path / "run" / MANIFEST
    old = json.loads(path.read_text())
    for name in ("record_kb", "episode_record_kb", "host_seconds", "record_prompt_ids"):  # added to the episode since
        del old["config"]["episode"][name]
    for name in ("max_consecutive_errors", "preregistration", "shard", "ray"):  # added to the run's config since
        del old["config"][name]
    path.write_text(json.dumps(old, indent=2))
    run = Run.load(tmp_path / "run")
    assert run.config.episode.record_kb == 1024 and run.config.questions == 2 and len(run.scores) == 2
    resumed = evaluate(EvalConfig(limit=2), out=tmp_path / "run", resume=True)
    assert resumed.metrics.episodes == 2


def test_statistics_records_read_what_compare_and_a_preregistered_run_wrote():
    by_compare = {"row": "unanswerable", "table": [[2, 18], [9, 11]], "odds_ratio": 0.13, "p_value": 0.031, "design": "unpaired"}
    by_prereg = {"row": "unanswerable", "table": [[2, 18], [9, 11]], "odds_ratio": 0.13, "p_value": 0.031, "significant": True}
    assert FisherTest.model_validate(by_compare).significant is None
    assert FisherTest.model_validate(by_prereg).design == "unpaired"
    result = {"file": "p.toml", "pass": True, "checks": [], "comparison": {"run": "base", "alpha": 0.05, "fisher": [by_prereg]}}
    assert PreregistrationResult.model_validate(result).comparison.fisher[0].significant is True
    assert MeanInterval.model_validate({"mean": None, "low": None, "high": None, "confidence": 0.95}).mean is None
