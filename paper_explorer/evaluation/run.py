"""``explorer eval`` as a function: many episodes into a run directory that survives kills and resumes exactly.

    from paper_explorer import EvalConfig, evaluate
    run = evaluate(EvalConfig(limit=20), out="runs/demo")  # the demo corpus, the scripted policy
    run.metrics.answer_f1, run.to_pandas()

The steps, in order: check the directory (a new run, or the run being resumed; never a
directory of another kind), select the questions, check the preregistration, write the
manifest (first, before any episode), run what the log does not hold yet - one at a time, in
threads or in forked processes (``agent.engine``), this process alone appending to the log -
drop the failures a retry replaced, and score (scores.jsonl and metrics.json, written whole).
Which log line counts is ``evaluation.run_directory``'s rule; what a resume checks is
``evaluation.resume``'s.

While it runs it speaks through a ``Reporter`` (``evaluation.run_events``). ``run_eval`` returns
the metrics, ``evaluate`` the ``Run``; Ctrl-C raises ``EvaluationInterrupted`` (what finished is
kept; ``resume`` runs the rest); a run that measured nothing, stopped on policy errors or failed
its preregistered rule raises ``EvaluationFailed``; bad input is one ``EvaluationError``,
``AgentError`` or ``CorpusError`` line.

Why one module of this size: its steps are one procedure whose order is the guarantee (the
manifest before any episode, the log before the scores); split, that order would live nowhere.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from paper_explorer.agent.config import EvalConfig
from paper_explorer.agent.engine import EpisodeProcesses, EpisodeThreads, raise_descriptor_limit
from paper_explorer.agent.loop import corpus_hashes
from paper_explorer.agent.manifest import RecordedEvalConfig
from paper_explorer.agent.policies import Policy, make_policy
from paper_explorer.agent.policies.replay import Replay
from paper_explorer.agent.policies.settings import ServerSettings, server_urls
from paper_explorer.agent.probes import check_probes, load_probes
from paper_explorer.agent.runner import EpisodeRunner, sandbox_isolation
from paper_explorer.agent.trajectory import Trajectory
from paper_explorer.agent.writer import TrajectoryLog
from paper_explorer.corpus import BM25Index, Corpus, DemoConfig, generate, load
from paper_explorer.corpus.collection import questions_sha256
from paper_explorer.corpus.loading import with_questions
from paper_explorer.corpus.selection import resolve_split, select_questions
from paper_explorer.corpus.setting_names import setting
from paper_explorer.evaluation.errors import EvaluationError
from paper_explorer.evaluation.records import RunMetrics
from paper_explorer.evaluation.resume import check_out, check_resumable, logged_episodes, recorded_corpus, resume_command, resumed_manifest
from paper_explorer.evaluation.run_directory import (
    MANIFEST,
    METRICS,
    TRAJECTORIES,
    Run,
    comparison_run,
    read_manifest,
    settle_log,
    write_manifest,
    write_metrics,
)
from paper_explorer.evaluation.run_events import EvaluationFailed, EvaluationInterrupted, LogReporter, Reporter

if TYPE_CHECKING:
    from paper_explorer.evaluation.prereg import Preregistered
    from paper_explorer.evaluation.ray_tasks import RayCluster

__all__ = [
    "EvaluationFailed",
    "EvaluationInterrupted",
    "LogReporter",
    "Reporter",
    "settle_log",
    "evaluate",
    "load_corpus",
    "recorded_corpus",
    "refuse_other_corpus",
    "run_eval",
    "write_metrics",
]

log = logging.getLogger(__name__)  # load warnings; the run's notes go to its reporter


def evaluate(
    config: EvalConfig,
    *,
    out: str | Path,
    corpus: Corpus | str | Path | None = None,
    questions: str | Path | None = None,
    resume: bool = False,
    retry_errors: bool = False,
    replay_other_corpus: bool = False,
    reporter: Reporter | None = None,
) -> Run:
    """Run ``config``'s policy on every selected question of ``corpus``; write the run to ``out``; return it.

    ``corpus``: a loaded ``Corpus``, a corpus file or directory, or None for the generated demo
    corpus - on ``resume``, None means the corpus the run recorded (its hash is checked either
    way). ``questions``: a JSONL file of questions that replaces the corpus's own.
    ``resume`` finishes an interrupted run in ``out`` (``config`` must be the one its manifest
    holds, but for workers and concurrency); ``retry_errors`` runs its policy_error episodes
    again. ``replay_other_corpus`` lets a replay run on another corpus than its recording's."""
    out = Path(out)
    check_out(out, resume)
    if retry_errors and not resume:
        raise EvaluationError("retry_errors re-runs a run's failed episodes; use it with resume")
    if corpus is None and resume:
        corpus = recorded_corpus(resumed_manifest(out))
    loaded = load_corpus(corpus, questions, config.split_of or None)
    run_eval(
        out,
        config,
        loaded,
        resume,
        retry_errors,
        replay_other_corpus,
        questions_file=Path(questions) if questions is not None else None,
        reporter=reporter,
    )
    return Run.load(out)


