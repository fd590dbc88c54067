"""``explorer eval``: many episodes into a run directory that survives kills and resumes exactly.

RUN_DIR/manifest.json      config, policy, hashes, versions, git commit, hardware (written first)
RUN_DIR/trajectories.jsonl one episode per line, appended whole and fsynced as each one ends
RUN_DIR/metrics.json       answer F1, exact match, abstention table (rewritten at the end)
"""

from __future__ import annotations

import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import List, Optional

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from agent.config import SPLITS, EvalConfig, build_config, dotted, load_config, read_toml
from agent.engine import EpisodeProcesses, EpisodeThreads, raise_descriptor_limit
from agent.environment import git_commit, hardware, versions
from agent.loop import corpus_hashes
from agent.manifest import RunManifest, acting_settings, stranger
from agent.policies import make_policy
from agent.policies.replay import Replay
from agent.runner import EpisodeRunner, sandbox_isolation
from agent.terminal_text import untrusted, visible
from agent.trajectory import Trajectory
from agent.writer import TrajectoryLog, read_log, read_trajectories, read_whole_lines
from cli.errors import UsageError
from cli.options import (
    AdapterOption,
    ApiOption,
    BaseUrlOption,
    ConfigOption,
    ContextCharsOption,
    CorpusOption,
    CpuSecondsOption,
    HostSecondsOption,
    MaxContextOption,
    MaxNewTokensOption,
    MaxStepsOption,
    MemoryMbOption,
    ModelOption,
    ObservationCharsOption,
    OutputCharsOption,
    PolicyOption,
    PromptFormatOption,
    QuantizationOption,
    QuestionsOption,
    RecordPromptIdsOption,
    ReplayOption,
    RetriesOption,
    SeedOption,
    SplitOfOption,
    TemperatureOption,
    ThinkingBudgetOption,
    ThinkingOption,
    TimeoutOption,
    TokenizerOption,
    TopKOption,
    TopPOption,
    WallSecondsOption,
    episode_overrides,
    freeze_loaded_state,
    open_corpus,
    policy_overrides,
    resolve_split,
    select_questions,
    split_of,
)
from cli.run_commands import ReplayOtherCorpusOption, refuse_other_corpus
from corpus import BM25Index
from corpus.atomic import atomic_file
from corpus.collection import questions_sha256
from corpus.jsonl import write_lines

console = Console(stderr=True)

_RUNNER: EpisodeRunner | None = None  # set before the worker pool forks; each worker inherits it


def _run_one(unit) -> Trajectory:
    """One episode: a (question, sample number) pair."""
    assert _RUNNER is not None
    question, sample = unit
    return _RUNNER.run(question.text, question, sample=sample)


def _run_one_in_flight(unit) -> Trajectory:
    """One of many episodes in flight in this process: with the policy's own copy."""
    assert _RUNNER is not None
    question, sample = unit
    return _RUNNER.run(question.text, question, sample=sample, policy=_RUNNER.policy.for_episode())


