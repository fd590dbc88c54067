"""``explorer improve``: expert iteration (STaR / ReST-EM) in one resumable command.

Each round samples the current policy K times per question of the train split, keeps per
question the best successful attempts (``sft build --best-of``; never one whose first action
ends the episode), trains a fresh QLoRA adapter on them from the base model (the recipe of
``explorer train``), and judges it by its validation episodes. A round that makes the
direct-submit rate rise or answer F1 fall stops the loop and says so; the adapter of the last
good round is the result.

Layout: ``OUT/improve.json`` (the settings; a resume with other settings is refused) and one
directory per round: ``samples/`` (an eval run), ``data/`` (a built dataset), ``train/`` (a
training run) and ``round.json`` (what the round gave and whether it was kept). Every stage
that finished is skipped on a rerun; an interrupted one resumes.

At scale the sampling goes to a vLLM server instead (``--base-url``): the round's adapter is
loaded into it through vLLM's runtime LoRA endpoint (``/v1/load_lora_adapter``, enabled with
``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``) under a name no other run, round or adapter shares
(``<run id>-r<N>-<sha12>``), checked against the server's own model list, sampled, and unloaded
when the round's sampling ends (agent.policies.adapters). The round records that name and path.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import List, Literal, Optional

import typer
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agent.models import tokenizer_file
from agent.terminal_text import visible
from cli.errors import UsageError
from cli.options import CorpusOption, SplitOfOption, open_corpus, split_of

SETTINGS_FILE = "improve.json"


class ImproveSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, protected_namespaces=())

    model: str
    adapter: str | None = None  # the policy of round 1 (None: the base model)
    corpus: str | None = None
    rounds: int = Field(ge=1)
    samples: int = Field(ge=1)
    temperature: float = Field(gt=0, le=10, allow_inf_nan=False)
    limit: int | None = None  # train questions sampled per round
    best_of: int = Field(ge=1)
    seed_data: list[str] = Field(default_factory=list)  # trajectories added to every round's data (e.g. a teacher's)
    max_steps: int = Field(ge=1)
    max_new_tokens: int = Field(ge=1)
    train_max_steps: int | None = None
    validation_episodes: int = Field(ge=0)
    quantization: Literal["auto", "4bit", "none"] = "auto"
    base_url: str | None = None
    seed: int = 0


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
    answer_f1: float | None = None
    direct_submit_rate: float | None = None
    kept: bool = False
    reason: str


def improve_command(
    model: str = typer.Option(..., "--model", "-m", help="The base model: a directory or hub id."),
    out: Path = typer.Option(..., "--out", "-o", help="Directory for the rounds (a rerun resumes it)."),
    adapter: Optional[Path] = typer.Option(None, "--adapter", help="A LoRA adapter to sample round 1 with (default: the base model)."),
    corpus_path: Optional[Path] = CorpusOption,
    split_of_values: Optional[List[str]] = SplitOfOption,
    rounds: int = typer.Option(2, "--rounds", min=1, help="Rounds of sample -> filter -> build -> train -> validate."),
    samples: int = typer.Option(4, "--samples", min=1, help="Attempts per question per round."),
    temperature: float = typer.Option(0.7, "--temperature", min=0.01, help="Sampling temperature."),
    limit: Optional[int] = typer.Option(None, "--limit", min=1, help="Only the first N train questions each round."),
    best_of: int = typer.Option(1, "--best-of", min=1, help="Successful attempts kept per question."),
    seed_data: Optional[List[Path]] = typer.Option(None, "--seed-data", help="Trajectories added to every round's data (e.g. sft teach's)."),
    max_steps: int = typer.Option(10, "--max-steps", min=1, help="Actions per episode."),
    max_new_tokens: int = typer.Option(512, "--max-new-tokens", min=1),
    train_max_steps: Optional[int] = typer.Option(None, "--train-max-steps", min=1, help="Optimizer steps per round (default: the recipe's epochs)."),
    validation_episodes: int = typer.Option(16, "--validation-episodes", min=0, help="Greedy validation episodes per checkpoint."),
    quantization: str = typer.Option("auto", "--quantization", help="auto, 4bit or none (as explorer train)."),
    base_url: Optional[str] = typer.Option(None, "--base-url", help="Sample on a vLLM server with runtime LoRA loading instead of in-process."),
    seed: int = typer.Option(0, "--seed"),
) -> None:
    """Expert iteration: sample, keep the best successful attempts, train, judge by behaviour; stop when a round gets worse."""
    try:
        settings = ImproveSettings(
            model=model, adapter=str(adapter) if adapter else None, corpus=str(corpus_path) if corpus_path else None, rounds=rounds,
            samples=samples, temperature=temperature, limit=limit, best_of=best_of, seed_data=[str(p) for p in seed_data or []],
            max_steps=max_steps, max_new_tokens=max_new_tokens, train_max_steps=train_max_steps,
            validation_episodes=validation_episodes, quantization=quantization, base_url=base_url, seed=seed,
        )
    except ValidationError as error:
        first = error.errors(include_url=False)[0]
        raise UsageError(f"--{'-'.join(str(first['loc'][0]).split('_'))}: {first['msg'].removeprefix('Value error, ')}") from None
    if base_url is not None and not base_url.startswith(("http://", "https://")):
        raise UsageError(f"--base-url {base_url!r} must start with http:// or https://")
    for path in [*(seed_data or []), *([adapter] if adapter else [])]:
        if not path.exists():
            raise UsageError(f"{path}: no such file or directory")
    _check_out(out, settings)
    corpus = open_corpus(corpus_path, splits=split_of(split_of_values))
    current = settings.adapter
    previous: RoundRecord | None = None
    for number in range(1, rounds + 1):
        record = run_round(out / f"round-{number}", number, settings, corpus, corpus_path, current, previous)
        typer.echo(f"round {number}: {record.successful} of {record.episodes} attempts succeeded, {record.examples} examples; "
                   f"answer F1 {_shown(record.answer_f1)}, direct-submit {_shown(record.direct_submit_rate)} - {visible(record.reason)}")
        if not record.kept:
            typer.echo(visible(f"stopped after round {number}; the result is {current or 'the base model'}"))
            return
        current, previous = record.adapter, record
    typer.echo(visible(f"{rounds} rounds done; the result is {current}"))


def _check_out(out: Path, settings: ImproveSettings) -> None:
    if out.exists() and not out.is_dir():
        raise UsageError(f"{out}: is a file; --out names a directory")
    recorded = out / SETTINGS_FILE
    if recorded.exists():
        then = ImproveSettings.model_validate_json(recorded.read_text())
        changed = sorted(k for k, v in settings.model_dump().items() if getattr(then, k) != v)
        if changed:
            raise UsageError(f"{out}: holds an improve run with other settings ({', '.join(changed)}); use them, or another --out")
        return
    out.mkdir(parents=True, exist_ok=True)
    recorded.write_text(settings.model_dump_json(indent=2))


def run_round(directory: Path, number: int, settings: ImproveSettings, corpus, corpus_path: Path | None,
              adapter: str | None, previous: RoundRecord | None) -> RoundRecord:
    """One round, each stage skipped when it already finished."""
    record_path = directory / "round.json"
    if record_path.exists():
        return RoundRecord.model_validate_json(record_path.read_text())
    directory.mkdir(parents=True, exist_ok=True)
    from evaluation.summary import load_run

    samples = _sample(directory / "samples", number, settings, corpus, adapter)
    scores = load_run(samples).scores
    successful = sum(1 for score in scores if score.status in ("submitted", "abstained") and (score.answer_f1 or 0) >= 0.5)
    record = partial(RoundRecord, round=number, sampled_with=adapter or "base", episodes=len(scores), successful=successful,
                     **_served(samples))
    data = directory / "data"
    if not (data / "build_report.json").exists():
        from cli.sft_commands import NothingToTrain, build_dataset

        build_settings = {"min_answer_f1": 0.5, "keep_correct_abstentions": True, "max_length": 8192, "overflow": "drop",
                          "validation_share": 0.2, "evaluation_split": "test", "train_thinking": False, "best_of": settings.best_of}
        sources = [samples / "trajectories.jsonl", *map(Path, settings.seed_data)]
        try:
            build_dataset(sources, data, tokenizer_file(settings.model), corpus, build_settings)
        except NothingToTrain:
            return _finish(record_path, record(reason="nothing to train on: no attempt succeeded with research; sample more "
                                                      "(--samples, --limit), or add --seed-data (e.g. explorer sft teach's trajectories)"))
    from sft.dataset import load_report

    examples = sum(load_report(data).kept.values())
    summary = _train(directory / "train", data, settings, corpus)
    best = next((c for c in summary.checkpoints if c.checkpoint == summary.best_checkpoint), None)
    if best is None:
        return _finish(record_path, record(examples=examples, reason="no checkpoint passed the behavioural selection "
                                                                     f"({'; '.join(summary.warnings) or summary.criterion})"))
    f1, rate = best.behaviour.answer_f1, best.behaviour.direct_submit_rate
    reason, kept = "kept", True
    if previous is not None and None not in (f1, previous.answer_f1) and f1 < previous.answer_f1:
        reason, kept = f"answer F1 on validation episodes fell ({previous.answer_f1:.3f} -> {f1:.3f})", False
    elif previous is not None and None not in (rate, previous.direct_submit_rate) and rate > previous.direct_submit_rate:
        reason, kept = f"the direct-submit rate rose ({previous.direct_submit_rate:.0%} -> {rate:.0%})", False
    return _finish(record_path, record(examples=examples, adapter=str(directory / "train" / best.checkpoint), answer_f1=f1,
                                       direct_submit_rate=rate, kept=kept, reason=reason))


def _sample(run: Path, number: int, settings: ImproveSettings, corpus, adapter: str | None) -> Path:
    """The round's attempts: an eval run on the train split, K samples per question."""
    if (run / "metrics.json").exists():
        return run
    from agent.config import EvalConfig, PolicyConfig
    from agent.trajectory import EpisodeConfig
    from cli.eval_command import run_eval

    if settings.base_url is None:
        policy = PolicyConfig(name="hf", model=settings.model, adapter=Path(adapter) if adapter else None, quantization=settings.quantization,
                              max_new_tokens=settings.max_new_tokens, temperature=settings.temperature)
    else:
        from agent.policies.adapters import planned_adapter, run_id

        # eval loads the adapter under a name of this improve run (OUT is run's grandparent) and round, and unloads it.
        served = planned_adapter(Path(adapter), run_id(run.parents[1]), number) if adapter else None
        policy = PolicyConfig(name="openai", base_url=settings.base_url, model=settings.model, adapter=Path(adapter) if adapter else None,
                              served_adapter=served, tokenizer=tokenizer_file(settings.model),
                              max_new_tokens=settings.max_new_tokens, temperature=settings.temperature)
    config = EvalConfig(policy=policy, episode=EpisodeConfig(max_steps=settings.max_steps, seed=settings.seed + number),
                        split="train", limit=settings.limit, samples=settings.samples)
    try:
        run_eval(run, config, corpus, resume=(run / "manifest.json").exists())
    except typer.Exit as stopped:
        if stopped.exit_code:
            raise
    return run


