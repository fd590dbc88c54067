"""``explorer decide``: score every question of a typed decision file and write a run directory.

Each question becomes one line of RUN/decisions.jsonl, appended whole and fsynced as soon as it is
scored, so a killed run keeps what it scored and ``--resume`` scores only the rest: the manifest is
checked first (the same file, model, prompts and settings; anything else is refused in one line).
metrics.json is written at the end, whole (``decisions.calibration``).

A question whose prompt does not fit the context is recorded ``not_measured`` with the overflow and
how to cut; a cut made because ``--cut`` asked is recorded with the tokens dropped. Nothing is cut
silently, and a failed question never loses the others.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

import paper_explorer.corpus.files as files
import paper_explorer.corpus.jsonl as jsonl
from paper_explorer.agent.environment import git_commit, hardware, versions
from paper_explorer.agent.errors import AgentError
from paper_explorer.agent.served import ids_sha256
from paper_explorer.decisions.backends import Backend
from paper_explorer.decisions.calibration import figures_by_kind
from paper_explorer.decisions.checks import checks_of
from paper_explorer.decisions.errors import DecisionError
from paper_explorer.decisions.file import Asked, DecisionSet
from paper_explorer.decisions.likelihood import Mode, confidence, normalised
from paper_explorer.decisions.prompts import CutSide, PromptTexts, build, indistinct, load_prompts
from paper_explorer.decisions.records import (
    DECISIONS,
    MANIFEST,
    METRICS,
    CutRecord,
    DecisionManifest,
    DecisionMetrics,
    DecisionRecord,
)

REASON_CHARS = 300
# What --resume compares: a run continued with any of these changed would mix two experiments.
RESUME_FIELDS = ("file_sha256", "corpus_sha256", "backend", "model", "prompts_sha256", "context", "cut", "order", "mode", "check_reversed")


@dataclass(frozen=True)
class DecideSettings:
    cut: CutSide = "none"
    order: str = "given"  # "reversed": list and score each question's options last first
    mode: Mode = "shared"
    check_reversed: bool = False  # read each question again, its options in the other order (decisions.checks)

    def other_order(self) -> DecideSettings:
        return replace(self, order="given" if self.order == "reversed" else "reversed", check_reversed=False)


def score_question(
    backend: Backend, texts: PromptTexts, asked: Asked, settings: DecideSettings, document: list[int] | None = None
) -> DecisionRecord:
    """One question's record: its options scored as listed, or why they were not. ``document``:
    its document's ids where the caller tokenised them once for all its questions."""
    question = asked.question
    options = list(question.choices)
    if settings.order == "reversed":
        options.reverse()
    started = time.perf_counter()
    record = {
        "question_id": question.id,
        "document_id": asked.document_id,
        "kind": question.kind,
        "question": question.text,
        "options": options,
        "ordered": question.is_ordered,
        "label": question.label,
        "negation_of": question.negation_of,
    }
    try:
        built = build(
            backend.renderer,
            texts,
            question.kind,
            question.text,
            asked.document if document is None else document,
            options,
            context=backend.max_context,
            cut=settings.cut,
        )
    except AgentError as error:  # text the tokenizer cannot read (a lone surrogate)
        return DecisionRecord(
            **record,
            option_tokens=[],
            document_tokens=0,
            seconds=0.0,
            not_measured=f"the prompt cannot be rendered: {error}"[:REASON_CHARS],
        )
    shape = {
        "option_tokens": [len(option) for option in built.options],
        "document_tokens": built.document_tokens,
        "cut": CutRecord(side=built.cut.side, tokens=built.cut.tokens, kept=built.cut.kept) if built.cut else None,
    }
    if built.prompt is None:
        return DecisionRecord(**record, **shape, seconds=0.0, not_measured=built.overflow)
    shape |= {"prompt_tokens": len(built.prompt), "prompt_sha256": ids_sha256(built.prompt)}
    try:
        scored = backend.score(built.prompt, built.options, settings.mode)
        probabilities, log_mass = normalised(scored.loglikelihoods)
    except (AgentError, ValueError, RuntimeError, OSError) as error:  # a server down or lying, memory: this question only
        seconds = time.perf_counter() - started
        return DecisionRecord(**record, **shape, seconds=seconds, not_measured=f"{type(error).__name__}: {error}"[:REASON_CHARS])
    best = max(range(len(options)), key=probabilities.__getitem__)
    return DecisionRecord(
        **record,
        **shape,
        loglikelihoods=scored.loglikelihoods,
        probabilities=probabilities,
        log_mass=log_mass,
        predicted=options[best],
        p_max=probabilities[best],
        confidence=confidence(probabilities),
        correct=None if question.label is None else options[best] == question.label,
        cached_tokens=scored.cached_tokens,
        forward_passes=scored.forward_passes,
        seconds=time.perf_counter() - started,
    )