def eval_command(
    out: Path = typer.Option(..., "--out", "-o", help="Run directory (created; with --resume, finished)."),
    corpus_path: Optional[Path] = CorpusOption,
    questions_path: Optional[Path] = QuestionsOption,
    config_file: Optional[Path] = ConfigOption,
    split: Optional[str] = typer.Option(None, "--split", help=f"Questions of which split: {', '.join(SPLITS)} (default test; all when the corpus has no splits)."),
    policy_name: Optional[str] = PolicyOption,
    limit: Optional[int] = typer.Option(None, "--limit", min=1, help="Only the first N questions of the split."),
    shard: Optional[str] = typer.Option(None, "--shard", help="I/N: only shard I of N, by a hash of the question id (one machine each; explorer merge joins the runs)."),
    resume: bool = typer.Option(False, "--resume", help="Finish an interrupted run in OUT, with the config its manifest holds."),
    samples: Optional[int] = typer.Option(None, "--samples", min=1, max=1000, help="Episodes per question, each with its own seed (pass@k, majority vote; default 1)."),
    api: Optional[str] = ApiOption,
    temperature: Optional[float] = TemperatureOption,
    top_p: Optional[float] = TopPOption,
    top_k: Optional[int] = TopKOption,
    max_consecutive_errors: Optional[int] = typer.Option(None, "--max-consecutive-errors", min=1, help="Stop the run after this many episodes in a row end in policy_error (default 5)."),
    retry_errors: bool = typer.Option(False, "--retry-errors", help="With --resume: run again the episodes that ended in policy_error (they are replaced)."),
    workers: Optional[int] = typer.Option(None, "--workers", "-w", min=1, max=64, help="Processes that run episodes, each with --concurrency in flight (default 1; past one process's interpreter lock)."),
    concurrency: Optional[int] = typer.Option(None, "--concurrency", min=1, max=1024, help="Episodes in flight in each process, each waiting on the server (default 1; for --policy openai, e.g. 256 against vLLM)."),
    max_steps: Optional[int] = MaxStepsOption,
    seed: Optional[int] = SeedOption,
    replay: Optional[Path] = ReplayOption,
    model: Optional[str] = ModelOption,
    adapter: Optional[Path] = AdapterOption,
    quantization: Optional[str] = QuantizationOption,
    max_new_tokens: Optional[int] = MaxNewTokensOption,
    max_context: Optional[int] = MaxContextOption,
    base_url: Optional[List[str]] = BaseUrlOption,
    tokenizer: Optional[Path] = TokenizerOption,
    prompt_format: Optional[str] = PromptFormatOption,
    timeout: Optional[float] = TimeoutOption,
    retries: Optional[int] = RetriesOption,
    thinking: Optional[bool] = ThinkingOption,
    thinking_budget: Optional[int] = ThinkingBudgetOption,
    record_prompt_ids: Optional[bool] = RecordPromptIdsOption,
    observation_chars: Optional[int] = ObservationCharsOption,
    context_chars: Optional[int] = ContextCharsOption,
    wall_seconds: Optional[float] = WallSecondsOption,
    cpu_seconds: Optional[int] = CpuSecondsOption,
    host_seconds: Optional[float] = HostSecondsOption,
    memory_mb: Optional[int] = MemoryMbOption,
    output_chars: Optional[int] = OutputCharsOption,
    preregistration: Optional[Path] = typer.Option(
        None, "--preregistration", help="TOML with frozen hashes and a pass rule (explorer preregister writes one)."),
    split_of_values: Optional[List[str]] = SplitOfOption,
    replay_other_corpus: bool = ReplayOtherCorpusOption,
) -> None:
    """Run a policy on every question of a split; write trajectories, a manifest and metrics.

    Settings come from --config (TOML), then the flags; `--out RUN --resume` reads them from the
    run's manifest, so nothing needs repeating (a flag that differs from it is refused)."""
    _check_out(out)
    if retry_errors and not resume:
        raise UsageError("--retry-errors re-runs a run's failed episodes; use it with --out RUN --resume")
    overrides = {"split": split, "split_of": split_of(split_of_values), "limit": limit, "shard": shard, "workers": workers, "concurrency": concurrency,
                 "max_consecutive_errors": max_consecutive_errors, "samples": samples,
                 "preregistration": preregistration} | policy_overrides(
        name=policy_name, replay=replay, model=model, adapter=adapter, quantization=quantization, max_new_tokens=max_new_tokens,
        max_context=max_context, base_url=base_url, tokenizer=tokenizer, prompt_format=prompt_format, timeout=timeout, retries=retries,
        thinking=thinking, thinking_budget=thinking_budget, api=api, temperature=temperature, top_p=top_p, top_k=top_k,
    ) | episode_overrides(
        max_steps=max_steps, seed=seed, observation_chars=observation_chars, context_chars=context_chars,
        wall_seconds=wall_seconds, cpu_seconds=cpu_seconds, memory_mb=memory_mb, output_chars=output_chars,
        record_prompt_ids=record_prompt_ids, host_seconds=host_seconds,
    )
    manifest = _read_manifest(out) if resume else None
    config = _resolve_config(config_file, overrides, manifest)
    if manifest is not None:
        _refuse_changed_config(out, config, manifest)
    run_eval(out, config, open_corpus(corpus_path or recorded_corpus(manifest), questions_path, config.split_of or None), resume,
             retry_errors, replay_other_corpus)