def load_corpus(source: Corpus | str | Path | None, questions: str | Path | None = None, split_of: dict[str, str] | None = None) -> Corpus:
    """The corpus a run asks: a loaded one as it is, a file or directory loaded, or the demo corpus
    (None); ``questions`` replaces its questions. Load warnings are logged, counted by kind."""
    if isinstance(source, Corpus):
        corpus = source if questions is None else with_questions(source, questions)
    elif source is None:
        if split_of:
            raise EvaluationError(f"{setting('split_of')} names files of a {setting('corpus')}; the demo corpus has its own splits")
        corpus = generate(DemoConfig())
        corpus = corpus if questions is None else with_questions(corpus, questions)
    else:
        corpus = load(source, questions, split_of)
    counts = corpus.warning_counts()
    if counts:
        shown = ", ".join(f"{kind}: {n}" for kind, n in sorted(counts.items()))
        log.warning("%d load warnings (%s); first: %s", len(corpus.warnings), shown, corpus.warnings[0])
    return corpus


_RUNNER: EpisodeRunner | None = None  # set before the worker pool forks; each worker inherits it


@contextlib.contextmanager
def _running(runner: EpisodeRunner) -> Iterator[None]:
    """``runner`` is the one the episodes use (and the processes forked for them inherit) while the
    loop runs; dropped after, so that the corpus, its index and their episode hosts can go."""
    global _RUNNER
    _RUNNER = runner
    try:
        yield
    finally:
        _RUNNER = None


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


def run_eval(
    out: Path,
    config: EvalConfig,
    corpus: Corpus,
    resume: bool,
    retry_errors: bool = False,
    replay_other_corpus: bool = False,
    *,
    questions_file: Path | None = None,
    reporter: Reporter | None = None,
) -> RunMetrics:
    """The run on a loaded corpus; returns its metrics. With ``--policy openai --adapter``, the
    adapter is loaded into the server under a name of this run's (``agent.policies.adapters``)
    before the preflight, and unloaded when the run ends. ``questions_file`` only completes the
    resume command that errors quote."""
    reporter = reporter if reporter is not None else LogReporter()
    run = _Run(out, corpus, resume, retry_errors, replay_other_corpus, questions_file, reporter)
    policy = config.policy
    if not isinstance(policy, ServerSettings) or policy.serving != "openai" or policy.adapter is None or policy.api == "chat":
        return run.start(config)  # make_policy refuses what does not fit
    from paper_explorer.agent.policies.adapters import ServerAdapters, checked_adapter, planned_adapter, run_id

    given, recorded = policy.adapter, policy.served_adapter  # recorded: from the manifest, on resume
    served = checked_adapter(given, recorded) if recorded is not None else planned_adapter(given, run_id(out))
    config = config.model_copy(update={"policy": policy.model_copy(update={"served_adapter": served})})
    if not policy.base_url:
        return run.start(config)  # make_policy says what is missing
    with ServerAdapters(policy.base_url, policy.timeout, say=lambda line: reporter.note(line.removeprefix("note: "))) as adapters:
        return run.start(config, load_adapter=lambda: adapters.load(served))


