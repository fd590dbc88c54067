"""A training run's checkpoints on disk: which one a resume continues from, and whether it may.

A checkpoint directory ``OUT/checkpoint-N`` is complete when it holds ``explorer_manifest.json``
(a ``CheckpointManifest``: the config it was trained with, its data, its validation and the
SHA-256 of every file), which is written last and whole. A directory without it was cut off
while saving: it is removed, never resumed from. A resume with settings that would change what
is trained is refused, before the model loads.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from pydantic import ValidationError

import paper_explorer.corpus.files as files
from paper_explorer.agent.models import file_sha256
from paper_explorer.corpus.files import atomic_file
from paper_explorer.sft.config import TrainConfig
from paper_explorer.sft.errors import TrainingError
from paper_explorer.sft.records import CheckpointManifest, ValidationRecord

MANIFEST = "explorer_manifest.json"
# Settings a resumed run may change: where the figures go, which steps are saved, validated or
# selected - never the weights. Any other field of TrainConfig differing from the checkpoint's is refused.
RESUMABLE_CHANGES = ("report_to", "save_steps", "eval_steps", "max_direct_submit_rate", "selection_metric", "threads")


def _number(checkpoint: Path) -> int:
    return int(checkpoint.name.removeprefix("checkpoint-"))


def _checkpoints(out: Path) -> list[Path]:
    """OUT's checkpoint directories, oldest first."""
    return sorted((p for p in out.glob("checkpoint-*") if p.is_dir() and p.name.removeprefix("checkpoint-").isdigit()), key=_number)


def newest_complete(out: Path) -> Path | None:
    """The newest checkpoint that has its manifest (the last thing a save writes)."""
    return next((p for p in reversed(_checkpoints(out)) if (p / MANIFEST).exists()), None)


def finished(checkpoint: Path) -> int | None:
    """The checkpoint's step when it is the run's last (its trainer state says so), else None."""
    path = checkpoint / "trainer_state.json"
    try:
        state = files.parse_json(files.read_bytes(path, limit=files.DOCUMENT_BYTES, inside=checkpoint, what="trainer state"), path)
    except (files.FileRefused, ValueError) as error:  # ValueError: invalid JSON, or not UTF-8
        raise TrainingError(
            f"{path}: not a trainer state ({str(error).splitlines()[0]}); remove the checkpoint to resume from the one before"
        ) from None
    if not isinstance(state, dict) or not isinstance(state.get("global_step"), int) or not isinstance(state.get("max_steps", 0), int):
        raise TrainingError(f"{path}: not a trainer state (no global_step); remove the checkpoint to resume from the one before")
    return state["global_step"] if state.get("max_steps") and state["global_step"] >= state["max_steps"] else None


def resumable_checkpoint(out: Path, log=print, main: bool = True) -> Path | None:
    """The newest complete checkpoint in OUT, or None when there is none: training starts from
    step 0, saying so. A newer one without its manifest was cut off while saving: it is removed,
    saying so, never resumed from."""
    newest = newest_complete(out)
    for partial in (p for p in _checkpoints(out) if newest is None or _number(p) > _number(newest)):
        if main:
            log(f"{partial}: cut off while saving (no {MANIFEST}); removed, resuming from {newest.name if newest else 'step 0'}")
            shutil.rmtree(partial)
    if newest is None:
        log(f"{out}: no complete checkpoint to resume from; training starts from step 0")
    return newest


def checkpoint_manifest(checkpoint: Path) -> CheckpointManifest:
    try:
        return CheckpointManifest.model_validate_json(
            files.without_bom(
                files.read_bytes(checkpoint / MANIFEST, limit=files.DOCUMENT_BYTES, inside=checkpoint, what="checkpoint manifest")
            )
        )
    except files.FileRefused as error:
        raise TrainingError(f"{error}; remove the checkpoint to resume from the one before") from None
    except ValidationError as error:
        raise TrainingError(
            f"{checkpoint / MANIFEST}: not a checkpoint manifest ({error.errors()[0]['msg']}); "
            "remove the checkpoint to resume from the one before"
        ) from None


def resume_conflicts(manifest: CheckpointManifest, config: TrainConfig, data: Path) -> list[str]:
    """What differs between the run a checkpoint belongs to and the one asked to resume it, as
    ``field then -> now``: the settings (but RESUMABLE_CHANGES), the data directory and its build report.
    Fields added to TrainConfig since the manifest was written count as their defaults."""
    now = config.model_dump(mode="json")
    then = {**TrainConfig().model_dump(mode="json"), **manifest.config}
    changed = [f"{key} {then[key]!r} -> {value!r}" for key, value in now.items() if then[key] != value and key not in RESUMABLE_CHANGES]
    changed += [f"{key} (not a setting of this version)" for key in then if key not in now]
    if Path(manifest.data).resolve() != data.resolve():
        changed.append(f"data {manifest.data} -> {data}")
    elif manifest.data_build_report_sha256 != file_sha256(data / "build_report.json"):
        changed.append(f"data (its build_report.json is not the one {data} held then: rebuilt)")
    return changed


def check_resume(checkpoint: Path, config: TrainConfig, data: Path) -> None:
    """Refuse (one line, before the model loads) to continue a run with settings that change what is trained."""
    changed = resume_conflicts(checkpoint_manifest(checkpoint), config, data)
    if changed:
        raise TrainingError(
            f"{checkpoint.parent}: refusing to resume: {checkpoint.name} was trained with other settings "
            f"({'; '.join(changed)}); resume with the original ones (its {MANIFEST} holds them), "
            f"or start a new run with another --out (only {', '.join(RESUMABLE_CHANGES)} may change)"
        )


def complete_checkpoint(
    checkpoint: Path,
    config: TrainConfig,
    data: Path,
    quantized: bool,
    tokenizer_sha256: str | None,
    record: ValidationRecord | None,
    interrupted: bool = False,
) -> None:
    """Complete a saved checkpoint: the tokenizer, and a manifest with every file's SHA-256 and its
    validation (None: not validated). The manifest is written last and whole: it marks the checkpoint complete."""
    for name in ("tokenizer.json", "tokenizer_config.json"):
        source = Path(config.model) / name
        if source.exists():
            try:  # links followed (a hub snapshot's files are links to its blobs), but only to a bounded regular file
                files.copy_file(source, checkpoint / name, limit=files.DOCUMENT_BYTES, what=name)
            except files.FileRefused as error:
                raise TrainingError(f"{error}; {checkpoint} is left incomplete (a resume removes it): mend {source} and resume") from None
    hashes = {str(p.relative_to(checkpoint)): file_sha256(p) for p in sorted(checkpoint.rglob("*")) if p.is_file() and p.name != MANIFEST}
    manifest = CheckpointManifest(
        base_model=config.model,
        quantized=quantized,
        config=config.model_dump(mode="json"),
        data=str(data),
        data_build_report_sha256=file_sha256(data / "build_report.json"),
        data_tokenizer_sha256=tokenizer_sha256,
        validation=record,
        interrupted=interrupted,
        step=_number(checkpoint),
        files=hashes,
    )
    with atomic_file(checkpoint / MANIFEST) as handle:
        handle.write(manifest.model_dump_json(indent=2))
