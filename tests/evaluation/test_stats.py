"""Statistics on hand-worked tables."""

import pytest
from scipy import stats as scipy_stats

from paper_explorer.evaluation.compare import mcnemar
from paper_explorer.evaluation.records import AbstentionTable, FisherTest, MeanInterval
from paper_explorer.evaluation.stats import abstention_fisher, bootstrap_mean_ci, discordant_pairs, format_p, mcnemar_exact_p


def table(answerable, unanswerable) -> AbstentionTable:
    return AbstentionTable.model_validate(
        {
            "answerable": dict(zip(("answered", "abstained"), answerable)),
            "unanswerable": dict(zip(("answered", "abstained"), unanswerable)),
        }
    )


def test_fisher_on_the_reference_evaluations_shape():
    # trained policy: 2/20 correct abstentions; base model: 9/20
    trained, base = table((19, 1), (18, 2)), table((16, 4), (11, 9))
    result = abstention_fisher(trained, base, "unanswerable")
    assert isinstance(result, FisherTest) and result.table == [[2, 18], [9, 11]] and result.significant is None
    assert result.p_value == pytest.approx(scipy_stats.fisher_exact([[2, 18], [9, 11]]).pvalue)
    assert 0.02 < result.p_value < 0.04  # hand check: two-sided p = 0.0310
    assert abstention_fisher(trained, base, "unanswerable", alpha=0.05).significant is True
    assert abstention_fisher(trained, base, "unanswerable", alpha=0.01).significant is False
    identical = abstention_fisher(trained, trained, "answerable")
    assert identical.p_value == pytest.approx(1.0)


def test_fisher_with_a_zero_cell_has_no_infinite_odds_ratio():
    result = abstention_fisher(table((20, 0), (20, 0)), table((10, 10), (0, 20)), "unanswerable")
    assert result.odds_ratio in (0.0, None) and result.p_value < 1e-6


def test_exact_mcnemar_counts_only_discordant_pairs():
    a = [True] * 10 + [True] * 6 + [False] * 1 + [False] * 3
    b = [True] * 10 + [False] * 6 + [True] * 1 + [False] * 3
    result = mcnemar("exact match", a, b)
    assert (result.pairs, result.both, result.only_a, result.only_b, result.neither) == (20, 10, 6, 1, 3)
    assert result.p_value == pytest.approx(2 * sum(scipy_stats.binom.pmf(k, 7, 0.5) for k in range(0, 2)))  # 0.125
    assert mcnemar("exact match", [True, False], [True, False]).p_value == 1.0
    with pytest.raises(ValueError):
        mcnemar("exact match", [True], [True, False])


def test_bootstrap_interval_holds_the_mean_and_is_reproducible():
    values = [0.0, 1.0, 0.5, 1.0, 0.0, 1.0, 1.0, 0.25] * 5
    first, second = bootstrap_mean_ci(values, resamples=2000), bootstrap_mean_ci(values, resamples=2000)
    assert isinstance(first, MeanInterval) and first == second
    assert first.low is not None and first.mean is not None and first.high is not None and first.low < first.mean < first.high
    assert bootstrap_mean_ci([]) == MeanInterval(mean=None, low=None, high=None, confidence=0.95)
    assert bootstrap_mean_ci([0.5, 0.5]).low == 0.5


@pytest.mark.parametrize("only_a, only_b", [(0, 1), (1, 0), (3, 3), (6, 1), (1, 6), (0, 20), (17, 2), (40, 55), (0, 60)])
def test_mcnemar_p_is_scipys_two_sided_binomial_on_the_discordant_pairs(only_a, only_b):
    expected = scipy_stats.binomtest(only_a, only_a + only_b, 0.5, alternative="two-sided").pvalue
    assert mcnemar_exact_p(only_a, only_b) == pytest.approx(expected, rel=1e-12)
    assert mcnemar_exact_p(only_a, only_b) == pytest.approx(mcnemar_exact_p(only_b, only_a), rel=1e-12)  # symmetric
    assert mcnemar_exact_p(0, 0) == 1.0


def test_discordant_pairs_count_yes_in_one_run_only():
    abstained_a = [True, True, False, False, True, False]
    abstained_b = [True, False, True, False, False, False]
    assert discordant_pairs(abstained_a, abstained_b) == (2, 1)
    with pytest.raises(ValueError):
        discordant_pairs([True], [])


@pytest.mark.parametrize(
    "p_value, shown",
    [
        (0.0, "p < 1e-4"),
        (2 * 0.5**60, "p < 1e-4"),
        (9.99e-5, "p < 1e-4"),
        (1e-4, "p = 0.0001"),
        (2.345e-4, "p = 0.00023"),
        (0.031, "p = 0.031"),
        (0.125, "p = 0.125"),
        (1.0, "p = 1.000"),
        (None, "p = n/a"),
        (float("nan"), "p = n/a"),
    ],
)
def test_format_p_bounds_tiny_p_and_never_prints_zero(p_value, shown):
    assert format_p(p_value) == shown
    assert format_p(1e-6, floor=1e-3) == "p < 1e-3"


def test_the_answer_f1_interval_resamples_questions_not_the_samples_of_one():
    from paper_explorer.evaluation.scoring import EpisodeScore, run_metrics

    def score(question: int, sample: int, f1: float) -> EpisodeScore:
        return EpisodeScore(
            episode_id=f"q{question}#{sample}",
            question_id=f"q{question}",
            question="?",
            sample=sample,
            status="submitted",
            prediction="x",
            steps=2,
            tool_calls=1,
            tool_calls_before_end=1,
            flags=[],
            type="extractive",
            answerable=True,
            answer_f1=f1,
            exact_match=f1,
            sub_exact_match=f1,
            evidence_f1=0.0,
            evidence_f1_text_only=0.0,
            abstained=False,
        )

    f1s = [0.0, 1.0, 0.5, 0.25, 1.0, 0.0, 0.75, 0.5]
    once = run_metrics([score(q, 0, f1) for q, f1 in enumerate(f1s)]).interval("answer_f1")
    repeated = run_metrics([score(q, k, f1) for q, f1 in enumerate(f1s) for k in range(5)]).interval("answer_f1")
    assert repeated == once  # five identical samples per question are one observation, not five