class _Run:
    """One call of ``run_eval``: what it was given, and its steps."""

    def __init__(
        self,
        out: Path,
        corpus: Corpus,
        resume: bool,
        retry_errors: bool,
        replay_other_corpus: bool,
        questions_file: Path | None,
        reporter: Reporter,
    ) -> None:
        self.out, self.corpus, self.resume, self.retry_errors = out, corpus, resume, retry_errors
        self.replay_other_corpus, self.reporter = replay_other_corpus, reporter
        self.again = resume_command(out, questions_file, retry_errors=True)  # what the failures advise

    def start(self, config: EvalConfig, load_adapter: Callable[[], None] | None = None) -> RunMetrics:
        """Check, select, write the manifest, run what is missing, score."""
        out = self.out
        check_out(out, self.resume)
        prereg = _load_preregistration(config)
        policy = self._policy(config)
        check_probes(
            config.episode.probes, policy, path=config.episode.probes_file
        )  # an unknown probe, or a policy without a model: before anything is written
        config, questions = self._selected(config, policy)
        if prereg is not None:
            prereg = self._checked_preregistration(prereg, config, questions, policy)
        recorded = RecordedEvalConfig.model_validate(
            {**config.model_dump(), "questions": len(questions), "selected_questions_sha256": questions_sha256(questions)}
        )
        hashes = corpus_hashes(self.corpus, policy)
        if self.resume:
            check_resumable(out, recorded, hashes)
        units = [(q, sample) for q in questions for sample in range(config.samples)]
        latest = logged_episodes(out) if self.resume else {}
        _refuse_other_probes(out, config, latest.values())
        done = {key for key, t in latest.items() if not (self.retry_errors and t.outcome.status == "policy_error")}
        remaining = [(q, sample) for q, sample in units if (q.id, sample) not in done]
        with contextlib.ExitStack() as connected:  # a Ray connection is closed however the run ends
            cluster = self._ready(config, policy, remaining, load_adapter)
            if cluster is not None:
                connected.callback(cluster.close)
            _make_run_directory(out)
            index = BM25Index.cached(self.corpus)
            if not (out / MANIFEST).exists():
                write_manifest(out / MANIFEST, self.corpus, recorded, hashes, sandbox_isolation(self.corpus, index, config.episode))
            # The log's opening cuts off the torn last line that reading it stepped around.
            with (
                _running(EpisodeRunner(self.corpus, index, policy, config.episode)),
                loaded_state_frozen(),
                TrajectoryLog(out / TRAJECTORIES) as trajectory_log,
            ):
                if trajectory_log.torn_bytes:
                    self.reporter.note(f"removed a torn last line ({trajectory_log.torn_bytes} bytes) left by the interrupted run")
                if self.resume:
                    self.reporter.say(
                        f"resuming: {len(units) - len(remaining)} of {len(units)} episodes already written"
                        + (f"; {len(set(latest) - done)} that ended in policy_error run again" if self.retry_errors else "")
                    )
                stopped = self._run_all(remaining, config, trajectory_log, len(units) - len(remaining), len(units), cluster)
        whole = [(question.id, sample) for question, sample in units] if stopped is None else None  # put in order once whole
        replaced = settle_log(out, whole)
        if replaced:
            self.reporter.say(f"replaced {replaced} episodes that had ended in policy_error")
        if stopped is not None:
            culprit = (
                "the policy's server" if config.policy.serving == "openai" else "the policy"
            )  # only a served one has a server to blame
            raise EvaluationFailed(
                f"stopped after {config.max_consecutive_errors} consecutive episodes ended in policy_error "
                f"(last: {stopped}); fix {culprit}, then run {self.again}",
                out,
            )
        return self._scored(out, config, questions, index, prereg)

    def _policy(self, config: EvalConfig) -> Policy:
        if config.ray is not None and config.workers > 1:
            raise EvaluationError(
                f"{setting('workers', config.workers)} forks processes on this machine; with {setting('ray')} the cluster's "
                f"nodes run the episodes, one task per CPU: leave {setting('workers')} out (or 1)"
            )
        if config.policy.serving == "hf" and (config.workers > 1 or config.concurrency > 1):
            raise EvaluationError(
                f"{setting('policy.name', config.policy.name)} with its model in this process (hf) runs one episode at a time; "
                "for parallel episodes serve the model and use openai"
            )
        policy = make_policy(config.policy, config.episode.max_steps)
        if config.samples > 1 and config.policy.greedy:  # allowed: it measures how deterministic a policy is
            self.reporter.note(
                f"{setting('samples', config.samples)} with a deterministic policy or greedy decoding: its samples repeat "
                f"one episode wherever the policy is deterministic; sample a model policy with {setting('policy.temperature')}"
            )
        refuse_other_corpus(policy, self.corpus.papers_sha256, self.replay_other_corpus)
        return policy

    def _selected(self, config: EvalConfig, policy: Policy) -> tuple[EvalConfig, list]:
        """The config with the split that runs (the manifest records which), and the questions it asks."""
        config = config.model_copy(update={"split": resolve_split(self.corpus, config.split, "test", note=self.reporter.note)})
        recorded = policy.questions() if isinstance(policy, Replay) else None
        return config, select_questions(self.corpus, config.split, config.limit, recorded, shard=config.shard, note=self.reporter.note)

    def _checked_preregistration(self, prereg: Preregistered, config: EvalConfig, questions: list, policy: Policy) -> Preregistered | None:
        """The rule, frozen for the whole run: a shard checks the selection it is a slice of, and
        leaves the judging to the merged run (None)."""
        if config.shard is None:
            _check_preregistration(prereg, self.corpus, questions_sha256(questions), len(questions))
            return prereg
        recorded = policy.questions() if isinstance(policy, Replay) else None
        whole = select_questions(self.corpus, config.split, config.limit, recorded, note=_unsaid)
        _check_preregistration(prereg, self.corpus, questions_sha256(whole), len(whole))
        self.reporter.note(
            f"the preregistered rule is judged on the whole run, once explorer merge has joined the shards; "
            f"not on shard {config.shard} alone"
        )
        return None

    def _ready(self, config: EvalConfig, policy: Policy, remaining: list, load_adapter: Callable[[], None] | None) -> RayCluster | None:
        """The policy's server asked once before any episode (a dead or wrong server is one line now,
        not a policy_error per episode, and writes nothing); not asked when nothing is left to run.
        With ``ray``, the cluster connected to (the same: one line, nothing written)."""
        if config.concurrency > 1 and config.ray is None:
            raise_descriptor_limit(config.concurrency, len(server_urls(config.policy)) or 1)
        if not remaining:
            self.reporter.note("every episode is written; the policy's server is not asked")  # rescoring needs no server
            return None
        if load_adapter is not None:  # before the preflight, which then finds the adapter's name served
            load_adapter()
        preflight = policy.preflight()
        if preflight:
            self.reporter.note(preflight)
        if config.ray is None:
            return None
        from paper_explorer.agent.policies.servers import sends_key
        from paper_explorer.evaluation.ray_tasks import RayCluster

        cluster = RayCluster(config.ray, send_key=config.policy.serving == "openai" and sends_key())
        cluster.connect()
        return cluster

    def _scored(self, out: Path, config: EvalConfig, questions: list, index: BM25Index, prereg: Preregistered | None) -> RunMetrics:
        metrics = write_metrics(out, questions, index, prereg)
        if metrics.episodes and metrics.status.get("policy_error", 0) == metrics.episodes:  # fewer than --max-consecutive-errors
            server = (  # only a served policy has a server to blame
                f" or its server (a server that takes no token ids needs {setting('policy.api', 'chat')} "
                f"or {setting('policy.prompt_format', 'text')})"
                if config.policy.serving == "openai"
                else ""
            )
            raise EvaluationFailed(
                f"every episode ({metrics.episodes}) ended in policy_error, so nothing was measured; see the reasons with "
                f"explorer inspect {out} --flag no_answer, fix the policy{server}, "
                f"then run {self.again}",
                out,
                metrics,
            )
        if metrics.preregistration is not None and not metrics.preregistration.passed:
            failed = ", ".join(f"{c.check} = {c.value}" for c in metrics.preregistration.checks if not c.passed)
            raise EvaluationFailed(
                f"the preregistered rule of {config.preregistration} FAILED ({failed}); see {out / METRICS}", out, metrics
            )
        return metrics

    def _run_all(
        self, units: list, config: EvalConfig, trajectory_log: TrajectoryLog, already: int, total: int, cluster: RayCluster | None
    ) -> str | None:
        """Run and log every unit; stop early, returning the last error, after
        ``max_consecutive_errors`` policy errors in a row (a server that is down fails every episode
        the same way). Episodes run one at a time, ``concurrency`` in flight in this process, or in
        ``workers`` forked processes with ``concurrency`` in flight in each (agent.engine); this
        process alone writes the log. Ctrl-C raises ``EvaluationInterrupted`` with what was written."""
        errors, max_errors, written = 0, config.max_consecutive_errors, already
        run_one = _run_one_in_flight if config.concurrency > 1 else _run_one
        batches: Generator[list[Trajectory], None, None]
        if cluster is not None:  # the nodes run them; their isolation must be the manifest's
            from paper_explorer.evaluation.ray_tasks import driver_identity

            identity = driver_identity(read_manifest(self.out).isolation)
            batches = cluster.run_batches(units, self.corpus, config, identity)
        elif len(units) <= 1 or (config.workers == 1 and config.concurrency == 1):
            batches = ([_run_one(unit)] for unit in units)
        elif config.workers == 1:
            batches = EpisodeThreads(run_one, config.concurrency).run_batches(units)
        else:  # forked before a progress bar's thread starts: the processes inherit the corpus, index and policy
            batches = EpisodeProcesses(run_one, config.workers, config.concurrency).run_batches(units)
        try:
            with self.reporter.progress(total, already) as advance:
                for batch in batches:
                    trajectory_log.append_all(batch)  # whatever finished is kept, even past a stop
                    written += len(batch)
                    advance(len(batch))
                    for trajectory in batch:
                        errors = errors + 1 if trajectory.outcome.status == "policy_error" else 0
                        if errors >= max_errors:  # what is still in flight runs again on resume
                            return trajectory.outcome.reason or "policy_error"
        except KeyboardInterrupt:
            raise EvaluationInterrupted(self.out, written, total) from None
        finally:
            batches.close()  # stops the episode threads from starting more, kills the episode processes
        return None