def run_eval(out: Path, config: EvalConfig, corpus, resume: bool, retry_errors: bool = False, replay_other_corpus: bool = False) -> None:
    """The run; with --policy openai --adapter, the adapter is loaded into the server under a name
    of this run's (agent.policies.adapters) before the preflight, and unloaded when the run ends."""
    if config.policy.name != "openai" or config.policy.adapter is None or config.policy.api == "chat":
        return _run_eval(out, config, corpus, resume, retry_errors, replay_other_corpus)  # make_policy refuses what does not fit
    from agent.policies.adapters import ServerAdapters, checked_adapter, planned_adapter, run_id

    given, recorded = config.policy.adapter, config.policy.served_adapter  # recorded: from the manifest, on --resume
    served = checked_adapter(given, recorded) if recorded is not None else planned_adapter(given, run_id(out))
    config = config.model_copy(update={"policy": config.policy.model_copy(update={"served_adapter": served})})
    if not config.policy.base_url:
        return _run_eval(out, config, corpus, resume, retry_errors, replay_other_corpus)  # make_policy says what is missing
    with ServerAdapters(config.policy.base_url, config.policy.timeout, say=_say_note) as adapters:
        _run_eval(out, config, corpus, resume, retry_errors, replay_other_corpus, adapters)


def _say_note(line: str) -> None:
    console.print(untrusted(line, style="yellow"))  # it may quote the server


def _run_eval(out: Path, config: EvalConfig, corpus, resume: bool, retry_errors: bool = False, replay_other_corpus: bool = False,
              adapters=None) -> None:
    """The run, in named steps: check, write the manifest, run what is missing, score."""
    prereg = _load_preregistration(config)
    if config.policy.name == "hf" and (config.workers > 1 or config.concurrency > 1):
        raise UsageError("--policy hf runs one episode at a time (one model in memory); for parallel episodes serve the model and use --policy openai")
    policy = make_policy(config.policy, config.episode.max_steps)
    if config.samples > 1 and config.policy.temperature == 0:  # allowed: it measures how deterministic a policy is
        console.print(f"[yellow]note: --samples {config.samples} with a deterministic policy or greedy decoding: its samples "
                      "repeat one episode wherever the policy is deterministic; sample a model policy with --temperature[/yellow]")
    refuse_other_corpus(policy, corpus.papers_sha256, replay_other_corpus)
    config = config.model_copy(update={"split": resolve_split(corpus, config.split, "test")})  # the manifest records which
    recorded_questions = policy.questions() if isinstance(policy, Replay) else None
    questions = select_questions(corpus, config.split, config.limit, recorded_questions, shard=config.shard)
    selected_sha256 = questions_sha256(questions)
    if prereg is not None:  # frozen for the whole run: a shard checks the selection it is a slice of
        whole = questions if config.shard is None else select_questions(corpus, config.split, config.limit, recorded_questions)
        _check_preregistration(prereg, config.preregistration, corpus, questions_sha256(whole), len(whole))
        if config.shard is not None:
            console.print(f"note: the preregistered rule is judged on the whole run, once explorer merge has joined the shards; "
                          f"not on shard {config.shard} alone")
            prereg = None
    recorded = {**config.model_dump(mode="json"), "questions": len(questions), "selected_questions_sha256": selected_sha256}
    hashes = corpus_hashes(corpus).model_dump()
    manifest_path, log_path = out / "manifest.json", out / "trajectories.jsonl"
    _check_run_directory(out, manifest_path, log_path, resume, recorded, hashes)
    units = [(q, sample) for q in questions for sample in range(config.samples)]
    latest = _logged_episodes(out, log_path) if resume else {}
    done = {key for key, t in latest.items() if not (retry_errors and t.outcome.status == "policy_error")}
    remaining = [(q, sample) for q, sample in units if (q.id, sample) not in done]
    if config.concurrency > 1:
        raise_descriptor_limit(config.concurrency, len(config.policy.base_url or ()) or 1)
    if not remaining:
        console.print("note: every episode is written; the policy's server is not asked")  # rescoring needs no server
    else:
        if adapters is not None:  # before the preflight, which then finds the adapter's name served
            adapters.load(config.policy.served_adapter)
        note = policy.preflight()  # a dead or wrong server is one line now, not a policy_error per episode, and writes nothing
        if note:
            console.print(untrusted(f"note: {note}", style="yellow"))  # it may quote the server
    _make_run_directory(out)
    index = BM25Index.cached(corpus)
    if not manifest_path.exists():
        write_manifest(manifest_path, corpus, recorded, hashes, sandbox_isolation(corpus, index, config.episode))
    global _RUNNER
    _RUNNER = EpisodeRunner(corpus, index, policy, config.episode)
    freeze_loaded_state()
    with TrajectoryLog(log_path) as log:  # cuts off the torn last line that reading the log stepped around
        if log.torn_bytes:
            console.print(f"[yellow]removed a torn last line ({log.torn_bytes} bytes) left by the interrupted run[/yellow]")
        if resume:
            retried = len(set(latest) - done)
            console.print(f"resuming: {len(units) - len(remaining)} of {len(units)} episodes already written"
                          + (f"; {retried} that ended in policy_error run again" if retry_errors else ""))
        stopped = _run_all(remaining, config, log, len(units) - len(remaining), len(units))
    superseded = drop_superseded_errors(log_path)
    if superseded:
        console.print(f"replaced {superseded} episodes that had ended in policy_error")
    if stopped is not None:
        typer.echo(f"error: stopped after {config.max_consecutive_errors} consecutive episodes ended in policy_error (last: "
                   f"{visible(stopped)}); fix the policy's server, then run explorer eval --out {out} --resume --retry-errors", err=True)
        raise typer.Exit(1)

    metrics = write_metrics(out, questions, index, (prereg, config.preregistration) if prereg else None)
    if metrics.episodes and metrics.status.get("policy_error", 0) == metrics.episodes:  # fewer than --max-consecutive-errors
        typer.echo(f"error: every episode ({metrics.episodes}) ended in policy_error, so nothing was measured; see the reasons "
                   f"with explorer inspect {out} --flag no_answer, fix the policy or its server (a server that takes no token "
                   f"ids needs --api chat or --prompt-format text), then run explorer eval --out {out} --resume --retry-errors", err=True)
        raise typer.Exit(1)
    if metrics.preregistration is not None and not metrics.preregistration.passed:
        failed = ", ".join(f"{c.check} = {c.value}" for c in metrics.preregistration.checks if not c.passed)
        typer.echo(f"error: the preregistered rule of {config.preregistration} FAILED ({failed}); see {out / 'metrics.json'}", err=True)
        raise typer.Exit(1)


