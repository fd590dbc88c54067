"""What an rl run checks before it trusts a file it did not just write: the adapter it starts from,
an OUT whose settings are all it holds, a finished round's adapter and optimizer state before the
next round trains from them (a moved run is still its own; a forged round.json is not), and that a
round's samples and validation were drawn on the questions and by the adapter the round is for."""

from __future__ import annotations

import json
import os
from pathlib import Path

import paper_explorer.corpus.files as files
from paper_explorer.agent.errors import AgentError
from paper_explorer.agent.models import file_hashes
from paper_explorer.agent.policies.adapters import adapter_sha256
from paper_explorer.agent.policies.settings import adapter_of, served_adapter_of
from paper_explorer.corpus.setting_names import setting
from paper_explorer.evaluation.run_directory import read_manifest
from paper_explorer.rl.config import RLConfig
from paper_explorer.rl.records import RoundRecord
from paper_explorer.rl.update import ADAPTER, OPTIMIZER
from paper_explorer.sft.errors import TrainingError

SETTINGS_FILE = "rl.json"
ROUND = "round.json"
UPDATE = "update"


def check_start_adapter(start: Path) -> None:
    """policy.adapter, before anything is written: a LoRA adapter directory as peft saves one."""
    named = f"{setting('policy.adapter')} names a LoRA adapter directory (PeftModel.save_pretrained writes one)"
    config = start / "adapter_config.json"
    if not config.is_file():
        raise TrainingError(f"{start}: no adapter_config.json; {named}")
    try:
        settings = json.loads(files.read_text(config, limit=files.DOCUMENT_BYTES, what="adapter config"))
    except json.JSONDecodeError as error:
        raise TrainingError(f"{config}: not valid JSON ({error.msg} at line {error.lineno}); {named}") from None
    except files.FileRefused as error:
        raise TrainingError(str(error)) from None
    if not isinstance(settings, dict) or "peft_type" not in settings:
        raise TrainingError(f"{config}: not a peft adapter's config (no peft_type); {named}")
    if not any((start / weights).is_file() for weights in ("adapter_model.safetensors", "adapter_model.bin")):
        raise TrainingError(f"{start}: no adapter_model.safetensors (the adapter's weights); {named}")


def forget_settings_of_a_run_that_wrote_nothing(out: Path) -> bool:
    """A run that stopped before it wrote anything but its settings (a model path mistyped, a server
    not up) holds nothing they must agree with: its rl.json goes, so the command, corrected, starts
    anew in the same OUT instead of being refused as a run with other settings."""
    if not (out / SETTINGS_FILE).is_file():
        return False
    try:  # only settings of ours go: a file that is not is for the user to see (settings_recorded names it)
        files.read_model(out / SETTINGS_FILE, RLConfig, what="explorer rl run's settings", inside=out)
    except (files.FileRefused, AgentError):
        return False
    directories = []
    for root, names, written in os.walk(out):
        if any(Path(root, name) != out / SETTINGS_FILE for name in written) or any(Path(root, n).is_symlink() for n in names):
            return False
        directories.append(Path(root))
    (out / SETTINGS_FILE).unlink()
    for directory in reversed(directories[1:]):  # the deepest first; OUT itself stays
        directory.rmdir()
    return True


def checked_adapter(directory: Path, record: RoundRecord) -> Path:
    """The adapter a round wrote, once shown to be the one it recorded: the round's own
    update/adapter (wherever the run has been moved since; a round.json that names another round's
    or another directory's is refused), its files and the optimizer's state hashing to what round.json says."""
    path, own = directory / ROUND, directory / UPDATE / ADAPTER
    recorded = Path(record.adapter)
    if recorded.parts[-3:] != (directory.name, UPDATE, ADAPTER) or record.round != int(directory.name.removeprefix("round-")):
        raise TrainingError(f"{path}: its adapter {recorded} is not the round's own ({own}); {again(directory)}")
    not_a_link(directory / UPDATE)
    if not own.is_dir() or file_hashes(own) != record.adapter_files:
        raise TrainingError(f"{path}: its adapter {own} is missing or not the one the round recorded; {again(directory)}")
    if record.optimizer_sha256 is not None and optimizer_sha256(directory / UPDATE) != record.optimizer_sha256:
        raise TrainingError(f"{path}: {directory / UPDATE / OPTIMIZER} is missing or not the one the round recorded; {again(directory)}")
    return own


def again(directory: Path) -> str:
    return f"remove {directory / ROUND} and {directory / UPDATE} to run the round's update again"


def not_a_link(update: Path) -> None:
    """update/ is written by the round (renamed into place): a link there would train on, and
    record, another directory's adapter."""
    if update.is_symlink():
        raise TrainingError(
            f"{update}: a symbolic link, not the round's own update; remove it (and the round's {ROUND}) to run the round's update again"
        )


def optimizer_sha256(update: Path) -> str | None:
    state = update / OPTIMIZER
    return files.sha256(state, inside=update, what="optimizer state") if state.is_file() else None


def sampled_the_questions(samples: Path, number: int, questions) -> None:
    """A finished round sampled the questions the corpus gives it now (its samples' manifest hashes
    them): else the corpus, or how it is split, changed since, and the rounds still to come would
    sample other questions than the run that was never stopped."""
    from paper_explorer.corpus.collection import questions_sha256

    advice = f"resume with the corpus it ran with, or choose another {setting('out')}"
    try:
        sampled = read_manifest(samples, advice).hashes.questions_sha256
    except FileNotFoundError:  # samples pruned to save space: a finished round needs them no more
        return
    if sampled != questions_sha256(questions):
        raise TrainingError(
            f"{samples.parent}: sampled other train questions than the corpus gives round {number} now: the corpus or how it is split "
            f"changed since; {advice}"
        )


def began_with(run: Path, what: str, adapter: Path | None) -> None:
    """Samples begun with the adapter at another path (the run was moved since) would be refused by
    eval's resume as other settings: said as what it is, and what to do."""
    recorded = adapter_of(read_manifest(run).config.policy)
    if (recorded is None) != (adapter is None) or (recorded is not None and Path(recorded) != adapter):
        raise TrainingError(
            f"{run}: {what} with {recorded or 'the base'}, not {adapter or 'the base'} (was the run moved?); remove {run} to run it again"
        )


def drawn_with(run, what: str, adapter: Path | None) -> None:
    """Every episode of a round's samples (or validation) was drawn by the adapter it trains from
    (validates), by the hashes its policy recorded: a previous round trained again since, and not
    to the same bytes, would make the update off-policy, or the judgement stale, without a word."""
    named, again = adapter or "the base", f"remove {run.directory} to run it again"
    served = served_adapter_of(run.manifest.config.policy)
    if served is not None and (adapter is None or served.sha256 != adapter_sha256(adapter)):
        raise TrainingError(f"{run.directory}: served another adapter than {named}, which {what}; {again}")
    expected = file_hashes(adapter) if adapter is not None else None
    for trajectory in run.trajectories:
        if any(found != expected for found in _values_named("adapter_sha256", trajectory.policy.settings)):
            raise TrainingError(
                f"{run.directory}: episode {trajectory.episode_id} was drawn by another adapter than {named}, which {what}; {again}"
            )


def _values_named(name: str, settings):
    """Every value of key ``name`` in nested settings (a memory reader records its backend's inside its own)."""
    if isinstance(settings, dict):
        for key, value in settings.items():
            if key == name:
                yield value
            else:
                yield from _values_named(name, value)
    elif isinstance(settings, list):
        for value in settings:
            yield from _values_named(name, value)
