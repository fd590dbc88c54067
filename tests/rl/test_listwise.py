"""Listwise RL of a reranker: Plackett-Luce, NDCG, the leave-one-out baseline, and a run of
explorer rl-rerank with the tiny model on the demo corpus's gold evidence."""

from __future__ import annotations

import itertools
import json
import math

import pytest
import torch

from paper_explorer.decisions.rerank_gold import Candidates, ndcg
from paper_explorer.rl.listwise import listwise_loss, option_kl, plackett_luce_logprob, sample_rankings
from tests.conftest import run_cli


def test_plackett_luce_is_a_distribution_over_rankings_and_sampling_draws_from_it():
    scores = torch.tensor([0.3, -1.0, 2.0, 0.5], dtype=torch.float64)
    total = sum(math.exp(plackett_luce_logprob(scores, torch.tensor(p))) for p in itertools.permutations(range(4)))
    assert total == pytest.approx(1.0, abs=1e-9)
    # the first place of a ranking is softmax(scores); the rest follow the same rule on what is left
    assert plackett_luce_logprob(scores, torch.tensor([2, 0, 3, 1])).item() == pytest.approx(
        math.log(torch.softmax(scores, 0)[2])
        + math.log(torch.softmax(scores[[0, 3, 1]], 0)[0])
        + math.log(torch.softmax(scores[[3, 1]], 0)[0])
    )
    drawn = sample_rankings(scores, 40_000, torch.Generator().manual_seed(0))
    first = torch.bincount(drawn[:, 0], minlength=4).double() / drawn.shape[0]
    assert first.tolist() == pytest.approx(torch.softmax(scores, 0).tolist(), abs=0.01)
    assert all(sorted(row.tolist()) == [0, 1, 2, 3] for row in drawn[:100])


def test_ndcg_and_recall_by_hand():
    """Binary gains; the ideal puts every gold paragraph first, found by BM25 or not; the best annotator's."""
    assert ndcg(["a", "x", "y"], [{"a"}], 5) == 1.0
    assert ndcg(["x", "a", "y", "b"], [{"a", "b"}], 5) == pytest.approx((1 / math.log2(3) + 1 / math.log2(5)) / (1 + 1 / math.log2(3)))
    assert ndcg(["x", "y", "a"], [{"a"}], 2) == 0.0
    assert ndcg(["x", "a"], [{"a", "b"}, {"a"}], 5) == pytest.approx(1 / math.log2(3))  # the second annotator's is higher
    question = Candidates("q", ["x", "a", "b"], [{"a", "b", "c", "d"}])
    assert question.recall([0, 1, 2], 1) == 0.0 and question.recall([1, 2, 0], 5) == 0.5
    assert question.reward([2, 1, 0], 5) == ndcg(["b", "a", "x"], question.golds, 5)


def test_option_kl_is_zero_for_the_same_distribution_and_positive_otherwise():
    p = torch.log_softmax(torch.tensor([[1.0, 0.0, -1.0], [0.0, 0.0, 0.0]]), -1)
    assert option_kl(p, p).item() == pytest.approx(0.0, abs=1e-7)
    assert option_kl(p, torch.log_softmax(torch.zeros(2, 3), -1)).item() > 0


def test_the_loss_moves_relevant_items_to_the_top():
    """Gradient steps on the listwise loss, with scores as free parameters, rank the relevant first."""
    question = Candidates("q", ["p0", "p1", "p2", "p3", "p4", "p5"], [{"p2", "p4"}])
    scores = torch.zeros(6, requires_grad=True)
    optimizer = torch.optim.SGD([scores], lr=0.5)
    generator = torch.Generator().manual_seed(1)
    for _ in range(200):
        rankings = sample_rankings(scores, 16, generator)
        loss, advantages = listwise_loss(scores, [question.reward(r.tolist()) for r in rankings], rankings, 0.0, None)
        assert sum(advantages) == pytest.approx(0.0, abs=1e-9)  # leave-one-out advantages of a group sum to 0
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    top_two = set(torch.argsort(scores, descending=True)[:2].tolist())
    assert top_two == {2, 4}


def test_rl_rerank_trains_an_adapter_that_decide_loads(tmp_path, tiny_model):
    out = tmp_path / "rerank"
    done = run_cli(
        "rl-rerank", "--model", str(tiny_model), "--steps", "2", "--queries-per-step", "2", "--candidates", "4", "--samples", "4",
        "--validation-queries", "2", "--threads", "1", "--out", str(out),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    steps = [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]
    assert [step["step"] for step in steps] == [1, 2]
    assert steps[0]["kl"] == pytest.approx(0.0, abs=1e-6)  # a new adapter starts as the reference
    assert all(0 <= step["reward"] <= 1 and math.isfinite(step["loss"]) for step in steps)
    validation = json.loads((out / "validation.json").read_text())
    assert set(validation["after"]["reranked"]) == {"ndcg@5", "recall@1", "recall@5"}
    assert validation["before"]["bm25"] == validation["after"]["bm25"]  # BM25's order does not train
    assert (out / "adapter" / "adapter_config.json").exists()
    again = run_cli("rl-rerank", "--model", str(tiny_model), "--steps", "1", "--out", str(out))
    assert again.returncode == 2 and "--force" in again.stderr
    from tests.decisions.decision_files import write_decisions

    file = write_decisions(tmp_path / "decisions.jsonl")
    decided = run_cli("decide", str(file), "--model", str(tiny_model), "--adapter", str(out / "adapter"), "--out", str(tmp_path / "decide"))
    assert decided.returncode == 0, decided.stderr