def _served(samples: Path) -> dict:
    """The name and path the round's adapter was served under, as its sampling run recorded them."""
    from agent.manifest import RunManifest

    served = RunManifest.model_validate_json((samples / "manifest.json").read_bytes()).config.policy.served_adapter
    return {"served_name": served.name, "served_path": served.path} if served is not None else {}


def _train(run: Path, data: Path, settings: ImproveSettings, corpus):
    """The round's training run; one an earlier try left (even with only a checkpoint a kill cut off) is resumed.
    Ctrl-C saves a checkpoint, says so and exits 130, as explorer train does: the same command resumes it."""
    import sys

    from cli.sft_commands import exit_interrupted
    from sft.records import TrainingSummary
    from sft.train import TrainConfig, TrainingInterrupted, train

    summary_path = run / "training_summary.json"
    if summary_path.exists():
        return TrainingSummary.model_validate_json(summary_path.read_text())
    config = TrainConfig(model=settings.model, quantization=settings.quantization, seed=settings.seed,
                         validation_episodes=settings.validation_episodes, validation_max_steps=settings.max_steps,
                         **({"max_steps": settings.train_max_steps} if settings.train_max_steps else {}))
    try:
        return train(config, data, run, corpus, log=lambda *_: None, resume=run.is_dir() and any(run.iterdir()))
    except TrainingInterrupted as stop:
        exit_interrupted(stop, ["explorer", *sys.argv[1:]])


def _finish(path: Path, record: RoundRecord) -> RoundRecord:
    from corpus.atomic import atomic_file

    with atomic_file(path) as handle:
        handle.write(record.model_dump_json(indent=2))
    return record


def _shown(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"