def decide(
    decisions: DecisionSet,
    backend: Backend,
    out: Path,
    settings: DecideSettings,
    *,
    corpus: tuple[list[str], str] | None = None,
    resume: bool = False,
    force: bool = False,
    retry_not_measured: bool = False,
    note: Callable[[str], None] = lambda _: None,
) -> DecisionMetrics:
    """Score ``decisions`` into the run directory ``out`` and return its metrics. With ``resume``
    and ``retry_not_measured``, the questions recorded not measured (a server that was down, a
    failed pass) are scored again: the new line supersedes the old, and the file is rewritten
    with one line a question once they are done."""
    texts = load_prompts()
    manifest = DecisionManifest(
        created_at=datetime.now(UTC).isoformat(timespec="seconds"),
        command=sys.argv[1:],
        file=str(decisions.path.resolve()),
        file_sha256=decisions.sha256,
        corpus=corpus[0] if corpus else None,
        corpus_sha256=corpus[1] if corpus else None,
        questions=len(decisions.asked),
        kinds=decisions.kinds(),
        backend=backend.name,
        model=backend.settings(),
        prompts_sha256=texts.sha256,
        context=backend.max_context,
        cut=settings.cut,
        order=settings.order,
        mode=settings.mode,
        check_reversed=settings.check_reversed,
        versions=versions(),
        git_commit=git_commit(),
        hardware=hardware(),
    )
    for asked in decisions.asked:  # before anything is written: a file this model cannot read is refused whole
        problem = indistinct(backend.renderer, asked.question.choices)
        if problem is not None:
            raise DecisionError(f"{decisions.path}:{asked.line}: question {asked.question.id!r}: {problem}")
    if out.exists() and not out.is_dir():
        raise DecisionError(f"{out}: is a file, not a run directory; choose another --out")
    if retry_not_measured and not resume:
        raise DecisionError("retrying the questions not measured continues a run: pass --resume with it")
    if resume and not (out / MANIFEST).exists():
        raise DecisionError(f"{out}: no {MANIFEST} to resume; start the run without --resume")
    out.mkdir(parents=True, exist_ok=True)
    with _sole_writer(out):
        scored = _prepare(out, manifest, resume=resume, force=force)
        done = {question for question, whole in scored.items() if whole or not retry_not_measured}
        if retry_not_measured:
            note(f"retrying {len(scored) - len(done)} questions recorded not measured")
        if done:
            note(f"resuming {out}: {len(done)} of {len(decisions.asked)} questions already scored")
        with jsonl.AppendOnlyLines(out / DECISIONS) as log:
            tokenised: dict[str, list[int] | None] = {}  # the current document's ids: its questions are on one line
            for asked in decisions.asked:
                if asked.question.id not in done:
                    if asked.document_id not in tokenised:
                        tokenised = {asked.document_id: _ids(backend, asked.document)}
                    ids = tokenised[asked.document_id]
                    record = score_question(backend, texts, asked, settings, ids)
                    if settings.check_reversed:  # on the same line, so a resumed run never holds one reading without the other
                        record.reversed = score_question(backend, texts, asked, settings.other_order(), ids)
                    log.append(record)
        if len(done) < len(scored):  # a retry superseded lines: one line a question again, written whole
            jsonl.write_records(out / DECISIONS, read_records(out))
        return write_metrics(out, [item.question.id for item in decisions.asked])


def _ids(backend: Backend, document: str) -> list[int] | None:
    """A document's ids, tokenised once for all its questions (a long one is not remembered by the
    renderer); None when it cannot be, and each question records why (``score_question``)."""
    try:
        return backend.renderer.text(document)
    except AgentError:
        return None


@contextlib.contextmanager
def _sole_writer(out: Path) -> Iterator[None]:
    """An exclusive lock on the run directory while this process writes it: two decide runs into
    one directory would each write a manifest and interleave their lines, one run's records read
    under the other's settings. The lock goes with the process, so a killed run never leaves it."""
    descriptor = os.open(out, os.O_RDONLY | os.O_DIRECTORY)
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise DecisionError(
                f"{out}: another explorer decide is writing this run now; wait for it to end, or choose another --out"
            ) from None
        yield
    finally:
        os.close(descriptor)