def _unsaid(line: str) -> None:
    """For a second selection of the same questions, whose notes were said by the first."""


@contextlib.contextmanager
def loaded_state_frozen() -> Iterator[None]:
    """While the episodes run, the corpus and index loaded for them are frozen: the host's garbage
    collections, which run during tool calls, do not walk them again and again. Thawed after, so
    a process that goes on (a script of the Python API, a test) collects as before."""
    import gc

    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def refuse_other_corpus(policy: Policy, papers_sha256: str, allowed: bool) -> None:
    """A replay on another corpus than its recording's would report each difference as drift of
    the runtime: refused, unless ``replay_other_corpus`` asks for exactly that."""
    if not isinstance(policy, Replay):
        if allowed:
            raise EvaluationError(
                f"{setting('replay_other_corpus', True)} is only for {setting('policy.name', 'replay')}, not {policy.name!r}"
            )
        return
    other = sorted(policy.corpus_hashes() - {papers_sha256})
    if other and not allowed:
        raise EvaluationError(
            f"{policy.source or 'the recording'}: recorded on another corpus (corpus_sha256 {other[0][:12]}, this corpus "
            f"{papers_sha256[:12]}); pass the corpus it was recorded on as {setting('corpus')}, or {setting('replay_other_corpus', True)} "
            "to measure what changed"
        )


