"""``explorer rl``: reinforcement learning over live sandboxed episodes, in on-policy rounds.

Each round, in its own directory ``OUT/round-N``:

1. ``samples/`` - an eval run (``explorer eval``'s own loop, sandbox and records) of
   ``group_size`` sampled episodes for each of the round's ``questions_per_round`` train questions,
   with the adapter the previous round made (round 1: ``policy.adapter``, or the base), recording
   every prompt's ids and every draw's ids and log-probabilities (``agent.trajectory.Sampled``).
   With ``policy.name = "openai"`` a vLLM server samples, the round's adapter loaded into it at
   runtime under a name of this run's round (as ``explorer improve`` does).
2. ``rewards.jsonl`` and ``batch.jsonl`` - each episode's reward and its parts (``rl.rewards``),
   its group-relative advantage (``rl.advantages``), and the token sequences the update trains
   (``rl.sequences``: the ids sampled, never a re-rendering).
3. ``update/`` - the adapter after the round's optimizer steps and AdamW's state (``rl.update``).
4. ``validation/`` - an eval run of greedy episodes on the validation split with that adapter
   (``round-0/validation`` holds the starting weights'). Rounds are judged by behaviour on it, as
   ``explorer train`` judges checkpoints (``sft.validation.select_checkpoint``), never by loss.
5. ``round.json`` - the round's record (``RoundRecord``): rewards, advantages, KL, clip fraction,
   lengths, detector rates, tokens sampled and trained, seconds; written last.

Every stage is skipped when its output is whole, and each is a function of files written before it
and the seed: a run killed anywhere (``kill -9`` included) and started again with the same command
gives the same adapter and records as one that was never stopped.
"""

from __future__ import annotations

import dataclasses
import gc
import time
from collections import defaultdict
from pathlib import Path
from statistics import fmean, pstdev
from typing import TypeVar

from pydantic import BaseModel

import paper_explorer.corpus.files as files
from paper_explorer.agent.models import file_hashes
from paper_explorer.agent.policies.settings import adapter_of
from paper_explorer.corpus.files import atomic_file
from paper_explorer.corpus.setting_names import setting
from paper_explorer.evaluation.run_directory import MANIFEST, METRICS
from paper_explorer.rl.batch import round_batch
from paper_explorer.rl.checks import (
    ROUND,
    SETTINGS_FILE,
    UPDATE,
    again,
    began_with,
    check_start_adapter,
    checked_adapter,
    drawn_with,
    forget_settings_of_a_run_that_wrote_nothing,
    not_a_link,
    optimizer_sha256,
    sampled_the_questions,
)
from paper_explorer.rl.config import RLConfig
from paper_explorer.rl.records import EpisodeReward, RLSummary, RoundRecord, UpdateRecord
from paper_explorer.rl.reporting import Reporter, round_line
from paper_explorer.rl.sequences import TrainingSequence
from paper_explorer.rl.update import ADAPTER, OPTIMIZER, UpdateFigures, train_model
from paper_explorer.sft.errors import TrainingError
from paper_explorer.sft.records import Behaviour, ValidationRecord
from paper_explorer.sft.rounds import settings_recorded

M = TypeVar("M", bound=BaseModel)

# What a resume may change: more (or fewer) rounds, another reporter; the rounds done stay as they are.
RESUMABLE_CHANGES = frozenset({"rounds", "report_to", "ray"})  # ray: where episodes run, not which

SUMMARY = "rl_summary.json"
SAMPLES = "samples"
VALIDATION = "validation"