def _prepare(out: Path, manifest: DecisionManifest, *, resume: bool, force: bool) -> dict[str, bool]:
    """The question ids already recorded (resume), each with whether it was measured whole (its
    reversed reading too), after writing or checking the manifest."""
    manifest_path = out / MANIFEST
    if resume:
        before = read_manifest(out)
        changed = [name for name in RESUME_FIELDS if getattr(before, name) != getattr(manifest, name)]
        if changed:
            raise DecisionError(
                f"{out}: --resume with other {', '.join(changed)} than the run was started with; start a new run with another --out"
            )
        return {record.question_id: _whole(record) for record in read_records(out, torn_ok=True)}
    if any(out.iterdir()):
        if not force:
            raise DecisionError(f"{out}: not empty; pass --resume to continue its run, --force to start it again, or another --out")
        try:
            read_manifest(out)  # an evaluation run has a manifest.json and a metrics.json too
        except DecisionError:
            raise DecisionError(
                f"{out}: --force replaces only a decide run, and this directory holds something else; choose another --out"
            ) from None
        for name in (MANIFEST, DECISIONS, METRICS):
            (out / name).unlink(missing_ok=True)
    with files.atomic_file(manifest_path) as handle:
        handle.write(manifest.model_dump_json(indent=2))
    return {}


def _whole(record: DecisionRecord) -> bool:
    return record.measured and (record.reversed is None or record.reversed.measured)


def read_manifest(out: Path) -> DecisionManifest:
    try:
        data = files.read_bytes(out / MANIFEST, limit=files.DOCUMENT_BYTES, inside=out, what="decide manifest")
        return DecisionManifest.model_validate_json(data)
    except FileNotFoundError:
        raise DecisionError(f"{out}: no {MANIFEST}; not a run of explorer decide") from None
    except (files.FileRefused, ValueError) as error:
        raise DecisionError(f"{out / MANIFEST}: not a decide manifest ({str(error).splitlines()[0]})") from None


def read_records(out: Path, *, torn_ok: bool = False) -> list[DecisionRecord]:
    """decisions.jsonl, a line per question, in the order first recorded. Decide writes each once
    (--resume scores only the missing, one run writes at a time), except that --retry-not-measured
    appends a new line for a question recorded not measured: a later line supersedes such a line
    (until the retry rewrites the file). Any other second line of a question is an edit, refused."""
    try:
        lines, torn = jsonl.read_numbered(out / DECISIONS, DecisionRecord, what="decision record", inside=out)
    except FileNotFoundError:
        return []
    except (jsonl.JsonLinesError, files.FileRefused) as error:
        raise DecisionError(str(error)) from None
    if torn is not None and not torn_ok:
        raise DecisionError(
            f"{out / DECISIONS}:{torn.number}: torn last line (an interrupted run); explorer decide ... --out {out} --resume mends it"
        )
    latest: dict[str, jsonl.Record[DecisionRecord]] = {}
    for line in lines:
        earlier = latest.get(line.value.question_id)
        if earlier is not None and _whole(earlier.value):
            raise DecisionError(
                f"{out / DECISIONS}:{line.number}: question {line.value.question_id!r} is also on line {earlier.number}; "
                "a decide run records each question once, so this file was edited or joined: run it again with --force"
            )
        latest[line.value.question_id] = line
    return [line.value for line in latest.values()]


def write_metrics(out: Path, question_ids: list[str] | None = None, temperatures: dict[str, float] | None = None) -> DecisionMetrics:
    """metrics.json from decisions.jsonl, written whole (of ``question_ids`` where given)."""
    records = read_records(out)
    if question_ids is not None:
        wanted = set(question_ids)
        records = [record for record in records if record.question_id in wanted]
    metrics = metrics_of(records, temperatures, order=read_manifest(out).order)
    with files.atomic_file(out / METRICS) as handle:
        handle.write(metrics.model_dump_json(indent=2))
    return metrics


def metrics_of(records: list[DecisionRecord], temperatures: dict[str, float] | None = None, *, order: str) -> DecisionMetrics:
    """The run's figures; ``order`` is the manifest's (the severity check counts levels in the file's order)."""
    measured = [record for record in records if record.measured]
    return DecisionMetrics(
        questions=len(records),
        measured=len(measured),
        not_measured=len(records) - len(measured),
        cut=sum(record.cut is not None for record in records),
        kinds=figures_by_kind(records, temperatures=temperatures),
        option_tokens_scored=sum(sum(record.option_tokens) for record in measured),
        seconds=sum(record.seconds for record in records),
        checks=checks_of(records, order),
    )


__all__ = ["DecideSettings", "decide", "metrics_of", "read_manifest", "read_records", "score_question", "write_metrics"]
