"""``explorer eval --ray ADDRESS``: the episodes run as Ray tasks on a cluster; this process writes the run.

The driver (the process that runs ``explorer eval``) loads the corpus and writes the run
directory as it always does: the manifest first, then one log line per episode as results
arrive, then the scores. Only where episodes run changes. The units (a question and a sample
number) are cut into chunks of ``concurrency`` and each chunk is one Ray task, which runs its
episodes with ``concurrency`` in flight (``agent.engine.EpisodeThreads``) on a runner of its
node's own: its policy, its sandbox pool (zygote and episode hosts, started in the task's worker
process) and the servers the config names. A worker process keeps its runner for the next chunk
of the same run, so a node pays for its sandbox and index once.

What makes the run exact:

- **Nothing is written by a node.** A task returns its chunk's trajectories whole; the driver
  appends them to the log. A task lost with its node (or its worker process killed) has returned
  nothing, and Ray runs it again on another node (``max_retries``): its episodes are neither lost
  nor written twice. The driver also drops a result whose (question, sample) it has already
  written, so not even a retry that Ray delivered twice could repeat a line.
- **The same config gives the same episodes on any node**: an episode's seed comes from the run's
  seed, the question and the sample number (``agent.engine``), never from where it runs.
- **A node must be the driver's twin** in what the manifest claims: the same package versions and
  git commit, and the sandbox isolation the manifest records. A node that differs refuses the
  task with one line naming the node and what differs, and the run stops (what was written is kept).
- **The driver killed** (``kill -9``, a lost login node): Ray cancels a dead driver's tasks, and
  ``explorer eval --out RUN --resume`` runs what the log does not hold, on Ray again or not.

The corpus reaches the nodes through Ray's object store (put once, fetched once per worker
process), so nodes need no copy of it. Paths in the config (a model, a tokenizer, a probes file)
are opened on the nodes: a task runs in the driver's working directory where the node has it (a
shared filesystem), so relative paths mean what they meant to the driver. ``OPENAI_API_KEY``, when
set and the policy sends it to its server, reaches the tasks as an environment variable of the job
(Ray's ``runtime_env``, which the cluster keeps in its job table): never for a policy that sends none.

Ray is an optional extra (``pip install -e '.[ray]'``); without it ``--ray`` is refused in one line
before anything is written.

Why one module of this size: the driver's side (connect, submit, watch the head, check what
returns) and the node's side (the task and its runner) are the two ends of one protocol, the
chunk and its trajectories; split, each end's guarantee would be read without the other's.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
import warnings
from collections import Counter
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import Any

from paper_explorer.agent.config import EvalConfig
from paper_explorer.agent.engine import EpisodeThreads
from paper_explorer.agent.environment import git_commit, versions
from paper_explorer.agent.trajectory import Trajectory
from paper_explorer.corpus import Corpus
from paper_explorer.corpus.setting_names import setting
from paper_explorer.evaluation.errors import EvaluationError

INSTALL = "pip install -e '.[ray]'"
TASK_RETRIES = 3  # a chunk lost with its node runs again elsewhere, up to this many times
CONNECT_SECONDS = 10.0  # an address where no Ray cluster listens is named after this, not after Ray's minutes of retries
HEAD_GONE_SECONDS = 10.0  # a head whose GCS refuses connections this long is lost (Ray's core gives up after 60 s)
NO_CPU_SECONDS = 600.0  # a cluster without a CPU this long (its nodes lost, none joining, none autoscaled) stops the run
WAIT_SECONDS = 1.0  # how long the driver blocks on Ray at a time: Ctrl-C is seen between waits
CHUNKS_PER_CPU = 8  # at least this many tasks for each CPU of the cluster, for balance and a small loss per lost node
MAX_ROUNDS = 8  # a task runs at most this many rounds of concurrency episodes
TASKS_PER_CPU = 2  # chunks submitted ahead per cluster CPU: every node has its next chunk waiting, and a stop wastes little
LOOPBACK = ("localhost", "127.0.0.1", "::1")
KEY_VARIABLES = ("OPENAI_API_KEY",)  # what a task's policy reads from its environment


class NodeRefused(Exception):
    """A node that cannot run the driver's episodes as the manifest claims; its words are the error line."""


