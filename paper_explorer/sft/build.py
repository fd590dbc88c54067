"""``build_dataset(config, trajectories=..., tokenizer=..., out=...)``: trajectories -> a training
data directory, the workflow behind ``explorer sft build`` (and the build stage of ``explorer
improve``).

Every trajectory is first checked for train/serve parity against the tokenizer (as ``explorer
check-parity`` does): a mismatch refuses the build (``ParityMismatch``) and nothing is written,
unless allowed, which the report records. Then the trajectories are filtered by outcome, split
by paper, tokenised through the shared renderer (``sft.dataset``), and the split check refuses
a build in which a paper or question id is shared between train, validation and evaluation.
The directory holds ``train.jsonl``, ``validation.jsonl`` and ``build_report.json`` (a
``BuildReport``, which records the ``BuildConfig`` whole as its ``settings``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from paper_explorer.agent.trajectory import Trajectory
from paper_explorer.corpus.setting_names import setting
from paper_explorer.sft.config import BuildConfig
from paper_explorer.sft.errors import TrainingError
from paper_explorer.sft.records import BuildReport, ParityReport


class NothingToTrain(TrainingError):
    """No trajectory survived the build's filters."""


class ParityMismatch(TrainingError):
    """A trajectory fails the parity check and mismatches were not allowed: nothing was written."""


def build_dataset(
    config: BuildConfig,
    *,
    trajectories: Sequence[str | Path],
    tokenizer: str | Path,
    out: str | Path,
    corpus=None,
    allow_parity_mismatch: bool = False,
    force: bool = False,
) -> BuildReport:
    """Check, filter, tokenise and write a dataset from ``trajectories`` (trajectory .jsonl files, of
    any policy) into ``out``; the report it wrote there.

    ``tokenizer`` is the model's tokenizer directory (or its tokenizer.json). ``corpus`` (a
    ``corpus.Corpus``, or a path to load one from; None: the demo corpus) holds the gold questions
    the outcomes are judged against and the papers' splits. An ``out`` that already holds a
    dataset is refused unless ``force``. Raises ParityMismatch, NothingToTrain or another
    TrainingError, each one line saying what to do."""
    from paper_explorer.agent.renderer import ChatRenderer
    from paper_explorer.agent.writer import read_trajectories
    from paper_explorer.corpus import Corpus
    from paper_explorer.evaluation.run import load_corpus

    out, tokenizer, sources = Path(out), Path(tokenizer), [Path(p) for p in trajectories]
    if (out / "build_report.json").exists() and not force:
        raise TrainingError(f"{out}: already holds a built dataset; pass {setting('force', True)} to rebuild it")
    corpus = corpus if isinstance(corpus, Corpus) else load_corpus(corpus)  # a loaded one has said its warnings
    renderer = ChatRenderer.from_directory(tokenizer)
    found = [t for path in sources for t in read_trajectories(path)]
    if not found:
        raise TrainingError("the trajectory files hold no episodes")
    refuse_memory_reader(found)
    parity = parity_report(found, renderer, allow_parity_mismatch)
    return _build(config, found, sources, out, tokenizer, renderer, corpus, parity)


def _build(
    config: BuildConfig, found: list[Trajectory], sources: list[Path], out: Path, tokenizer: Path, renderer, corpus, parity: ParityReport
) -> BuildReport:
    from paper_explorer.corpus.collection import questions_sha256
    from paper_explorer.sft.dataset import build, split_check, statistics, write

    evaluation_papers = frozenset(p.id for p in corpus.papers if p.split == config.evaluation_split)
    evaluation_questions = frozenset(q.id for q in corpus.questions if q.paper_id in evaluation_papers)
    built = build(
        found,
        {q.id: q for q in corpus.questions},
        renderer,
        config,
        evaluation_papers,
    )
    check = split_check(built, evaluation_papers, evaluation_questions)
    if not check.passed:
        raise TrainingError(f"split check failed, ids shared between sets: {json.dumps(check.overlaps)[:300]}")
    if not built.train:
        raise NothingToTrain(
            f"no training example survived the filters (dropped: {dict(built.dropped)}); relax --min-answer-f1 or add trajectories"
        )
    tokenizer_file = tokenizer / "tokenizer.json" if tokenizer.is_dir() else tokenizer
    report = BuildReport(
        trajectories_read=len(found),
        sources=[str(p) for p in sources],
        kept={"train": len(built.train), "validation": len(built.validation)},
        dropped=dict(built.dropped),
        split_at_turn_boundary=built.shortened,
        settings=config.model_dump(),
        split_check=check,
        tokenizer=str(tokenizer_file.resolve()),
        tokenizer_sha256=renderer.fingerprint,
        chat_template=renderer.check.record(),
        corpus=[str(s) for s in corpus.sources],
        corpus_sha256=corpus.papers_sha256,
        questions_sha256=questions_sha256(corpus.questions),
        statistics={"train": statistics(built.train), "validation": statistics(built.validation)},
        parity=parity,
    )
    write(built, out, report)
    return report


def refuse_memory_reader(trajectories: list[Trajectory]) -> None:
    """The memory reader's actions are fixed code and its model's work is memory updates, which
    these examples (a code agent's turns) cannot hold: training on them would teach the reader's
    plan as if a model had written it."""
    readers = [t for t in trajectories if t.policy.name == "memory-reader"]
    if readers:
        raise TrainingError(
            f"{len(readers)} of {len(trajectories)} episodes are the memory reader's (first {readers[0].episode_id}): "
            "sft build trains a code agent on the actions its model wrote, and the reader's actions are fixed code; "
            "build from code-agent runs"
        )


def parity_report(trajectories: list[Trajectory], renderer, allow_mismatch: bool) -> ParityReport:
    """Check every trajectory; refuse the build (ParityMismatch, nothing written) on a mismatch unless allowed."""
    from paper_explorer.agent.parity import check_trajectory

    mismatches = [m for m in (check_trajectory(t, renderer) for t in trajectories) if m is not None]
    report = ParityReport(
        trajectories=len(trajectories),
        steps=sum(len(t.steps) for t in trajectories),
        served_records=sum(1 for t in trajectories for step in t.steps if step.served is not None),
        mismatches=len(mismatches),
        first_mismatch=str(mismatches[0]) if mismatches else None,
        allowed=allow_mismatch and bool(mismatches),
    )
    if mismatches and not allow_mismatch:
        first = str(mismatches[0]).split("\n")[0]  # the first line; the rest quotes the decoded tokens
        raise ParityMismatch(
            f"parity check failed on {len(mismatches)} of {len(trajectories)} trajectories, first {first}; "
            "nothing written (see explorer check-parity; --allow-parity-mismatch builds anyway)"
        )
    return report
