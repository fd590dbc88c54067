"""Trajectories -> examples: masks, filters, the split by paper, overflow, statistics."""

import pytest

from paper_explorer.agent.policies import make_config, make_policy
from paper_explorer.agent.policies.base import steps_taken
from paper_explorer.agent.renderer import ChatRenderer
from paper_explorer.agent.runner import EpisodeRunner
from paper_explorer.agent.trajectory import EpisodeConfig
from paper_explorer.corpus import BM25Index
from paper_explorer.sft.config import BuildConfig
from paper_explorer.sft.dataset import IGNORE, build, split_check, statistics, tokenize_trajectory
from paper_explorer.sft.teacher import Teacher

DIRECT = "best-of: it submits or abstains before any research result (a direct submit)"


@pytest.fixture(scope="module")
def renderer(tiny_tokenizer):
    return ChatRenderer.from_directory(tiny_tokenizer)


@pytest.fixture(scope="module")
def teacher_runs(small_demo):
    index = BM25Index.build(small_demo)
    teacher = EpisodeRunner(small_demo, index, Teacher(small_demo), EpisodeConfig())
    direct = EpisodeRunner(small_demo, index, Teacher(small_demo, direct=True), EpisodeConfig())
    questions = list(small_demo.questions)
    return [teacher.run(q.text, q) for q in questions], [direct.run(q.text, q) for q in questions[:10]]


def test_the_teacher_researches_then_answers_with_gold_evidence(teacher_runs, small_demo):
    trajectories, _ = teacher_runs
    gold = {q.id: q for q in small_demo.questions}
    for trajectory in trajectories:
        names = [c.name for s in trajectory.steps for c in s.tool_calls]
        assert names[:3] == ["search", "read", "extract"] and names[-1] in ("submit", "abstain")
        answerable = any(a.kind not in (None, "none") for a in gold[trajectory.question_id].answers)
        assert trajectory.outcome.status == ("submitted" if answerable else "abstained")
        if answerable:
            assert trajectory.outcome.evidence  # the gold paragraphs, resolved by the submit tool


def test_labels_are_exactly_the_assistant_messages(teacher_runs, renderer):
    trajectory = teacher_runs[0][0]
    example = tokenize_trajectory(trajectory, renderer)
    trained = [label for label in example.labels if label != IGNORE]
    expected = "".join(step.action_text + "<|im_end|>" for step in trajectory.steps)
    assert renderer.decode(trained) == expected
    assert example.input_ids == renderer.render(trajectory.messages()).ids  # the same tokens the policy was served
    assert [turn.type for turn in example.turns] == ["tool", "tool", "tool", "final"]


def test_filters_split_and_statistics(teacher_runs, renderer, small_demo):
    trajectories, direct = teacher_runs
    questions = {q.id: q for q in small_demo.questions}
    test_papers = frozenset(p.id for p in small_demo.papers if p.split == "test")
    built = build(trajectories, questions, renderer, BuildConfig(validation_share=0.3), test_papers)
    assert built.dropped["its paper belongs to the evaluation split"] == sum(
        1 for t in trajectories if questions[t.question_id].paper_id in test_papers
    )
    assert built.train and built.validation
    check = split_check(built, test_papers, frozenset(q.id for q in small_demo.questions if q.paper_id in test_papers))
    assert check.passed and not check.overlaps
    stats = statistics(built.train)
    assert stats.first_action_submits_share == 0.0 and stats.turns_per_trajectory == 4
    assert abs(sum(stats.trained_token_share.values()) - 1) < 1e-9
    shortcut = build(direct, questions, renderer, BuildConfig(validation_share=0.0))
    assert statistics(shortcut.train).first_action_submits_share == 1.0


def test_bad_outcomes_are_dropped_with_their_reason(renderer, small_demo):
    index = BM25Index.build(small_demo)
    runner = EpisodeRunner(small_demo, index, make_policy(make_config("direct-submit")), EpisodeConfig())
    questions = {q.id: q for q in small_demo.questions}
    built = build([runner.run(q.text, q) for q in small_demo.questions[:12]], questions, renderer, BuildConfig())
    assert set(built.dropped) <= {"answered an unanswerable question", "answer F1 below 0.5"} and sum(built.dropped.values()) >= 6


def test_long_examples_are_dropped_or_split_at_turn_boundaries_never_cut(teacher_runs, renderer, small_demo):
    trajectories, _ = teacher_runs
    questions = {q.id: q for q in small_demo.questions}
    full = tokenize_trajectory(trajectories[0], renderer)
    limit = full.turns[-1].end_of_turn - 1  # the final turn no longer fits
    dropped = build(trajectories[:1], questions, renderer, BuildConfig(max_length=limit, validation_share=0.0))
    assert dropped.dropped[f"longer than {limit} tokens"] == 1 and not dropped.train
    split = build(trajectories[:1], questions, renderer, BuildConfig(max_length=limit, overflow="split", validation_share=0.0))
    (example,) = split.train
    assert split.shortened == 1 and len(example.input_ids) <= limit and example.split_at_turn == 3
    assert example.input_ids == full.input_ids[: len(example.input_ids)]
    assert renderer.decode(example.input_ids[-1:]) == "\n"  # it ends after a whole turn


def test_equal_episode_ids_from_different_runs_are_both_kept(teacher_runs, renderer, small_demo):
    trajectories, _ = teacher_runs
    questions = {q.id: q for q in small_demo.questions}
    answered = next(t for t in trajectories if t.outcome.status == "submitted")
    other_run = answered.model_copy(update={"steps": answered.steps[:1] + answered.steps[1:]})
    other_run.steps[0] = other_run.steps[0].model_copy(update={"observation": other_run.steps[0].observation + " "})
    built = build([answered, other_run, answered], questions, renderer, BuildConfig(validation_share=0.0))
    assert len(built.train) == 2 and built.dropped["duplicate episode (the same trajectory twice)"] == 1


