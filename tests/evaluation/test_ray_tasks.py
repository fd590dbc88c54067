"""What the Ray driver decides without a cluster: how many episodes a task carries, what a task's
result must be before a line of it is written, and what makes a node unlike the driver.
(tests/test_ray.py runs the whole of it on a cluster.)"""

from __future__ import annotations

import pytest

from paper_explorer import EvalConfig, evaluate
from paper_explorer.evaluation.errors import EvaluationError
from paper_explorer.evaluation.ray_tasks import Identity, _checked, chunk_size


@pytest.fixture(scope="module")
def episodes(tmp_path_factory):
    """Three real trajectories."""
    return evaluate(EvalConfig(limit=3), out=tmp_path_factory.mktemp("ray-tasks") / "run").trajectories


class _Question:
    def __init__(self, id: str) -> None:
        self.id = id


def _units(trajectories):
    return [(_Question(t.question_id), t.sample) for t in trajectories]


def test_a_task_carries_one_round_of_episodes_in_flight_until_the_run_is_long():
    assert chunk_size(24, concurrency=1, cpus=2) == 1  # a small run: the log grows episode by episode
    assert chunk_size(24, concurrency=4, cpus=2) == 4
    assert chunk_size(1600, concurrency=1, cpus=2) == 8  # quick episodes: fewer tasks, capped
    assert chunk_size(30_000, concurrency=64, cpus=16) == 64 * 3  # 3 rounds leave each CPU its 8 tasks
    assert chunk_size(0, concurrency=3, cpus=0) == 3


def test_a_task_result_is_its_chunk_and_nothing_else(episodes):
    trajectories = episodes
    units = _units(trajectories)
    assert _checked(list(reversed(trajectories)), units) == list(reversed(trajectories))  # any order
    with pytest.raises(EvaluationError, match="asked 3 episodes and returned 2"):
        _checked(trajectories[:2], units)
    with pytest.raises(EvaluationError, match=f"question {trajectories[2].question_id} sample 0"):
        _checked(trajectories, units[:2])  # one it was not given
    with pytest.raises(EvaluationError, match=f"returned 4, not the same .first difference: question {trajectories[0].question_id}"):
        _checked([*trajectories, trajectories[0]], units)  # one twice
    with pytest.raises(EvaluationError, match="returned dict, not the trajectories of its 3 episodes"):
        _checked({"forged": True}, units)


def test_a_node_unlike_the_driver_is_named_by_what_differs():
    driver = Identity({"paper-explorer": "0.9", "torch": "2.13.0"}, "abc", "seccomp+netns")
    assert driver.differences(driver) == []
    node = Identity({"paper-explorer": "0.8", "ray": "2.60.0"}, None, "language-only")
    assert driver.differences(node) == [
        "paper-explorer 0.8 (driver 0.9)",
        "ray 2.60.0 (driver missing)",
        "torch missing (driver 2.13.0)",
        "git commit none (driver abc)",
        "sandbox isolation 'language-only' (the run's manifest: 'seccomp+netns')",
    ]