@dataclass(frozen=True)
class Identity:
    """What the run's manifest claims about the code and the sandbox; a node must match it."""

    versions: dict[str, str]
    git_commit: str | None
    isolation: str

    def differences(self, other: Identity) -> list[str]:
        """What ``other`` (a node's) has that differs from this (the driver's), in words."""
        found = [
            f"{name} {other.versions.get(name, 'missing')} (driver {self.versions.get(name, 'missing')})"
            for name in sorted(set(self.versions) | set(other.versions))
            if self.versions.get(name) != other.versions.get(name)
        ]
        if self.git_commit != other.git_commit:
            found.append(f"git commit {other.git_commit or 'none'} (driver {self.git_commit or 'none'})")
        if self.isolation != other.isolation:
            found.append(f"sandbox isolation {other.isolation!r} (the run's manifest: {self.isolation!r})")
        return found


def driver_identity(isolation: str) -> Identity:
    return Identity(versions(), git_commit(), isolation)


class RayCluster:
    """A connection to a Ray cluster for one run: ``connect``, then ``run_batches``, then ``close``."""

    def __init__(self, address: str, send_key: bool = False) -> None:
        self.address = address
        self.send_key = send_key  # the policy sends OPENAI_API_KEY to its server: its tasks need it, and only then
        self._ray: Any = None
        self._owned = False  # whether this connection is ours to close
        self._without_cpu_since: float | None = None  # since when the cluster has had no CPU to run a task on
        self._gcs: tuple[str, int] | None = None  # the head's GCS (host, port), watched while the run waits
        self._head_gone_since: float | None = None  # since when it has refused connections

    def connect(self) -> None:
        """Connect, or one ``EvaluationError`` line: Ray missing, or no cluster at the address."""
        try:
            import ray
        except ImportError:
            raise EvaluationError(f"{setting('ray')} runs episodes on a Ray cluster, which needs Ray: install it with {INSTALL}") from None
        if ray.is_initialized():  # the caller's own connection (a script that called ray.init): used, and left open
            self._ray, self._owned = ray, False
            self._watch_head()
            return
        _check_reachable(self.address)
        # A job's environment is kept in the cluster's job table, where whoever reaches the cluster reads it.
        env_vars = {name: os.environ[name] for name in KEY_VARIABLES if os.environ.get(name)} if self.send_key else {}
        try:
            with warnings.catch_warnings(action="ignore", category=UserWarning):  # a Ray Client's timeout, said again below
                ray.init(
                    address=self.address,
                    logging_level=logging.ERROR,
                    log_to_driver=False,
                    runtime_env={"env_vars": env_vars} if env_vars else None,
                )
        except (ConnectionError, RuntimeError, ValueError) as error:
            raise EvaluationError(
                f"{setting('ray', self.address)}: cannot connect to a Ray cluster ({_first_line(error)}); "
                "start one with ray start --head, or give its address (HOST:PORT, ray://HOST:10001 or auto)"
            ) from None
        self._ray, self._owned = ray, True
        self._watch_head()

    def _watch_head(self) -> None:
        """The head's GCS address, as the connection reports it (none for a Ray Client)."""
        try:
            host, _, port = str(self._ray.get_runtime_context().gcs_address).rpartition(":")
            self._gcs = (host.removeprefix("[").removesuffix("]"), int(port))
        except Exception:  # a Ray Client connection has no GCS address of its own: Ray watches it
            self._gcs = None

    def close(self) -> None:
        if self._ray is not None and self._owned:
            self._ray.shutdown()
        self._ray = None

    def run_batches(
        self, units: Sequence[tuple[Any, int]], corpus: Corpus, config: EvalConfig, driver: Identity
    ) -> Generator[list[Trajectory], None, None]:
        """The trajectories of ``units``, one list per finished task, in the order tasks finish.
        Closing the generator (a stop, Ctrl-C, an error) cancels the tasks not yet returned; their
        episodes were not written, so a resume runs them."""
        ray = self._ray
        assert ray is not None, "connect() first"
        cpus = int(ray.cluster_resources().get("CPU", 1))
        size = chunk_size(len(units), config.concurrency, cpus)
        chunks = [list(units[start : start + size]) for start in range(0, len(units), size)]
        corpus_ref = [ray.put(corpus)]  # in a list: Ray hands a task the reference, and a node fetches the corpus once
        remote = ray.remote(num_cpus=1, max_retries=TASK_RETRIES, retry_exceptions=False)(run_chunk)
        task = (corpus_ref, corpus.papers_sha256, config.model_dump_json(), driver, os.getcwd())
        window = max(2, TASKS_PER_CPU * cpus)
        pending: dict[Any, list] = {}
        written: set[tuple[str | None, int]] = set()
        try:
            while chunks or pending:
                while chunks and len(pending) < window:
                    chunk = chunks.pop(0)
                    pending[remote.remote(*task, chunk)] = chunk
                for ref in self._finished(list(pending)):
                    chunk = pending.pop(ref)
                    batch = _checked(self._result(ray, ref, len(chunk)), chunk)
                    batch = [t for t in batch if (t.question_id, t.sample) not in written]
                    written.update((t.question_id, t.sample) for t in batch)
                    if batch:
                        yield batch
        finally:
            for ref in pending:
                with contextlib.suppress(Exception):  # a task that finished or died meanwhile
                    ray.cancel(ref, force=True)

    def _finished(self, refs: list) -> list:
        """The tasks of ``refs`` that finished within ``WAIT_SECONDS`` (often none). One line, not a
        hang or Ray's traceback, when the cluster went away (its head lost: the driver's own Ray
        daemon with it), or has had no CPU to run a task on for ``NO_CPU_SECONDS`` (its nodes lost
        and none joining; Ray would wait for one forever)."""
        ray = self._ray
        try:
            finished, _ = ray.wait(refs, num_returns=1, timeout=WAIT_SECONDS)
            if finished:
                self._without_cpu_since = None
                return finished
            if not self._head_answers():  # asking the cluster for its CPUs would block on the lost head
                return []
            if ray.cluster_resources().get("CPU", 0) > 0:
                self._without_cpu_since = None
                return []
        except (OSError, ray.exceptions.RayError) as lost:
            raise self._lost(f"{type(lost).__name__}: {_first_line(lost)}") from None
        now = time.monotonic()
        self._without_cpu_since = self._without_cpu_since or now
        if now - self._without_cpu_since >= NO_CPU_SECONDS:
            raise EvaluationError(
                f"{setting('ray', self.address)}: the Ray cluster has had no node with a CPU for {NO_CPU_SECONDS:.0f} s, so "
                f"{len(refs)} tasks wait to run; what finished is written: add nodes (ray start --address on each), then resume the run"
            )
        return []

    def _head_answers(self) -> bool:
        """Whether the head's GCS port takes a connection; after ``HEAD_GONE_SECONDS`` of refusals,
        the run stops in one line. Ray's own core ends this process, with exit 1 and a line of its
        log, a minute after its head is lost: this says it first, and says what to do."""
        if self._gcs is None:
            return True
        refused = _refused(*self._gcs, timeout=WAIT_SECONDS)
        if refused is None:
            self._head_gone_since = None
            return True
        now = time.monotonic()
        self._head_gone_since = self._head_gone_since or now
        if now - self._head_gone_since >= HEAD_GONE_SECONDS:
            raise self._lost(f"its head at {self._gcs[0]}:{self._gcs[1]} refuses connections: {refused}")
        return False

    def _lost(self, why: str) -> EvaluationError:
        return EvaluationError(
            f"{setting('ray', self.address)}: lost the Ray cluster ({why}); "
            "what finished is written: check the cluster (ray status), then resume the run"
        )

    def _result(self, ray: Any, ref: Any, episodes: int) -> list[Trajectory]:
        try:
            return ray.get(ref)
        except ray.exceptions.RayTaskError as failure:
            cause = failure.cause
            if isinstance(cause, NodeRefused):
                raise EvaluationError(str(cause)) from None
            raise cause if isinstance(cause, BaseException) else EvaluationError(_first_line(failure)) from None
        except ray.exceptions.RayError as lost:  # its node or worker died on every try, or the cluster went away
            raise EvaluationError(
                f"a Ray task of {episodes} episodes was lost {TASK_RETRIES + 1} times ({type(lost).__name__}: {_first_line(lost)}); "
                "what finished is written: check the cluster (ray status), then resume the run"
            ) from None


