"""``improve(settings, out=..., corpus=...)``: expert iteration (STaR / ReST-EM), resumable, the
workflow behind ``explorer improve``.

Each round samples the current policy K times per question of the train split (an eval run,
``evaluation.run``), keeps per question the best successful attempts (``sft.build`` with
``best_of``; never a direct submit), trains a fresh QLoRA adapter on
them from the base model (``sft.train``, the recipe of ``explorer train``), and judges it by its
validation episodes. A round that makes the direct-submit rate rise or answer F1 fall stops the
loop and says so; the adapter of the last good round is the result.

Layout: ``OUT/improve.json`` (the settings; a resume with other settings is refused) and one
directory per round: ``samples/`` (an eval run), ``data/`` (a built dataset), ``train/`` (a
training run) and ``round.json`` (what the round gave and whether it was kept). Every stage
that finished is skipped on a rerun; an interrupted one resumes. A Ctrl-C while a round trains
saves a checkpoint and raises ``TrainingInterrupted``; the same call resumes it.

At scale the sampling goes to a vLLM server instead (``base_url``): the round's adapter is
loaded into it through vLLM's runtime LoRA endpoint (``/v1/load_lora_adapter``, enabled with
``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``) under a name no other run, round or adapter shares
(``<run id>-r<N>-<sha12>``), checked against the server's own model list, sampled, and unloaded
when the round's sampling ends (agent.policies.adapters). The round records that name and path.
"""

from __future__ import annotations

import os
from functools import partial
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ConfigDict

import paper_explorer.corpus.files as files
from paper_explorer.agent.errors import AgentError
from paper_explorer.agent.models import file_hashes, tokenizer_file
from paper_explorer.agent.policies.settings import served_adapter_of
from paper_explorer.corpus.files import atomic_file
from paper_explorer.corpus.setting_names import setting
from paper_explorer.evaluation.run_directory import MANIFEST, METRICS, TRAJECTORIES
from paper_explorer.sft.build import NothingToTrain, build_dataset
from paper_explorer.sft.config import BuildConfig, ImproveSettings, TrainConfig
from paper_explorer.sft.errors import TrainingError
from paper_explorer.sft.known_warnings import known_warnings_silenced
from paper_explorer.sft.records import TrainingSummary
from paper_explorer.sft.rounds import settings_recorded
from paper_explorer.sft.train import SUMMARY, train
from paper_explorer.sft.validation import shown

M = TypeVar("M", bound=BaseModel)

SETTINGS_FILE = "improve.json"


class RoundRecord(BaseModel):
    model_config = ConfigDict(extra="forbid")

    round: int
    sampled_with: str  # the adapter sampled (or "base")
    served_name: str | None = None  # --base-url: the name the server served sampled_with under
    served_path: str | None = None  # --base-url: the path the server listed for that name (sampled_with, absolute)
    episodes: int
    successful: int
    examples: int = 0
    adapter: str | None = None  # the round's chosen checkpoint
    adapter_files: dict[str, str] | None = None  # its files' SHA-256 by relative path: checked before it is used
    answer_f1: float | None = None
    direct_submit_rate: float | None = None
    kept: bool = False
    reason: str


def improve(settings: ImproveSettings, *, out: str | Path, corpus=None, log=print, reporter=None) -> list[RoundRecord]:
    """Run (or resume) the rounds in ``out``; each round's record, in order. ``corpus`` (a
    ``corpus.Corpus``, a path to load one from, or None: the demo corpus) has its train split
    sampled. ``log`` gets a line per round and the result; ``reporter`` (an
    ``evaluation.run.Reporter``; default: the logging one) what each round's sampling says.

    Raises TrainingError on settings or an OUT that cannot be used; after a Ctrl-C,
    EvaluationInterrupted while a round samples and TrainingInterrupted (a checkpoint saved)
    while it trains: the same call resumes either."""
    from paper_explorer.corpus import Corpus
    from paper_explorer.evaluation.run import load_corpus

    out = Path(out)
    for path in [*settings.seed_data, *([settings.adapter] if settings.adapter else [])]:
        if not Path(path).exists():
            raise TrainingError(f"{path}: no such file or directory")
    settings_recorded(out, settings, SETTINGS_FILE, "explorer improve", new_directory=False)
    corpus = corpus if isinstance(corpus, Corpus) else load_corpus(corpus)  # a loaded one has said its warnings
    current, previous, records = settings.adapter, None, []
    with known_warnings_silenced():
        for number in range(1, settings.rounds + 1):
            record = run_round(out / f"round-{number}", number, settings, corpus, current, previous, reporter)
            records.append(record)
            log(
                f"round {number}: {record.successful} of {record.episodes} attempts succeeded, {record.examples} examples; "
                f"answer F1 {shown(record.answer_f1)}, direct-submit {shown(record.direct_submit_rate)} - {record.reason}"
            )
            if not record.kept:
                log(f"stopped after round {number}; the result is {current or 'the base model'}")
                return records
            current, previous = checked_adapter(out / f"round-{number}", record), record
    log(f"{settings.rounds} rounds done; the result is {current}")
    return records


