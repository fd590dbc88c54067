"""Preregistration: the pass rule, the comparison and the frozen hashes, fixed before a run.

    [frozen]
    corpus_sha256 = "..."        # the papers (explorer corpus stats --json shows it)
    questions_sha256 = "..."     # the questions this run asks, in order
    questions = 40

    [rule]
    min_correct_abstentions = 7  # of the unanswerable questions, at least this many abstained
    max_false_abstentions = 4    # of the answerable questions, at most this many abstained

    [comparison]                 # optional: Fisher's exact test against another run
    run = "runs/base-model"      # relative to this file
    alpha = 0.05

``explorer preregister`` writes one with the current hashes. ``explorer eval --preregistration``
checks the hashes before the first episode and reports the rule after the last.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from evaluation.errors import EvaluationError
from evaluation.records import AbstentionTable, PreregistrationResult
from evaluation.stats import abstention_fisher


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Frozen(Strict):
    corpus_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    questions_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    questions: int | None = Field(None, ge=1)


class Rule(Strict):
    min_correct_abstentions: int = Field(ge=0)
    max_false_abstentions: int = Field(ge=0)


class Comparison(Strict):
    run: str
    alpha: float = Field(0.05, gt=0, lt=1)


class Preregistration(Strict):
    frozen: Frozen
    rule: Rule
    comparison: Comparison | None = None


def load(path: Path) -> Preregistration:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise EvaluationError(f"{path}: no such preregistration file") from None
    except IsADirectoryError:
        raise EvaluationError(f"{path}: is a directory; name the preregistration .toml file") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
        raise EvaluationError(f"{path}: not valid TOML ({error})") from None
    try:
        return Preregistration.model_validate(data)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise EvaluationError(f"{path}: field '{where}': {first['msg']}") from None


def check_frozen(prereg: Preregistration, path: Path, corpus_sha256: str, questions_sha256: str, questions: int) -> None:
    """Before the first episode: the run must ask exactly the frozen questions of the frozen corpus."""
    frozen = prereg.frozen
    for name, pinned, actual in (
        ("corpus_sha256", frozen.corpus_sha256, corpus_sha256),
        ("questions_sha256", frozen.questions_sha256, questions_sha256),
    ):
        if pinned != actual:
            raise EvaluationError(
                f"{path}: {name} is pinned to {pinned[:12]}... but this run's is {actual[:12]}...; "
                "run on the preregistered corpus and questions (same --split and --limit)"
            )
    if frozen.questions is not None and frozen.questions != questions:
        raise EvaluationError(f"{path}: {frozen.questions} questions are preregistered but this run asks {questions}")


def comparison_table(prereg: Preregistration, path: Path) -> tuple[Path, AbstentionTable]:
    """The comparison run's directory and abstention table; one clear line when it has none
    (checked before a run starts, so a missing comparison fails before the episodes, not after)."""
    assert prereg.comparison is not None
    other_dir = (path.parent / prereg.comparison.run).resolve()  # absolute as preregister writes it; older files: beside the TOML
    try:
        return other_dir, AbstentionTable.model_validate(json.loads((other_dir / "metrics.json").read_text())["abstention"])
    except (OSError, json.JSONDecodeError, KeyError, TypeError, ValidationError):
        raise EvaluationError(f"{path}: comparison run {other_dir} has no readable metrics.json; run it first") from None


def judge(prereg: Preregistration, path: Path, table: AbstentionTable) -> PreregistrationResult:
    """After the last episode: the rule's verdict and, with a comparison run, Fisher's exact tests."""
    correct, false = table.unanswerable.abstained, table.answerable.abstained
    rule = prereg.rule
    checks = [
        {
            "check": f"correct abstentions >= {rule.min_correct_abstentions}",
            "value": correct,
            "pass": correct >= rule.min_correct_abstentions,
        },
        {"check": f"false abstentions <= {rule.max_false_abstentions}", "value": false, "pass": false <= rule.max_false_abstentions},
    ]
    result = {"file": str(path), "pass": all(c["pass"] for c in checks), "checks": checks}
    if prereg.comparison is not None:
        other_dir, other = comparison_table(prereg, path)
        tests = [abstention_fisher(table.model_dump(), other.model_dump(), row) for row in ("unanswerable", "answerable")]
        for test in tests:
            test["significant"] = test["p_value"] < prereg.comparison.alpha
        result["comparison"] = {"run": str(other_dir), "alpha": prereg.comparison.alpha, "fisher": tests}
    return PreregistrationResult.model_validate(result)


def template(
    corpus_sha256: str, questions_sha256: str, questions: int, min_correct: int, max_false: int, comparison: str | None, alpha: float
) -> str:
    lines = [
        "# explorer preregistration: fixed before the run, checked by explorer eval --preregistration",
        "[frozen]",
        f'corpus_sha256 = "{corpus_sha256}"',
        f'questions_sha256 = "{questions_sha256}"',
        f"questions = {questions}",
        "",
        "[rule]",
        f"min_correct_abstentions = {min_correct}",
        f"max_false_abstentions = {max_false}",
    ]
    if comparison:
        lines += ["", "[comparison]", f"run = {json.dumps(comparison)}", f"alpha = {alpha}"]
    return "\n".join(lines) + "\n"
