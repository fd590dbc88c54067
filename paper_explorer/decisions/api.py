"""``decide``: a typed decision file scored into a run directory, as one call (what ``explorer
decide`` does under its flags), returning the run read back (``DecisionRun``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from paper_explorer.decisions.errors import DecisionError
from paper_explorer.decisions.likelihood import DEFAULT_BATCH_TOKENS
from paper_explorer.decisions.prompts import CUTS
from paper_explorer.decisions.run_reading import DecisionRun


def decide(
    file: str | Path,
    *,
    model: str,
    out: str | Path,
    backend: str = "hf",
    corpus: Any = None,
    cut: str = "none",
    order: str = "given",
    mode: str = "shared",
    check_reversed: bool = False,
    max_context: int | None = None,
    adapter: str | Path | None = None,
    quantization: str = "auto",
    threads: int | None = None,
    batch_tokens: int = DEFAULT_BATCH_TOKENS,
    base_url: str | list[str] | None = None,
    tokenizer: str | Path | None = None,
    prompt_format: str = "ids",
    timeout: float = 120.0,
    retries: int = 4,
    chunk: int = 32,
    resume: bool = False,
    force: bool = False,
    retry_not_measured: bool = False,
    note: Callable[[str], None] = lambda _: None,
) -> DecisionRun:
    """Score every question of ``file`` with ``model`` (``backend="hf"``: a local transformers
    model; ``"openai"``: the name a server at ``base_url`` serves, with its ``tokenizer``) into the
    run directory ``out``. ``corpus``: a loaded Corpus, or a path, for documents that name papers."""
    from paper_explorer.decisions.backends import Backend, LocalBackend
    from paper_explorer.decisions.file import load_decisions
    from paper_explorer.decisions.run import DecideSettings
    from paper_explorer.decisions.run import decide as decide_set

    for name, value, allowed in (("cut", cut, CUTS), ("order", order, ("given", "reversed")), ("mode", mode, ("shared", "separate"))):
        if value not in allowed:
            raise DecisionError(f"{name}={value!r}: choose {', '.join(allowed)}")
    if backend not in ("hf", "openai"):
        raise DecisionError(f"backend={backend!r}: choose hf or openai")
    if resume and force:
        raise DecisionError("resume and force contradict each other; pass one")
    loaded = None
    if corpus is not None:
        from paper_explorer.corpus.collection import Corpus
        from paper_explorer.evaluation.run import load_corpus

        loaded = corpus if isinstance(corpus, Corpus) else load_corpus(corpus)
    decisions = load_decisions(Path(file), loaded)
    scorer: Backend
    if backend == "openai":
        if not base_url or tokenizer is None:
            raise DecisionError("backend='openai' needs base_url (the server) and tokenizer (the served model's tokenizer directory)")
        from paper_explorer.decisions.server_backend import ServerBackend

        served = ServerBackend.load(
            base_url,
            model,
            Path(tokenizer),
            prompt_format=prompt_format,
            max_context=max_context,
            timeout=timeout,
            retries=retries,
            chunk=chunk,
        )
        if served.note is not None:
            note(f"note: {served.note}")
        scorer = served
    else:
        scorer = LocalBackend.load(
            model,
            adapter=Path(adapter) if adapter else None,
            quantization=quantization,
            max_context=max_context,
            threads=threads,
            batch_tokens=batch_tokens,
        )
    pinned = (list(loaded.sources), loaded.sha256) if loaded is not None else None
    settings = DecideSettings(cut=cut, order=order, mode=mode, check_reversed=check_reversed)  # type: ignore[arg-type]
    decide_set(
        decisions, scorer, Path(out), settings, corpus=pinned, resume=resume, force=force, retry_not_measured=retry_not_measured, note=note
    )
    return DecisionRun.load(out)


__all__ = ["decide"]
