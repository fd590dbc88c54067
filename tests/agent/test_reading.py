"""The scripted researcher's reading rules on hand-written evidence."""

import pytest

from agent.policies.reading import answer_type, decide, stem


@pytest.mark.parametrize("question, kind", [
    ("Is the code of X publicly released?", "polar"),
    ("Does X outperform Y on Z?", "polar"),
    ("How long does it take to train X?", "duration"),
    ("How many layers does X have?", "count"),
    ("How much does X improve over the strongest baseline on Z?", "improvement"),
    ("What learning rate is used to train X?", "quantity"),
    ("Which optimizer is used to train X?", "entity"),
])
def test_answer_types(question, kind):
    assert answer_type(question) == kind


def test_stems_meet_across_inflections():
    assert stem("trained") == stem("training") == stem("train")
    assert stem("compared") == stem("compare")


CASES = [
    ("What learning rate is used to train Acme?", ["We train Acme with AdamW and a learning rate of 3e-5 for 10 epochs."], "3e-5"),
    ("Which optimizer is used to train Acme?", ["We train Acme with AdamW and a learning rate of 3e-5 for 10 epochs."], "AdamW"),
    ("How many layers does the encoder of Acme have?", ["The encoder of Acme has 12 layers with 8 attention heads per layer."], "12"),
    ("Is the code of Acme publicly released?", ["We do not release the code of Acme because of licensing."], "No"),
    ("Is the code of Acme publicly released?", ["The code and models of Acme are publicly available."], "Yes"),
    ("Does Acme outperform Beta on SNLI?", ["On SNLI, Acme obtains 85.1 accuracy, compared with Beta 86.0, Gamma 80.2."], "No"),
    ("Does Acme outperform Beta on WMT?", ["On WMT, Acme obtains 12.0 perplexity, compared with Beta 14.5."], "Yes"),
    ("How much does Acme improve over the strongest baseline on SNLI?",
     ["On SNLI, Acme obtains 85.1 accuracy, compared with Beta 82.0, Gamma 83.6."], "By 1.5 accuracy points over Gamma."),
    ("Which datasets is Acme evaluated on?", ["We evaluate Acme on SNLI, MultiNLI and SciTail."], "SNLI, MultiNLI and SciTail"),
]


@pytest.mark.parametrize("question, sentences, answer", CASES)
def test_answers_from_evidence(question, sentences, answer):
    assert decide(question, sentences).answer == answer


@pytest.mark.parametrize("question, sentences", [
    ("What batch size is used to train Acme?", ["The batch size was tuned on the development set.", "The encoder of Acme has a hidden size of 512."]),
    ("How many attention heads does Acme use?", ["The attention layers of Acme follow the standard multi-head design."]),
    ("How long does it take to train Acme?", ["Training Acme fits comfortably on one GPU."]),
    ("What accuracy does Acme reach on SciTail?", ["On SNLI, Acme obtains 85.1 accuracy."]),
])
def test_abstains_when_the_evidence_does_not_answer(question, sentences):
    decision = decide(question, sentences)
    assert decision.answer is None and decision.reason


def test_a_name_in_the_title_need_not_be_in_every_sentence():
    sentences = ["The experiments cover English, German and Hindi."]
    assert decide("Which languages does Acme cover?", sentences).answer is None
    assert decide("Which languages does Acme cover?", sentences, known="Acme: a model").answer == "English, German and Hindi"