def _logged_episodes(out: Path, log_path: Path) -> dict[tuple, Trajectory]:
    """The latest episode the log holds per (question, sample), each line checked to be an
    episode of this run: a line from another run would be kept and scored as this one's."""
    if not log_path.exists():
        return {}
    manifest = _read_manifest(out)
    numbered, _ = read_whole_lines(log_path)  # a torn last line is cut off when the log is opened
    settings = acting_settings(numbered[0][1]) if numbered else None
    for number, trajectory in numbered:
        reason = stranger(trajectory, manifest, settings)
        if reason is not None:
            raise UsageError(f"{log_path}:{number}: not an episode of this run: {reason}; remove that line, or start "
                             "a new run with another --out")
    return {(t.question_id, t.sample): t for _, t in numbered}


# Fields of a manifest's config that the run derived rather than was given.
DERIVED_FIELDS = ("questions", "selected_questions_sha256")
# How episodes are run, not which or how they go: a resumed run may change them.
EXECUTION_FIELDS = ("workers", "concurrency")


def _resolve_config(config_file: Optional[Path], overrides: dict, manifest: RunManifest | None) -> EvalConfig:
    """A new run: --config, then the flags. A resumed one: its manifest's config, then --config and
    the flags (anything they change is refused later, when the configs are compared)."""
    if manifest is None:
        return load_config(EvalConfig, config_file, overrides)
    recorded = _recorded_config(manifest)
    from_file = dotted(read_toml(config_file)) if config_file is not None else {}
    given = {key: value for key, value in overrides.items() if value is not None}
    return build_config(EvalConfig, recorded, from_file | given, "manifest.json")


def _refuse_changed_config(out: Path, config: EvalConfig, manifest: RunManifest) -> None:
    """On --resume, a flag or file that changes the run's config is named before anything is loaded."""
    then = _recorded_config(manifest)
    now = config.model_dump(mode="json")
    changed = sorted(key for key in set(now) | set(then) if now.get(key) != then.get(key) and key not in EXECUTION_FIELDS)
    if changed:
        raise UsageError(f"{out}: refusing to resume: the config differs from the run's manifest ({', '.join(changed)}); "
                         "use the original settings, or start a new run with another --out")


def _recorded_config(manifest: RunManifest) -> dict:
    """The manifest's config without what the run derived; fields added since it was written
    have their defaults (the model filled them in), so that an older run still resumes."""
    return manifest.config.model_dump(mode="json", exclude=set(DERIVED_FIELDS))