def reinforce(config: RLConfig, *, out: str | Path, corpus=None, log=print, reporter=None) -> RLSummary:
    """Run (or resume) the rounds in ``out``; the summary, also written to ``out/rl_summary.json``.
    ``corpus``: a ``corpus.Corpus``, a path, or None for the demo corpus. ``log`` gets a line per
    round; ``reporter`` (an ``evaluation.run.Reporter``) what each eval run says.

    Raises TrainingError on settings or an OUT that cannot be used (one line), and
    EvaluationInterrupted after a Ctrl-C while a round samples or validates: the same call resumes."""
    from paper_explorer.corpus import Corpus
    from paper_explorer.evaluation.run import load_corpus

    out = Path(out)
    start = adapter_of(config.policy)
    if start is not None:
        check_start_adapter(start)
    _check_reporter(config, out)
    if config.policy.serving == "openai":
        train_model(config)  # the weights the server samples, found loadable here before anything is written (AgentError: one line)
    corpus = corpus if isinstance(corpus, Corpus) else load_corpus(corpus)
    train = corpus.split("train")
    if not train.questions:
        raise TrainingError(f"the corpus has no train questions to sample; {setting('corpus')} names one with a train split")
    if config.questions_per_round > len(train.questions):
        raise TrainingError(
            f"{setting('questions_per_round', config.questions_per_round)} is more than the train split's {len(train.questions)} "
            f"questions (a question is sampled once a round, in a group of {setting('group_size')}); give at most {len(train.questions)}"
        )
    if config.validation_episodes and not corpus.split("validation").questions:
        raise TrainingError(f"the corpus has no validation questions; give it some, or pass {setting('validation_episodes', 0)}")
    forget_settings_of_a_run_that_wrote_nothing(out)
    new = not out.exists()
    settings_recorded(out, config, SETTINGS_FILE, "explorer rl", may_change=RESUMABLE_CHANGES)
    try:
        summary = _rounds(config, out, corpus, train, start, log, reporter)
    except BaseException:  # a start that wrote nothing leaves nothing (a bad model path, a server not up)
        if forget_settings_of_a_run_that_wrote_nothing(out) and new:
            out.rmdir()
        raise
    with atomic_file(out / SUMMARY) as handle:
        handle.write(summary.model_dump_json(indent=2))
    best = "the starting weights" if summary.best_round == 0 else f"round {summary.best_round}" if summary.best_round else "none"
    log(
        f"{config.rounds} rounds done; best by validation behaviour: {best}"
        + (f" ({summary.best_adapter})" if summary.best_adapter else "")
    )
    for warning in summary.warnings:
        log(f"warning: {warning}")
    return summary


def _rounds(config: RLConfig, out: Path, corpus, train, start: Path | None, log, reporter) -> RLSummary:
    """Validate the starting weights, then run (or read back) each round in turn."""
    from paper_explorer.sft.known_warnings import known_warnings_silenced

    with known_warnings_silenced(), Reporter(config.report_to, out) as scalars:
        start_behaviour = _validate(out / "round-0", 0, config, corpus, start, reporter)
        records: list[RoundRecord] = []
        adapter = start
        for number in range(1, config.rounds + 1):
            record = _round(out / f"round-{number}", number, config, corpus, train, adapter, reporter, scalars)
            records.append(record)
            log(round_line(record))
            adapter = checked_adapter(out / f"round-{number}", record)
        return _summary(config, out, start, start_behaviour, records)


def round_questions(train, number: int, count: int):
    """Round ``number``'s questions: the next ``count`` of the train split, wrapping around it."""
    questions = list(train.questions)
    first = (number - 1) * count
    return [questions[(first + offset) % len(questions)] for offset in range(min(count, len(questions)))]


def _round(directory: Path, number: int, config: RLConfig, corpus, train, adapter: Path | None, reporter, scalars) -> RoundRecord:
    if (directory / ROUND).exists():
        record = _read(directory / ROUND, RoundRecord, "round record", directory)
        sampled_the_questions(directory / SAMPLES, number, round_questions(train, number, config.questions_per_round))
        return record
    directory.mkdir(parents=True, exist_ok=True)
    seconds: dict[str, float] = {}
    started = time.perf_counter()
    questions = round_questions(train, number, config.questions_per_round)
    samples = _sample(directory / SAMPLES, number, config, dataclasses.replace(train, questions=tuple(questions)), adapter, reporter)
    seconds["sampling"] = round(time.perf_counter() - started, 1)
    rewards, batch = round_batch(directory, samples, config)
    started = time.perf_counter()
    figures = _update(directory / UPDATE, number, config, adapter, batch)
    seconds["update"] = round(time.perf_counter() - started, 1)
    started = time.perf_counter()
    trained = directory / UPDATE / ADAPTER
    behaviour = _validate(directory, number, config, corpus, trained, reporter)
    seconds["validation"] = round(time.perf_counter() - started, 1)
    record = _record(number, adapter, samples, rewards, figures, trained, behaviour, seconds)
    with atomic_file(directory / ROUND) as handle:
        handle.write(record.model_dump_json(indent=2))
    scalars(record)
    return record


def _sampling_policy(config: RLConfig, adapter: Path | None, greedy: bool = False):
    updates: dict = {"adapter": adapter}
    if greedy:
        updates["temperature"] = 0.0
    return config.policy.model_copy(update=updates)


