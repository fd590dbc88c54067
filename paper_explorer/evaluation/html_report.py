"""``explorer report`` as a function: one self-contained HTML page of a run, or of two runs compared.

    from paper_explorer import report
    report("runs/base", out="base.html")                    # one run: metrics, plots, every episode
    report("runs/base", "runs/adapter", out="compared.html")  # two: paired question by question

The page shows each episode under its gold answers and cited paragraphs, read from the corpus
the runs were made on: the one named, else the one the first run's manifest recorded - refused
unless its papers and questions hash to what every run recorded. The pages themselves are
``evaluation.report``'s (one run) and ``evaluation.report_compare``'s (two).
"""

from __future__ import annotations

from pathlib import Path

from paper_explorer.corpus import Corpus
from paper_explorer.corpus.selection import Note, log_note
from paper_explorer.corpus.setting_names import setting
from paper_explorer.evaluation.errors import EvaluationError
from paper_explorer.evaluation.run_comparison import compare, loaded
from paper_explorer.evaluation.run_directory import Run


def report(
    run: Run | str | Path,
    other: Run | str | Path | None = None,
    *,
    out: str | Path,
    corpus: Corpus | str | Path | None = None,
    questions: str | Path | None = None,
    force: bool = False,
    note: Note = log_note,
) -> Path:
    """Write the report of ``run`` (a ``Run`` or a run directory), or of ``run`` compared with
    ``other``, to the .html file ``out``; returns ``out``.

    ``corpus`` (a loaded ``Corpus``, a file or directory; None: the one the run recorded) and
    ``questions`` (the questions file the runs were given) hold the gold answers; their hashes are
    checked. An existing ``out`` is refused unless ``force``."""
    from paper_explorer.evaluation.report import write_report
    from paper_explorer.evaluation.report_compare import write_comparison_report

    out = Path(out)
    if out.is_dir():
        raise EvaluationError(f"{out}: is a directory; {setting('out')} names the .html file to write")
    if out.exists() and not force:
        raise EvaluationError(f"{out}: already exists; pass {setting('force', True)} to overwrite it, or name another file")
    runs = [loaded(run)] + ([] if other is None else [loaded(other)])
    gold = report_corpus(runs, corpus, questions)
    if len(runs) == 1:
        return write_report(runs[0], gold, out)
    comparison = compare(*runs, top=len(runs[0].scores), note=note)  # every question whose F1 moved, largest first
    return write_comparison_report(runs[0], runs[1], comparison, gold, out)


def report_corpus(runs: list[Run], corpus: Corpus | str | Path | None, questions: str | Path | None) -> Corpus:
    """The corpus the runs were made on: the one named, else the first run's recorded one; refused
    unless its papers and questions hash to what every run's manifest recorded."""
    from paper_explorer.evaluation.report_data import check_corpus
    from paper_explorer.evaluation.resume import recorded_corpus
    from paper_explorer.evaluation.run import load_corpus

    first = runs[0].manifest
    if len(runs) == 2:
        theirs = runs[1].manifest.hashes
        for what, a, b in (
            ("corpora", first.hashes.corpus_sha256, theirs.corpus_sha256),
            ("question sets", first.hashes.questions_sha256, theirs.questions_sha256),
        ):
            if a != b:
                raise EvaluationError(
                    f"the runs used different {what} (sha256 {a[:12]} and {b[:12]}): their questions cannot be "
                    "paired; report runs made on the same corpus, or report each run alone"
                )
    source = corpus if corpus is not None else recorded_corpus(first)
    gold = load_corpus(source, questions, first.config.split_of or None)
    where = "the given corpus" if isinstance(source, Corpus) else str(source) if source is not None else "the generated demo corpus"
    for run in runs:
        check_corpus(run, gold, where)
    return gold