def _checked(returned: object, chunk: list) -> list[Trajectory]:
    """A task's result is its chunk's episodes, each once: anything else (another node's code, a
    bug) is refused before a line of it is written."""
    asked = Counter((question.id or "", sample) for question, sample in chunk)
    if not isinstance(returned, list) or not all(isinstance(t, Trajectory) for t in returned):
        raise EvaluationError(f"a Ray task returned {type(returned).__name__}, not the trajectories of its {len(chunk)} episodes")
    got = Counter((t.question_id or "", t.sample) for t in returned)
    if got != asked:
        stranger = min((got - asked) or (asked - got))
        raise EvaluationError(
            f"a Ray task was asked {asked.total()} episodes and returned {got.total()}, not the same (first difference: question "
            f"{stranger[0]} sample {stranger[1]}); nothing of it was written"
        )
    return returned


def chunk_size(units: int, concurrency: int, cpus: int) -> int:
    """Episodes per task: ``concurrency`` (a task keeps that many in flight) times as many rounds
    of them as leave every CPU at least ``CHUNKS_PER_CPU`` tasks, up to ``MAX_ROUNDS``. Small
    runs get one round a task (a lost node costs little, the log grows as episodes finish); long
    runs of quick episodes pay Ray's cost per task less often."""
    rounds = units // (CHUNKS_PER_CPU * max(cpus, 1) * concurrency)
    return concurrency * max(1, min(MAX_ROUNDS, rounds))


