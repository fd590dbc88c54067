"""The scripted researcher's reading rules on hand-written evidence."""

import pytest

from paper_explorer.agent.policies.reading import answer_type, clean, decide, marked_words, stem


@pytest.mark.parametrize(
    "question, kind",
    [
        ("Is the code of X publicly released?", "polar"),
        ("Does X outperform Y on Z?", "polar"),
        ("How long does it take to train X?", "duration"),
        ("How many layers does X have?", "count"),
        ("How much does X improve over the strongest baseline on Z?", "improvement"),
        ("What learning rate is used to train X?", "quantity"),
        ("Which optimizer is used to train X?", "entity"),
    ],
)
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
    (
        "How much does Acme improve over the strongest baseline on SNLI?",
        ["On SNLI, Acme obtains 85.1 accuracy, compared with Beta 82.0, Gamma 83.6."],
        "By 1.5 accuracy points over Gamma.",
    ),
    ("Which datasets is Acme evaluated on?", ["We evaluate Acme on SNLI, MultiNLI and SciTail."], "SNLI, MultiNLI and SciTail"),
]


@pytest.mark.parametrize("question, sentences, answer", CASES)
def test_answers_from_evidence(question, sentences, answer):
    assert decide(question, sentences).answer == answer


@pytest.mark.parametrize(
    "question, sentences",
    [
        (
            "What batch size is used to train Acme?",
            ["The batch size was tuned on the development set.", "The encoder of Acme has a hidden size of 512."],
        ),
        ("How many attention heads does Acme use?", ["The attention layers of Acme follow the standard multi-head design."]),
        ("How long does it take to train Acme?", ["Training Acme fits comfortably on one GPU."]),
        ("What accuracy does Acme reach on SciTail?", ["On SNLI, Acme obtains 85.1 accuracy."]),
    ],
)
def test_abstains_when_the_evidence_does_not_answer(question, sentences):
    decision = decide(question, sentences)
    assert decision.answer is None and decision.reason


def test_a_name_in_the_title_need_not_be_in_every_sentence():
    sentences = ["The experiments cover English, German and Hindi."]
    assert decide("Which languages does Acme cover?", sentences).answer is None
    assert decide("Which languages does Acme cover?", sentences, known="Acme: a model").answer == "English, German and Hindi"


# Real papers' prose: markup to read past, names in code, numbers in words, and evidence that is
# about the paper but not about what the question asks. Hand-written sentences, none from a corpus.


def test_markup_is_read_past():
    text = "Foo uses `Bar` [@bar2020; @baz2021] and [Qux](https://qux.org) \\autoref{fig:1}, see @smith2019."
    assert clean(text) == "Foo uses Bar and Qux, see."
    assert marked_words(text) == {"bar"}


REAL_CASES = [
    ("Which database does Foo use to store results?", ["Foo stores all results in an `SQLite` database [@smith2020]."], "SQLite"),
    ("Which library does Foo use for plotting?", ["Plots in Foo are drawn with `matplotlib` [@hunter2007]."], "matplotlib"),
    ("Which framework is Foo built on?", ["`Foo` is built on the `Bar` framework [@bar2021]."], "Bar"),
    ("How many solvers does Foo provide?", ["Foo provides three different solvers for stiff systems."], "three"),
    ("When was Foo first released?", ["Foo was first released on 3 March 2019 under an open licence."], "3 March 2019"),
    ("Who develops Foo?", ["Foo is developed at the University of Bergen."], "University of Bergen"),
    ("What license is Foo released under?", ["Foo is released under the MIT license."], "MIT"),
]


@pytest.mark.parametrize("question, sentences, answer", REAL_CASES)
def test_short_spans_from_real_prose(question, sentences, answer):
    assert decide(question, sentences, known="Foo: a tool").answer == answer


def test_abstains_when_neither_the_thing_asked_for_nor_most_of_the_question_is_there():
    decision = decide("Which sequencing platform produced the Foo samples?", ["The Foo samples were collected from human skin."])
    assert decision.answer is None and decision.reason


def test_the_paper_name_alone_is_no_evidence():
    # Every sentence of a paper names it; a sentence with nothing else of the question answers nothing.
    decision = decide("What license is foo-lib released under?", ["foo-lib reads tables from `Arrow` files."], known="foo-lib: tables")
    assert decision.answer is None