def _refuse_other_probes(out: Path, config: EvalConfig, logged) -> None:
    """A resume asks its probes from the file the logged episodes asked theirs from: the manifest
    records the file's path, not its bytes, and one run whose episodes were probed with two wordings
    measures two things under one name (calibrate fits one temperature to both)."""
    if not config.episode.probes:
        return
    probes = load_probes(config.episode.probes_file)
    other = next((t for t in logged for p in t.probes if p.probes_sha256 != probes.sha256), None)
    if other is not None:
        recorded = next(p.probes_sha256 for p in other.probes if p.probes_sha256 != probes.sha256)
        raise EvaluationError(
            f"{out}: refusing to resume: episode {other.episode_id} asked its probes from a probes file of SHA-256 "
            f"{recorded[:12]}, and {probes.path} is {probes.sha256[:12]} now; restore the file the run started with, "
            f"or start a new run with another {setting('out')}"
        )


def _load_preregistration(config: EvalConfig) -> Preregistered | None:
    if config.preregistration is None:
        return None
    from paper_explorer.evaluation import prereg as preregistering

    return preregistering.Preregistered.read(config.preregistration)


def _check_preregistration(preregistered: Preregistered, corpus: Corpus, selected_sha256: str, questions: int) -> None:
    from paper_explorer.evaluation import prereg as preregistering

    prereg, path = preregistered
    preregistering.check_frozen(prereg, path, corpus.papers_sha256, selected_sha256, questions)
    if prereg.comparison is not None:  # a missing or unreadable comparison fails now, not after the run
        comparison_run(prereg, path)


def _make_run_directory(out: Path) -> None:
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise EvaluationError(f"{out}: cannot create the run directory ({error.strerror})") from None