def run_round(
    directory: Path, number: int, settings: ImproveSettings, corpus, adapter: str | None, previous: RoundRecord | None, reporter=None
) -> RoundRecord:
    """One round, each stage skipped when it already finished."""
    from paper_explorer.evaluation.run_directory import Run

    record_path = directory / "round.json"
    if record_path.exists():
        return _read(record_path, RoundRecord, "round record", directory)
    directory.mkdir(parents=True, exist_ok=True)
    samples = Run.load(_sample(directory / "samples", number, settings, corpus, adapter, reporter))
    served = served_adapter_of(samples.manifest.config.policy)  # as its sampling run served the adapter (openai)
    successful = sum(1 for score in samples.scores if score.status in ("submitted", "abstained") and (score.answer_f1 or 0) >= 0.5)
    record = partial(
        RoundRecord,
        round=number,
        sampled_with=adapter or "base",
        episodes=len(samples.scores),
        successful=successful,
        served_name=served.name if served is not None else None,
        served_path=served.path if served is not None else None,
    )
    data = directory / "data"
    if not (data / "build_report.json").exists():
        sources = [samples.directory / TRAJECTORIES, *map(Path, settings.seed_data)]
        try:
            build_dataset(
                BuildConfig(best_of=settings.best_of),
                trajectories=sources,
                tokenizer=tokenizer_file(settings.model),
                out=data,
                corpus=corpus,
                force=True,
            )
        except NothingToTrain:
            return _finish(
                record_path,
                record(
                    reason="nothing to train on: no attempt succeeded with research; sample more "
                    f"({setting('samples')}, {setting('limit')}), or add {setting('seed_data')} (e.g. explorer sft teach's trajectories)"
                ),
            )
    from paper_explorer.sft.dataset import load_report

    examples = sum(load_report(data).kept.values())
    summary = _train(directory / "train", data, settings, corpus)
    # a record without a checkpoint (an --eval-steps validation) is never the chosen one, even when none was chosen
    best = next((c for c in summary.checkpoints if c.checkpoint is not None and c.checkpoint == summary.best_checkpoint), None)
    if best is None or best.checkpoint is None:
        return _finish(
            record_path,
            record(
                examples=examples,
                reason=f"no checkpoint passed the behavioural selection ({'; '.join(summary.warnings) or summary.criterion})",
            ),
        )
    kept, reason = judged(best.behaviour.answer_f1, best.behaviour.direct_submit_rate, previous)
    chosen = directory / "train" / best.checkpoint
    return _finish(
        record_path,
        record(
            examples=examples,
            adapter=str(chosen),
            adapter_files=_hashes(chosen, record_path),
            answer_f1=best.behaviour.answer_f1,
            direct_submit_rate=best.behaviour.direct_submit_rate,
            kept=kept,
            reason=reason,
        ),
    )


def checked_adapter(directory: Path, record: RoundRecord) -> str:
    """The adapter a kept round recorded, once it is shown to be what the round trained: a
    checkpoint inside the round's own training run (``train/``), whose files hash to what the round
    recorded. round.json is a file anyone who can write OUT can forge; unchecked, its ``adapter``
    could name any directory as the next round's policy, and as the result."""
    path, train = directory / "round.json", directory / "train"
    again = f"remove {path} to judge the round again from its training run (or {directory} to run the whole round again)"
    if record.adapter is None or record.adapter_files is None:
        missing = "an adapter" if record.adapter is None else "its adapter's file hashes (written by an older version)"
        raise TrainingError(f"{path}: a kept round without {missing}; {again}")
    adapter = Path(record.adapter)
    if not os.path.realpath(adapter).startswith(os.path.realpath(train) + os.sep):  # links resolved: one out of train/ is refused
        raise TrainingError(f"{path}: its adapter {adapter} is not a checkpoint of the round's training run {train}; {again}")
    if not adapter.is_dir():
        raise TrainingError(f"{path}: its adapter {adapter} is not a directory (removed?); {again}")
    now = _hashes(adapter, path)
    changed = sorted(name for name in now.keys() | record.adapter_files.keys() if now.get(name) != record.adapter_files.get(name))
    if changed:
        shown = ", ".join(changed[:3]) + (f" and {len(changed) - 3} more" if len(changed) > 3 else "")
        raise TrainingError(f"{path}: its adapter {adapter} is not the one the round recorded ({shown} changed, added or removed); {again}")
    return record.adapter


