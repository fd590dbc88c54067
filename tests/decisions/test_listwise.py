"""The listwise trainer of the reranker: Plackett-Luce rankings, NDCG@5, leave-one-out, KL; and
``explorer rerank-train`` as a user runs it with the tiny model."""

from __future__ import annotations

import itertools
import json
import math

import pytest

from paper_explorer.decisions.listwise import Candidates, ndcg
from tests.conftest import run_cli

torch = pytest.importorskip("torch")


def test_plackett_luce_probabilities_of_every_ranking_sum_to_one_and_factorise():
    from paper_explorer.decisions.listwise import plackett_luce_logprob

    scores = torch.tensor([0.3, -1.0, 2.0])
    total = sum(math.exp(float(plackett_luce_logprob(scores, torch.tensor(p)))) for p in itertools.permutations(range(3)))
    assert total == pytest.approx(1.0)
    weights = scores.exp()
    by_hand = weights[2] / weights.sum() * weights[0] / (weights[0] + weights[1])  # 2 first, then 0, then 1
    assert float(plackett_luce_logprob(scores, torch.tensor([2, 0, 1]))) == pytest.approx(math.log(float(by_hand)), abs=1e-6)


def test_gumbel_sorted_samples_draw_the_first_place_by_softmax():
    from paper_explorer.decisions.listwise import sample_rankings

    scores = torch.tensor([1.0, 0.0, -1.0, 0.5])
    rankings = sample_rankings(scores, 20_000, torch.Generator().manual_seed(0))
    assert sorted(rankings[0].tolist()) == [0, 1, 2, 3]
    first = torch.bincount(rankings[:, 0], minlength=4).double() / len(rankings)
    assert first.tolist() == pytest.approx(torch.softmax(scores.double(), 0).tolist(), abs=0.015)


def test_ndcg_takes_the_best_annotator_and_binary_gains():
    assert ndcg(["g1", "x", "g2"], [{"g1", "g2"}]) == pytest.approx((1 + 1 / math.log2(4)) / (1 + 1 / math.log2(3)))
    assert ndcg(["x", "g1"], [{"g1"}, {"x"}]) == 1.0
    assert ndcg(["x", "y"], [{"g"}]) == 0.0
    question = Candidates("q", ["a", "b", "c"], [{"c"}])
    assert question.reward([2, 0, 1]) == 1.0 and question.learnable
    assert not Candidates("q", ["a"], [{"c"}]).learnable


def test_training_raises_the_gold_passages_score_against_the_others(tiny_model):
    """On one question, steps of the listwise loss move the gold passage up the model's scores."""
    from paper_explorer.decisions.backends import LocalBackend
    from paper_explorer.decisions.listwise import ListwiseSettings, relevance_scores, train_listwise
    from paper_explorer.decisions.rerank import Reranker

    reranker = Reranker(LocalBackend.load(str(tiny_model), threads=1))
    passages = ["The learning rate is 3e-4.", "We use news text.", "Results improve by two points.", "The model has six layers."]
    question = Candidates("What learning rate is used?", passages, [{passages[0]}])

    def margin() -> float:
        with torch.no_grad():
            scores = relevance_scores(reranker, question.query, passages)
        return float(scores[0] - scores[1:].max())

    before = margin()
    settings = ListwiseSettings(steps=8, queries_per_step=1, samples=6, beta=0.01, learning_rate=5e-3)
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as scratch:
        summary = train_listwise(reranker, [question], [question], settings, Path(scratch))
        steps = [json.loads(line) for line in (Path(scratch) / "steps.jsonl").read_text().splitlines()]
        assert (Path(scratch) / "adapter" / "adapter_config.json").exists()
    assert margin() > before
    assert len(steps) == 8 and all(step["kl"] >= 0 and math.isfinite(step["loss"]) for step in steps)
    assert summary["without_gold_in_candidates"] == 0


def test_rerank_train_writes_an_adapter_and_says_what_it_changed(tmp_path, tiny_model):
    out = tmp_path / "listwise"
    done = run_cli(
        "rerank-train", "--model", str(tiny_model), "--out", str(out), "--questions", "4", "--held-out", "2",
        "--depth", "5", "--steps", "2", "--samples", "3", "--threads", "1",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "held-out NDCG@5" in done.stdout and (out / "adapter" / "adapter_model.safetensors").exists()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["settings"]["samples"] == 3 and summary["held_out_questions"] == 2
    again = run_cli("rerank-train", "--model", str(tiny_model), "--out", str(out))
    assert again.returncode == 2 and "not empty" in again.stderr