def _sample(run: Path, number: int, config: RLConfig, corpus, adapter: Path | None, reporter):
    from paper_explorer.agent.config import EvalConfig
    from paper_explorer.evaluation.run import run_eval
    from paper_explorer.evaluation.run_directory import Run

    if (run / MANIFEST).exists() and not (run / METRICS).exists():
        began_with(run, f"round {number} began sampling", adapter)
    sampling = config.sampling_run()
    eval_config = EvalConfig(
        policy=_sampling_policy(config, adapter),
        episode=sampling.episode.model_copy(update={"seed": config.episode.seed + number}),
        split="train",
        samples=config.group_size,
        ray=config.ray,
    )
    if not (run / METRICS).exists():
        run_eval(run, eval_config, corpus, resume=(run / MANIFEST).exists(), reporter=reporter)
        _release_memory()
    samples = Run.load(run)
    if _failed(samples):  # the sampler failed (a server gone, a bug), not the model: its reward would blame the model
        run_eval(run, eval_config, corpus, resume=True, retry_errors=True, reporter=reporter)
        _release_memory()
        samples = Run.load(run)
        failed = _failed(samples)
        if failed:
            raise TrainingError(
                f"{run}: {len(failed)} episodes ended in policy_error again when retried (the first: {failed[0].outcome.reason}); "
                "a reward would blame the model for the sampler's failure: fix the cause, then run the same command again"
            )
    drawn_with(samples, f"round {number} trains from", adapter)
    return samples


def _failed(samples) -> list:
    return [trajectory for trajectory in samples.trajectories if trajectory.outcome.status == "policy_error"]


def _validate(directory: Path, number: int, config: RLConfig, corpus, adapter: Path | None, reporter) -> Behaviour:
    """Greedy episodes on the first ``validation_episodes`` validation questions with ``adapter``
    (an eval run in ``directory/validation``), as ``explorer train`` validates a checkpoint."""
    if not config.validation_episodes:
        return Behaviour()
    from paper_explorer.agent.config import EvalConfig
    from paper_explorer.evaluation.run import run_eval
    from paper_explorer.evaluation.run_directory import Run

    run = directory / VALIDATION
    if (run / MANIFEST).exists() and not (run / METRICS).exists():
        began_with(run, f"round {number} began validating", adapter)
    if not (run / METRICS).exists():
        policy = _sampling_policy(config, adapter, greedy=True)
        episode = config.episode
        if policy.name != "memory-reader":  # the reader's plan sets its own steps, and its caps are its recipe's
            policy = policy.model_copy(update={"max_new_tokens": config.validation_max_new_tokens})
            episode = episode.model_copy(update={"max_steps": config.validation_max_steps})
        eval_config = EvalConfig(policy=policy, episode=episode, split="validation", limit=config.validation_episodes, ray=config.ray)
        run_eval(run, eval_config, corpus, resume=(run / MANIFEST).exists(), reporter=reporter)
        _release_memory()
    validation = Run.load(run)
    drawn_with(validation, f"round {number} validates", adapter)
    return _behaviour(validation)


def _behaviour(run) -> Behaviour:
    metrics = run.metrics
    steps = [step for trajectory in run.trajectories for step in trajectory.steps]
    before = [s.tool_calls_before_end for s in run.scores if s.status in ("submitted", "abstained")]
    return Behaviour(
        episodes=len(run.scores),
        answer_f1=metrics.answer_f1,
        exact_match=metrics.exact_match,
        direct_submit_rate=metrics.verdict.direct_submit_rate,
        abstention=metrics.abstention,
        tool_calls_before_submit=fmean(before) if before else None,
        format_error_rate=sum(step.format_error for step in steps) / len(steps) if steps else None,
        status=metrics.status,
    )


def _update(directory: Path, number: int, config: RLConfig, adapter: Path | None, batch: list[TrainingSequence]) -> UpdateRecord:
    """The round's update, run unless its result is whole (``rl.update.save`` renames it in place)."""
    not_a_link(directory)
    figures_path = directory / "figures.json"
    if (directory / ADAPTER / "adapter_config.json").exists() and figures_path.exists():
        return _read(figures_path, UpdateRecord, "update figures", directory)
    import torch

    from paper_explorer.rl.update import UpdateRefused, load_trainable, make_optimizer, save, torch_seed, update

    # round 1 starts AdamW afresh (policy.adapter is anyone's); every later round continues the previous round's
    previous_state = adapter.parent / OPTIMIZER if number > 1 and adapter is not None else None
    if previous_state is not None and not previous_state.is_file():
        raise TrainingError(
            f"{previous_state}: missing; it is the optimizer state round {number} continues from: {again(directory.parent / f'round-{number - 1}')}"
        )
    torch.manual_seed(torch_seed(config.episode.seed + number))
    model, _ = load_trainable(config, adapter)
    try:
        optimizer = make_optimizer(model, config, previous_state)
        figures: UpdateFigures = update(model, optimizer, batch, config, config.episode.seed + number)
    except UpdateRefused as error:
        raise TrainingError(f"{directory.parent / 'batch.jsonl'}: round {number}'s update: {error}") from None
    save(model, optimizer, directory)
    record = UpdateRecord(**{k: v for k, v in dataclasses.asdict(figures).items() if k != "seconds"})
    with atomic_file(figures_path) as handle:
        handle.write(record.model_dump_json(indent=2))
    del model, optimizer
    _release_memory()
    return record


