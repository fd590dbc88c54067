"""``explorer preregister`` as a function: freeze a future run's corpus and questions, with its
pass rule, into a TOML file that ``evaluate`` checks (``EvalConfig(preregistration=...)``).

    from paper_explorer import PreregisterConfig, preregister
    rule = PreregisterConfig(limit=20, min_correct_abstentions=2, max_false_abstentions=3)
    preregistration = preregister(rule, out="prereg.toml")
    preregistration.frozen.questions_sha256

The file's format and how a run is judged by it are ``evaluation.prereg``'s.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

from paper_explorer.agent.config import Split
from paper_explorer.corpus import Corpus
from paper_explorer.corpus.selection import Note, log_note
from paper_explorer.corpus.setting_names import setting
from paper_explorer.evaluation.errors import EvaluationError

if TYPE_CHECKING:  # the rule's statistics import scipy, which a command's --help has no use for
    from paper_explorer.evaluation.prereg import Preregistration


class PreregisterConfig(BaseModel):
    """The questions a future run will ask (chosen as ``EvalConfig`` chooses them) and the rule it
    must pass. Each field's description is its flag's help (``explorer preregister``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    split: Split | None = Field(None, description="Split the run will ask (as eval's; default test, all when the corpus has no splits).")
    split_of: dict[str, str] = Field(default_factory=dict, description="Corpus file -> split, for files whose names do not say.")
    limit: int | None = Field(None, ge=1, description="Only the first N questions (as eval's).")
    min_correct_abstentions: int = Field(ge=0, description="Pass only with at least this many abstentions on unanswerable questions.")
    max_false_abstentions: int = Field(ge=0, description="Pass only with at most this many abstentions on answerable questions.")
    comparison: Path | None = Field(None, description="A finished run directory to Fisher-test against.")
    alpha: float = Field(0.05, ge=0.0001, le=0.5, description="Significance level of the comparison.")


def preregister(
    config: PreregisterConfig,
    *,
    out: str | Path,
    corpus: Corpus | str | Path | None = None,
    questions: str | Path | None = None,
    force: bool = False,
    note: Note = log_note,
) -> Preregistration:
    """Write the preregistration of ``config`` for ``corpus`` (a loaded ``Corpus``, a file or
    directory, or None for the demo corpus) to ``out``; returns it as the run will read it.

    ``questions`` replaces the corpus's questions; an existing ``out`` is refused unless
    ``force``. ``note`` hears which split was chosen when none was named."""
    from paper_explorer.corpus.collection import questions_sha256
    from paper_explorer.corpus.files import atomic_file
    from paper_explorer.corpus.selection import select_questions
    from paper_explorer.evaluation import prereg
    from paper_explorer.evaluation.run import load_corpus

    out = Path(out)
    if out.exists() and not force:
        raise EvaluationError(f"{out}: already exists; pass {setting('force', True)} to overwrite it")
    comparison = None
    if config.comparison is not None:
        comparison = config.comparison.resolve()  # stored absolute: the file may be read from anywhere
        if not (comparison / "metrics.json").is_file():
            raise EvaluationError(
                f"{setting('comparison', comparison)}: no metrics.json; name a finished run directory (explorer eval --out)"
            )
    loaded = load_corpus(corpus, questions, config.split_of or None)
    selected = select_questions(loaded, config.split, config.limit, note=note)
    text = prereg.template(
        loaded.papers_sha256,
        questions_sha256(selected),
        len(selected),
        config.min_correct_abstentions,
        config.max_false_abstentions,
        str(comparison) if comparison else None,
        config.alpha,
    )
    with atomic_file(out) as handle:
        handle.write(text)
    return prereg.load(out)