def recorded_corpus(manifest: RunManifest | None) -> Optional[Path]:
    """On --resume without --corpus: the corpus file the run recorded, or None for the generated
    demo corpus (its hash is checked all the same)."""
    sources = manifest.corpus if manifest is not None else []
    if not sources or any(source.startswith(DEMO_SOURCE_PREFIX) for source in sources):
        return None
    missing = [source for source in sources if not Path(source).exists()]
    if missing:
        raise UsageError(f"the run's corpus {missing[0]} is gone; pass --corpus with the same corpus (its hash is checked)")
    if len(sources) == 1:
        return Path(sources[0])
    folder = Path(sources[0]).parent  # a directory corpus records its files
    if all(Path(source).parent == folder for source in sources):
        return folder
    raise UsageError(f"the run's corpus was {len(sources)} files in several folders; pass --corpus with the same corpus")


DEMO_SOURCE_PREFIX = "demo("  # how a generated corpus names its source (corpus.demo)


def _load_preregistration(config: EvalConfig):
    if config.preregistration is None:
        return None
    from evaluation import prereg as preregistering

    return preregistering.load(config.preregistration)


def _check_preregistration(prereg, path: Path, corpus, selected_sha256: str, questions: int) -> None:
    from evaluation import prereg as preregistering

    preregistering.check_frozen(prereg, path, corpus.papers_sha256, selected_sha256, questions)
    if prereg.comparison is not None:  # a missing comparison fails now, not after the run
        preregistering.comparison_table(prereg, path)


def write_manifest(path: Path, corpus, config: dict, hashes: dict, isolation: str) -> None:
    manifest = RunManifest(
        created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"), command=sys.argv[1:],
        corpus=[str(Path(s).resolve()) if Path(s).exists() else str(s) for s in corpus.sources], config=config, hashes=hashes, isolation=isolation,
        versions=versions(), git_commit=git_commit(), hardware=hardware(),
    )
    with atomic_file(path) as handle:
        handle.write(manifest.model_dump_json(indent=2))


RUN_FILES = ("manifest.json", "trajectories.jsonl", "scores.jsonl", "metrics.json")


def _check_out(out: Path) -> None:
    if out == Path("."):
        raise UsageError("--out names the run directory to write; give one other than the current directory")
    if out.exists() and not out.is_dir():
        raise UsageError(f"{out}: is a file; --out names a run directory")
    for name in RUN_FILES:
        if (out / name).is_dir():
            raise UsageError(f"{out / name}: is a directory where the run's file belongs; choose another --out")


def _make_run_directory(out: Path) -> None:
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise UsageError(f"{out}: cannot create the run directory ({error.strerror})") from None


def _read_manifest(out: Path) -> RunManifest:
    """The run's manifest, checked against its schema."""
    manifest_path = out / "manifest.json"
    if not manifest_path.exists():
        raise UsageError(f"{out}: no manifest.json, so there is no run to resume; drop --resume to start one")
    try:
        manifest = RunManifest.model_validate_json(manifest_path.read_bytes())
    except OSError as error:
        raise UsageError(f"{manifest_path}: cannot be read ({error.strerror}); this run directory cannot be resumed") from None
    except ValidationError as error:
        first = error.errors(include_url=False)[0]
        where = ".".join(str(part) for part in first["loc"]) or "manifest"
        raise UsageError(f"{manifest_path}: not a run manifest this version can resume (field '{where}': {first['msg']}); "
                         "start a new run with another --out") from None
    return manifest


def _check_run_directory(out: Path, manifest_path: Path, log_path: Path, resume: bool, config: dict, hashes: dict) -> None:
    if not resume:
        if manifest_path.exists() or log_path.exists():
            raise UsageError(f"{out}: already holds a run; pass --resume to finish it, or choose another --out")
        return
    manifest = _read_manifest(out)
    recorded = manifest.config.model_dump(mode="json")  # fields added since it was written: their defaults
    recorded.update({key: config[key] for key in EXECUTION_FIELDS if key in config})  # a resumed run may run them otherwise
    for name, now, then in (("corpus or prompt hashes", hashes, manifest.hashes.model_dump()), ("config", config, recorded)):
        if now != then:
            keys = sorted(k for k in set(now) | set(then or {}) if now.get(k) != (then or {}).get(k))
            raise UsageError(
                f"{out}: refusing to resume: the {name} differ from the run's manifest ({', '.join(keys)}); "
                "use the original settings, or start a new run with another --out"
            )