def _check_reachable(address: str) -> None:
    """A HOST:PORT where nothing listens is one line now; Ray itself would retry for minutes. So is
    ``auto`` when what it finds (RAY_ADDRESS, or the address a stale ``ray start`` left) is such."""
    named = setting("ray", address)
    if address == "auto":
        found = _auto_address()
        if found is None:
            return  # none found (ray.init says so at once), or a Ray Client address (it fails fast on its own)
        named, address = f"{named} (found {found} in RAY_ADDRESS or this machine's last ray start)", found
    elif address == "local" or "://" in address:
        return  # a Ray of this process's own, or a Ray Client address
    host, _, port = address.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")  # an IPv6 address is written [ADDRESS]:PORT
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise EvaluationError(
            f"{named}: not a Ray address; give HOST:PORT (the head's GCS port, 6379 by default), ray://HOST:10001 or auto"
        )
    import ray.util

    # Ray connects to this machine's own address when given a loopback one (a head binds it, not 127.0.0.1).
    dialled = ray.util.get_node_ip_address() if host in LOOPBACK else host
    refused = _refused(dialled, int(port))
    if refused is None:
        _check_speaks_ray(named, dialled, int(port))
        return
    if dialled != host and _refused(host, int(port)) is None:
        raise EvaluationError(
            f"{named}: the Ray head there listens on the loopback address only, and Ray connects to "
            f"this machine's address {dialled}; start the head without --node-ip-address 127.0.0.1, or, for a cluster "
            "on this machine alone, set RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 for the head, the nodes and this command"
        )
    raise EvaluationError(
        f"{named}: no Ray cluster answers there ({refused}); "
        "start one with ray start --head, or give its address (ray status shows it), or local to run on this machine alone"
    )


def _auto_address() -> str | None:
    """The HOST:PORT ``ray.init(address="auto")`` would dial, or None when it finds none or is sent to a Ray Client."""
    from ray._private.services import canonicalize_bootstrap_address

    try:
        return canonicalize_bootstrap_address("auto")
    except (ConnectionError, ValueError):  # ValueError: RAY_ADDRESS holds a ray:// address, not HOST:PORT
        return None