def _hashes(adapter: Path, record_path: Path) -> dict[str, str]:
    try:
        return file_hashes(adapter)
    except AgentError as error:  # a link out of the adapter, a special file in it
        raise TrainingError(f"{error} (the adapter of {record_path}); remove it to train the round again") from None


def judged(f1: float | None, rate: float | None, previous: RoundRecord | None) -> tuple[bool, str]:
    """Whether a round's adapter is kept: not when answer F1 fell or the direct-submit rate rose."""
    if previous is None:
        return True, "kept"
    before_f1, before_rate = previous.answer_f1, previous.direct_submit_rate
    if f1 is not None and before_f1 is not None and f1 < before_f1:
        return False, f"answer F1 on validation episodes fell ({before_f1:.3f} -> {f1:.3f})"
    if rate is not None and before_rate is not None and rate > before_rate:
        return False, f"the direct-submit rate rose ({before_rate:.0%} -> {rate:.0%})"
    return True, "kept"


def _sample(run: Path, number: int, settings: ImproveSettings, corpus, adapter: str | None, reporter) -> Path:
    """The round's attempts: an eval run on the train split, K samples per question."""
    if (run / METRICS).exists():
        return run
    from paper_explorer.agent.config import EvalConfig
    from paper_explorer.agent.policies import make_config
    from paper_explorer.agent.trajectory import EpisodeConfig
    from paper_explorer.evaluation.run import run_eval

    if settings.base_url is None:
        policy = make_config(
            "hf",
            model=settings.model,
            adapter=Path(adapter) if adapter else None,
            quantization=settings.quantization,
            max_new_tokens=settings.max_new_tokens,
            temperature=settings.temperature,
        )
    else:
        from paper_explorer.agent.policies.adapters import planned_adapter, run_id

        # eval loads the adapter under a name of this improve run (OUT is run's grandparent) and round, and unloads it.
        served = planned_adapter(Path(adapter), run_id(run.parents[1]), number) if adapter else None
        policy = make_config(
            "openai",
            base_url=settings.base_url,
            model=settings.model,
            adapter=Path(adapter) if adapter else None,
            served_adapter=served,
            tokenizer=tokenizer_file(settings.model),
            max_new_tokens=settings.max_new_tokens,
            temperature=settings.temperature,
        )
    config = EvalConfig(
        policy=policy,
        episode=EpisodeConfig(max_steps=settings.max_steps, seed=settings.seed + number),
        split="train",
        limit=settings.limit,
        samples=settings.samples,
    )
    run_eval(run, config, corpus, resume=(run / MANIFEST).exists(), reporter=reporter)
    return run


def _train(run: Path, data: Path, settings: ImproveSettings, corpus) -> TrainingSummary:
    """The round's training run; one an earlier try left (even with only a checkpoint a kill cut off) is resumed."""
    if (run / SUMMARY).exists():
        return _read(run / SUMMARY, TrainingSummary, "training summary", run)
    config = TrainConfig(
        model=settings.model,
        quantization=settings.quantization,
        seed=settings.seed,
        validation_episodes=settings.validation_episodes,
        validation_max_steps=settings.max_steps,
        max_steps=settings.train_max_steps or -1,
    )  # -1: the recipe's epochs
    summary = train(config, data=data, out=run, corpus=corpus, log=lambda *_: None, resume=run.is_dir() and any(run.iterdir()))
    if summary is None:  # what a launcher's other processes get: improve's rounds run in one process
        raise TrainingError("explorer improve trains each round in one process; run it without accelerate launch or torchrun")
    return summary


def _finish(path: Path, record: RoundRecord) -> RoundRecord:
    with atomic_file(path) as handle:
        handle.write(record.model_dump_json(indent=2))
    return record


def _read(path: Path, model: type[M], what: str, directory: Path) -> M:
    """A record of the run's directory (``corpus.files.read_model``); anything wrong is one TrainingError line."""
    try:
        return files.read_model(path, model, what=what, inside=directory)
    except files.FileRefused as error:
        raise TrainingError(f"{error}; remove it to run that stage again") from None