def _run_all(units: list, config: EvalConfig, log: TrajectoryLog, already: int, total: int) -> str | None:
    """Run and log every question; stop early, returning the last error, after
    ``max_consecutive_errors`` policy errors in a row (a server that is down fails every episode
    the same way). Episodes run one at a time, ``concurrency`` in flight in this process, or in
    ``workers`` forked processes with ``concurrency`` in flight in each (agent.engine); this process
    alone writes the log."""
    columns = (TextColumn("episodes"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn())
    errors, max_errors = 0, config.max_consecutive_errors
    run_one = _run_one_in_flight if config.concurrency > 1 else _run_one
    if len(units) <= 1 or (config.workers == 1 and config.concurrency == 1):
        batches = ([_run_one(unit)] for unit in units)
    elif config.workers == 1:
        batches = EpisodeThreads(run_one, config.concurrency).run_batches(units)
    else:  # forked before the progress bar's thread starts: the processes inherit the corpus, index and policy
        batches = EpisodeProcesses(run_one, config.workers, config.concurrency).run_batches(units)
    with Progress(*columns, console=console, transient=False) as progress:
        task = progress.add_task("episodes", total=total, completed=already)
        try:
            for batch in batches:
                log.append_all(batch)  # whatever finished is kept, even past a stop
                progress.advance(task, len(batch))
                for trajectory in batch:
                    errors = errors + 1 if trajectory.outcome.status == "policy_error" else 0
                    if errors >= max_errors:  # what is still in flight runs again on resume
                        return trajectory.outcome.reason or "policy_error"
        finally:
            if hasattr(batches, "close"):
                batches.close()  # stops the episode threads from starting more, kills the episode processes
    return None


def drop_superseded_errors(log_path: Path) -> int:
    """Rewrite the log (whole, atomically) without policy_error episodes that a later line of the
    same question and sample replaced; returns how many were dropped. A crash before this leaves
    both lines, and the scoring keeps the later one all the same. Lines are handled as bytes,
    exactly as the log's reader splits them (text may hold U+2028, which str.splitlines splits)."""
    logged, _ = read_log(log_path)  # each line with its bytes, from one read: kept lines are copied as written
    last = {(r.value.question_id, r.value.sample): r.number for r in logged}
    dropped = {r.number for r in logged
               if r.value.outcome.status == "policy_error" and last[(r.value.question_id, r.value.sample)] > r.number}
    if not dropped:
        return 0
    write_lines(log_path, (r.data for r in logged if r.number not in dropped))
    return len(dropped)


def write_metrics(out: Path, questions: list, index: BM25Index, prereg, shown: bool = True):
    """scores.jsonl (one line per episode: metrics and flags) and metrics.json, both written whole."""
    from evaluation.retrieval import retrieval_metrics
    from evaluation.scoring import model_metrics, run_metrics, score_episode

    trajectories = read_trajectories(out / "trajectories.jsonl")
    by_id = {q.id: q for q in questions}
    last = {(t.question_id, t.sample): position for position, t in enumerate(trajectories)}
    seen: set[tuple] = set()
    unique = []
    for position, trajectory in enumerate(trajectories):  # a question's sample is scored once, whatever the log holds
        key = (trajectory.question_id, trajectory.sample)
        superseded = trajectory.outcome.status == "policy_error" and last[key] > position
        if trajectory.question_id in by_id and key not in seen and not superseded:
            seen.add(key)
            unique.append(trajectory)
    scores = [score_episode(t, by_id[t.question_id]) for t in unique]
    metrics = run_metrics(scores).model_copy(update={
        **model_metrics(unique), "duplicate_lines": len(trajectories) - len(unique), "retrieval": retrieval_metrics(index, questions),
    })
    if prereg is not None:
        from evaluation.prereg import judge

        metrics = metrics.model_copy(update={"preregistration": judge(prereg[0], prereg[1], metrics.abstention)})
    with atomic_file(out / "scores.jsonl") as handle:
        handle.writelines(score.model_dump_json() + "\n" for score in scores)
    with atomic_file(out / "metrics.json") as handle:
        handle.write(metrics.to_json())
    if shown:
        from evaluation.summary import print_summary

        print_summary(Console(), metrics, out)
    return metrics