def _check_speaks_ray(named: str, host: str, port: int) -> None:
    """What listens at ``host:port`` answers a Ray head's first question (its cluster's id), or one
    line: given anything else (a dashboard's HTTP port, the Ray Client port without ray://, another
    server), ``ray.init`` retries for a quarter of an hour, logging as it goes."""
    import grpc
    from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

    target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    with grpc.insecure_channel(target) as channel:
        try:
            gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel).GetClusterId(
                gcs_service_pb2.GetClusterIdRequest(),  # type: ignore[attr-defined]  # protoc-generated, without stubs
                timeout=CONNECT_SECONDS,
            )
        except grpc.RpcError as error:
            # UNAVAILABLE: not gRPC at all (HTTP/1, another protocol); UNIMPLEMENTED: a gRPC server that is not a Ray
            # head's; DEADLINE_EXCEEDED: nothing answered. Any other code came from a Ray head (one that wants a token, say).
            if error.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.DEADLINE_EXCEEDED):
                raise EvaluationError(
                    f"{named}: a server listens there but it is not a Ray head ({_first_line_of(error.details())}); "
                    "give the head's GCS port (6379 by default; ray status shows the address), or ray://HOST:10001 for a Ray Client"
                ) from None


def _first_line_of(text: str | None) -> str:
    lines = (text or "").strip().splitlines()
    return lines[0] if lines else "no answer"


def _refused(host: str, port: int, timeout: float = CONNECT_SECONDS) -> str | None:
    """Why a TCP connection to ``host:port`` failed, or None when it was accepted."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return None
    except OSError as error:
        return error.strerror or str(error) or type(error).__name__


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


# -- on a node -----------------------------------------------------------------------------------

_NODE: tuple[tuple[str, str], Any, int] | None = None  # (corpus hash, config): the runner this worker process built, concurrency


def run_chunk(corpus_ref: list, corpus_sha256: str, config_json: str, driver: Identity, cwd: str, units: list) -> list[Trajectory]:
    """A Ray task: the episodes of ``units``, run on this node's runner for the run."""
    from paper_explorer.agent.runner import EpisodeRunner

    runner: EpisodeRunner
    runner, concurrency = _node_runner(corpus_ref, corpus_sha256, config_json, driver, cwd)
    if concurrency == 1 or len(units) == 1:
        return [runner.run(question.text, question, sample=sample) for question, sample in units]

    def in_flight(unit: tuple[Any, int]) -> Trajectory:
        question, sample = unit
        return runner.run(question.text, question, sample=sample, policy=runner.policy.for_episode())

    return list(EpisodeThreads(in_flight, concurrency).run(units))


def _node_runner(corpus_ref: list, corpus_sha256: str, config_json: str, driver: Identity, cwd: str):
    """This worker process's runner for the run, built by its first task (and checked against the
    driver's identity then); a task of another run replaces it."""
    global _NODE
    key = (corpus_sha256, config_json)
    if _NODE is not None and _NODE[0] == key:
        return _NODE[1], _NODE[2]
    import ray

    from paper_explorer.agent.policies import make_policy
    from paper_explorer.agent.runner import EpisodeRunner, sandbox_isolation
    from paper_explorer.corpus import BM25Index

    _NODE = None
    if os.path.isdir(cwd):
        os.chdir(cwd)  # relative paths in the config mean what they meant to the driver (a shared filesystem)
    corpus = ray.get(corpus_ref[0])
    config = EvalConfig.model_validate_json(config_json)
    index = BM25Index.cached(corpus)
    node = Identity(versions(), git_commit(), sandbox_isolation(corpus, index, config.episode))
    differences = driver.differences(node)
    if differences:
        raise NodeRefused(
            f"Ray node {socket.gethostname()} ({ray.get_runtime_context().get_node_id()[:12]}) cannot run this run's episodes "
            f"as its manifest records them: {'; '.join(differences)}; install the driver's code on every node"
        )
    runner = EpisodeRunner(corpus, index, make_policy(config.policy, config.episode.max_steps), config.episode)
    _NODE = (key, runner, config.concurrency)
    return runner, config.concurrency
