"""Answer metrics with the semantics of QASPER's official evaluator (``qasper_evaluator.py``), and
the long-context benchmarks' own (LongBench's ``metrics.py``, HotpotQA's F1 as MemAgent scores it).

A prediction is scored against each annotator's reference (``Answer.reference_text``: the
extractive spans joined with ", ", the free-form answer, "Yes"/"No", or "Unanswerable") and
keeps the best. An abstention is the prediction "Unanswerable". A benchmark question's references
are its answers, one free-form ``Answer`` each; keeping the best over them is LongBench's
``eval.py`` scorer (MemAgent's ``ruler_hqa.py`` scores only the first: docs/statistics.md).

Each function here is tested against its upstream's code, kept verbatim in tests/evaluation/upstream/.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Callable

from paper_explorer.corpus.schema import Answer, Question

ABSTENTION = "Unanswerable"
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = set(string.punctuation)


def normalize_answer(text: str) -> str:
    """SQuAD's normalisation, as QASPER uses it: lower case, no punctuation, no articles, single spaces."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def token_f1(prediction: str, reference: str) -> float:
    """SQuAD's token F1 on normalised text: QASPER's ``token_f1_score`` and, token for token,
    LongBench's ``qa_f1_score`` (the metric of its English QA subsets)."""
    return _f1(normalize_answer(prediction).split(), normalize_answer(reference).split())


# HotpotQA's answers that are a decision, not a span: only the same decision earns credit.
HOTPOTQA_DECISIONS = ("yes", "no", "noanswer")


def hotpotqa_f1(prediction: str, reference: str) -> float:
    """HotpotQA's answer F1 (its ``hotpot_evaluate_v1.py``, as MemAgent's ``utils.f1_score`` scores
    HotpotQA): the token F1 above, except that when either side normalises to "yes", "no" or
    "noanswer" and the other does not normalise to the same, it scores 0 ("yes, it was" against
    "yes" earns nothing, where ``token_f1`` gives it 0.5)."""
    predicted, gold = normalize_answer(prediction), normalize_answer(reference)
    if (predicted in HOTPOTQA_DECISIONS or gold in HOTPOTQA_DECISIONS) and predicted != gold:
        return 0.0
    return _f1(predicted.split(), gold.split())


def _f1(predicted: list[str], gold: list[str]) -> float:
    common = Counter(predicted) & Counter(gold)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(predicted), same / len(gold)
    return 2 * precision * recall / (precision + recall)


def exact_match(prediction: str, reference: str) -> float:
    """Equal after normalisation: QASPER's and MemAgent's ``exact_match_score``."""
    return float(normalize_answer(prediction) == normalize_answer(reference))


def references(question: Question) -> list[str]:
    return [text for answer in question.answers if (text := answer.reference_text) is not None]


def best_over_references(metric: Callable[[str, str], float], prediction: str, question: Question) -> float:
    """The metric against every annotator's reference, keeping the maximum (0 when none exist)."""
    return max((metric(prediction, reference) for reference in references(question)), default=0.0)


def sub_exact_match(prediction: str, reference: str) -> float:
    """SubEM, ours ("SubEM (whole tokens)", key ``sub_exact_match``): bidirectional containment
    after normalisation, in whole tokens: the prediction holds the reference as a run of whole
    tokens, or lies inside it so. "1" is not found in "10". Empty (or empty after normalisation)
    on either side scores zero. Stricter than ``substring_exact_match``, never looser."""
    predicted, gold = normalize_answer(prediction), normalize_answer(reference)
    if not predicted or not gold:
        return 0.0
    return float(_contains(predicted, gold) or _contains(gold, predicted))


def substring_exact_match(prediction: str, reference: str) -> float:
    """The bidirectional SubEM that LongBench results are reported with, MemAgent's
    ``sub_exact_match_score`` ("SubEM (substring, LongBench)", key ``sub_exact_match_substring``):
    after the same normalisation, the prediction contains the reference or is contained in it as
    a *character* substring, so "1" counts inside "10" and "cat" inside "concatenate".
    Unlike upstream, empty (or empty after normalisation: whitespace, punctuation or an article
    only) on either side scores zero. Their code finds "" inside every string, so an empty answer
    would match every reference, and every answer a reference that normalises to nothing; an empty
    answer is no answer (the issue's rule: empty or invalid answers score zero)."""
    predicted, gold = normalize_answer(prediction), normalize_answer(reference)
    if not predicted or not gold:
        return 0.0
    return float(gold in predicted or predicted in gold)


def _contains(text: str, part: str) -> bool:
    """Whole-token containment, so "1" is not found inside "10"."""
    return f" {part} " in f" {text} "


FLOAT_SELECTED = "FLOAT SELECTED"


def reference_evidence(answer: Answer, text_evidence_only: bool = False) -> list[str]:
    """An annotator's gold evidence paragraphs; the official evaluator drops figure/table
    evidence ("FLOAT SELECTED") only in its text-evidence-only mode."""
    if answer.kind == "none":
        return []
    return [text for text in answer.evidence if not (text_evidence_only and FLOAT_SELECTED in text)]


def paragraph_f1(predicted: list[str], gold: list[str]) -> float:
    """QASPER's paragraph_f1_score: exact strings; nothing predicted for nothing gold scores 1."""
    if not gold and not predicted:
        return 1.0
    same = len(set(gold) & set(predicted))
    if same == 0:
        return 0.0
    precision, recall = same / len(predicted), same / len(gold)
    return 2 * precision * recall / (precision + recall)


def answer_evidence_f1(evidence: list[str], question: Question, text_evidence_only: bool = False) -> float:
    """The best evidence F1 over the annotators who gave an answer (0 when none did), as the official evaluator."""
    scored = [answer for answer in question.answers if answer.reference_text is not None]
    return max((paragraph_f1(evidence, reference_evidence(a, text_evidence_only)) for a in scored), default=0.0)


def answer_type(prediction: str, question: Question) -> str | None:
    """The answer type of the annotator whose reference gives the best answer F1 (the first of
    ties), as the official evaluator reports it; None when no annotator has a reference."""
    scored = [(token_f1(prediction, text), answer.kind) for answer in question.answers if (text := answer.reference_text) is not None]
    if not scored:
        return None
    return sorted(scored, key=lambda pair: pair[0], reverse=True)[0][1]


def answer_and_evidence_f1(
    prediction: str, evidence: list[str], question: Question, text_evidence_only: bool = False
) -> tuple[float, float, str | None]:
    """As the official evaluator: the best answer F1 over annotators, with the answer type of the
    annotator that gives it (the first of ties), and - independently - the best evidence F1."""
    answer_f1 = best_over_references(token_f1, prediction, question)
    return answer_f1, answer_evidence_f1(evidence, question, text_evidence_only), answer_type(prediction, question)