def test_best_of_keeps_the_best_attempts_and_never_a_first_action_answer(teacher_runs, renderer, small_demo):
    trajectories, direct = teacher_runs
    questions = {q.id: q for q in small_demo.questions}
    scripted = EpisodeRunner(small_demo, BM25Index.build(small_demo), make_policy(make_config("scripted")), EpisodeConfig())
    attempts = trajectories[:10] + direct + [scripted.run(q.text, q) for q in small_demo.questions[:10]]
    settings = BuildConfig(validation_share=0.0, min_answer_f1=0.0, best_of=1)
    built = build(attempts, questions, renderer, settings)
    assert built.dropped[DIRECT] == 10  # every direct attempt
    assert not any(example.first_action_submits for example in built.train)
    kept = {}
    for example in built.train:
        assert example.question_id not in kept  # one per question
        kept[example.question_id] = example.episode_id
    from paper_explorer.evaluation.answers import best_over_references, token_f1
    from paper_explorer.evaluation.scoring import prediction

    def f1(trajectory):
        return best_over_references(token_f1, prediction(trajectory), questions[trajectory.question_id])

    for question_id, episode_id in kept.items():  # no researched attempt of the question answered better
        chosen = next(t for t in attempts if t.episode_id == episode_id)
        rivals = [
            t
            for t in attempts
            if t.question_id == question_id
            and t.steps
            and len(t.steps[0].tool_calls)
            and t.steps[0].tool_calls[0].name not in ("submit", "abstain")
            and t.outcome.status == "submitted"
        ]
        if questions[question_id].answerable:
            assert all(f1(chosen) >= f1(rival) for rival in rivals)
    assert built.dropped["best-of: not among the best 1 attempts of its question"] >= 1


class HiddenShortcut(Teacher):
    """The direct teacher's answer, behind research in the same first action (``before``)."""

    def __init__(self, corpus, before):
        super().__init__(corpus)
        self.before = before

    def act(self, messages):
        code, thought = self._final()
        return self._reply(f"{self.before}\n{code}", thought)


class RetriedSubmit(Teacher):
    """The gold answer cited wrongly at first (the submit fails), then the teacher's research and answer."""

    def act(self, messages):
        if steps_taken(messages) == 0:
            return self._reply('submit("x", evidence=[["no-such-paper", 0, 0]])', "I answer at once.")
        return super().act(messages[:2] + messages[4:])  # the teacher's plan, one step later


class FailedReadFirst(Teacher):
    """A read that fails, then the answer: no research at all."""

    def act(self, messages):
        return self._reply('read("-")', "I read.") if steps_taken(messages) == 0 else self._reply(*self._final())


def test_a_first_action_that_ends_the_episode_is_a_first_action_answer_whatever_it_called_first(renderer, small_demo):
    index = BM25Index.build(small_demo)
    questions = {q.id: q for q in small_demo.questions}
    before = 'try:\n    read("-")\nexcept Exception:\n    pass\nfor query in ("a", "b"):\n    search(query, k=1)'
    hidden = EpisodeRunner(small_demo, index, HiddenShortcut(small_demo, before), EpisodeConfig())
    shortcut = [hidden.run(q.text, q) for q in small_demo.questions[:10]]
    assert all(len(t.steps) == 1 and t.steps[0].tool_calls[0].name == "read" for t in shortcut)
    built = build(shortcut, questions, renderer, BuildConfig(validation_share=0.0))
    assert built.train and statistics(built.train).first_action_submits_share == 1.0
    assert all([turn.type for turn in example.turns] == ["final"] for example in built.train)
    best = build(shortcut, questions, renderer, BuildConfig(validation_share=0.0, min_answer_f1=0.0, best_of=1))
    assert not best.train and best.dropped[DIRECT] == 10


def test_a_failed_submit_ends_nothing_and_an_answer_after_failed_calls_is_a_direct_submit(renderer, small_demo):
    index = BM25Index.build(small_demo)
    questions = {q.id: q for q in small_demo.questions}
    retried = [
        EpisodeRunner(small_demo, index, RetriedSubmit(small_demo), EpisodeConfig()).run(q.text, q) for q in small_demo.questions[:6]
    ]
    assert all(t.steps[0].tool_calls[0].error and t.outcome.status in ("submitted", "abstained") for t in retried)
    built = build(retried, questions, renderer, BuildConfig(validation_share=0.0, min_answer_f1=0.0, best_of=1))
    assert built.train and not any(example.first_action_submits for example in built.train)
    assert all([turn.type for turn in example.turns] == ["tool", "tool", "tool", "tool", "final"] for example in built.train)
    unlooked = [
        EpisodeRunner(small_demo, index, FailedReadFirst(small_demo), EpisodeConfig()).run(q.text, q) for q in small_demo.questions[:6]
    ]
    assert all(len(t.steps) == 2 and t.steps[0].tool_calls[0].error for t in unlooked)
    best = build(unlooked, questions, renderer, BuildConfig(validation_share=0.0, min_answer_f1=0.0, best_of=1))
    assert not best.train and best.dropped[DIRECT] == 6  # it answered after a read that showed nothing
    kept = build(unlooked, questions, renderer, BuildConfig(validation_share=0.0, min_answer_f1=0.0))
    assert statistics(kept.train).first_action_submits_share == 1.0
    assert all([turn.type for turn in example.turns] == ["tool", "final"] for example in kept.train)