def _record(
    number: int, adapter, samples, rewards: list[EpisodeReward], figures: UpdateRecord, trained: Path, behaviour: Behaviour, seconds
) -> RoundRecord:
    from paper_explorer.evaluation.detectors import detector_rates

    by_question: dict[str | None, list[float]] = defaultdict(list)
    for item in rewards:
        by_question[item.question_id].append(item.reward)
    parts = sorted({name for item in rewards for name in item.parts})
    totals = [item.reward for item in rewards]
    scores = samples.scores
    status: dict[str, int] = defaultdict(int)
    for score in scores:
        status[score.status] += 1
    sampled = sum(item.sampled_tokens for item in rewards)
    return RoundRecord(
        round=number,
        sampled_with=str(adapter) if adapter is not None else "base",
        questions=len(by_question),
        episodes=len(rewards),
        groups=len(by_question),
        groups_without_signal=sum(1 for values in by_question.values() if len(set(values)) == 1),
        reward_mean=fmean(totals),
        reward_std=pstdev(totals),
        reward_parts={name: fmean(item.parts[name] for item in rewards) for name in parts},
        advantage_abs_mean=fmean(abs(item.advantage) for item in rewards),
        status=dict(sorted(status.items())),
        detector_rates={k: v for k, v in detector_rates([score.flags for score in scores]).items() if v},
        answer_f1=samples.metrics.answer_f1,
        direct_submit_rate=samples.metrics.verdict.direct_submit_rate,
        sampled_tokens=sampled,
        sampled_tokens_per_episode=sampled / len(rewards),
        steps_per_episode=fmean(score.steps for score in scores),
        update=figures,
        adapter=str(trained),
        adapter_files=file_hashes(trained),
        optimizer_sha256=optimizer_sha256(trained.parent),
        validation=behaviour,
        seconds=seconds,
    )


def _summary(config: RLConfig, out: Path, start: Path | None, start_behaviour: Behaviour, records: list[RoundRecord]) -> RLSummary:
    from paper_explorer.sft.config import TrainConfig
    from paper_explorer.sft.validation import select_checkpoint

    judged = [ValidationRecord(step=0, behaviour=start_behaviour, checkpoint="round-0")]
    judged += [ValidationRecord(step=r.round, behaviour=r.validation, checkpoint=f"round-{r.round}") for r in records]
    rule = TrainConfig(max_direct_submit_rate=config.max_direct_submit_rate, selection_metric=config.selection_metric)
    selection = select_checkpoint(judged, rule) if config.validation_episodes else None
    best = int(selection.best_checkpoint.removeprefix("round-")) if selection and selection.best_checkpoint else None
    # the round's own adapter, where the run is now (round.json keeps where it was written)
    adapter = (
        None if best is None else (str(start) if best == 0 and start else str(out / f"round-{best}" / UPDATE / ADAPTER) if best else None)
    )
    return RLSummary(
        rounds=len(records),
        reward_mean=[r.reward_mean for r in records],
        criterion=selection.criterion.replace("checkpoints", "rounds") if selection else "no validation episodes: no round is selected",
        best_round=best,
        best_adapter=adapter,
        warnings=selection.warnings if selection else [],
    )


def rounds_of(out: Path) -> tuple[RLSummary | None, list[RoundRecord]]:
    """An rl run's summary (None until its last round is done) and its finished rounds, in order."""
    summary = _read(out / SUMMARY, RLSummary, "rl summary", out) if (out / SUMMARY).exists() else None
    records = []
    number = 1
    while (out / f"round-{number}" / ROUND).exists():
        records.append(_read(out / f"round-{number}" / ROUND, RoundRecord, "round record", out / f"round-{number}"))
        number += 1
    return summary, records


def _release_memory() -> None:
    """A round's sampler or trainer model is dropped before the next loads (a GPU holds one at a time)."""
    gc.collect()
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except ImportError:
        pass


def _check_reporter(config: RLConfig, out: Path) -> None:
    from paper_explorer.sft.config import TrainConfig
    from paper_explorer.sft.train import check_reporter

    check_reporter(TrainConfig(report_to=config.report_to), out)


def _read(path: Path, model: type[M], what: str, directory: Path) -> M:
    try:
        return files.read_model(path, model, what=what, inside=directory)
    except files.FileRefused as error:
        raise TrainingError(f"{error}; remove it to run that stage again") from None
