"""The episode loop: every status reachable, determinism, the baselines' behaviour, the log."""

import json

import pytest

from paper_explorer.agent.config import RunConfig, load_config
from paper_explorer.agent.errors import AgentError
from paper_explorer.agent.policies import Policy, PolicyError, Reply, make_config, make_policy
from paper_explorer.agent.policies.base import ContextExceeded, action
from paper_explorer.agent.runner import EpisodeRunner
from paper_explorer.agent.trajectory import EpisodeConfig, Trajectory, without_timings
from paper_explorer.agent.writer import TrajectoryLog, read_trajectories, repair
from paper_explorer.corpus import BM25Index


class Fixed(Policy):
    """Plays fixed replies, one per step (the last one forever)."""

    name = "fixed"

    def __init__(self, *replies, error=None):
        self.replies, self.error = replies, error

    def act(self, messages):
        if self.error is not None:
            raise self.error
        step = sum(1 for m in messages if m["role"] == "assistant")
        return Reply(self.replies[min(step, len(self.replies) - 1)])


@pytest.fixture(scope="module")
def index(small_demo):
    return BM25Index.build(small_demo)


@pytest.fixture
def run(small_demo, index):
    def run(policy, question=None, **config):
        question = question or small_demo.questions[0]
        runner = EpisodeRunner(small_demo, index, policy, EpisodeConfig(**config))
        return runner.run(question.text, question)

    return run


def test_submitted_and_abstained(run):
    submitted = run(Fixed(action('submit("3e-5", evidence=[])')))
    assert submitted.outcome.status == "submitted" and submitted.outcome.answer == "3e-5"
    assert submitted.isolation in ("language-only",) or submitted.isolation.startswith("seccomp")
    abstained = run(Fixed(action('abstain("not in the papers")')))
    assert abstained.outcome.status == "abstained" and abstained.outcome.reason == "not in the papers"


def test_step_limit(run):
    trajectory = run(Fixed(action("search('learning rate', k=1)")), max_steps=3)
    assert trajectory.outcome.status == "step_limit" and len(trajectory.steps) == 3


def test_context_limit_from_the_budget_and_from_the_policy(run):
    flood = Fixed(action("print('x' * 3000)"))
    trajectory = run(flood, context_chars=8_000, observation_chars=4_000)
    assert trajectory.outcome.status == "context_limit" and "budget" in trajectory.outcome.reason
    said = run(Fixed(error=ContextExceeded("prompt of 40000 tokens exceeds 32768")))
    assert said.outcome.status == "context_limit" and "32768" in said.outcome.reason


def test_policy_errors_end_the_episode_not_the_run(run):
    for error in (PolicyError("server returned 500"), RuntimeError("bug in the policy")):
        trajectory = run(Fixed(error=error))
        assert trajectory.outcome.status == "policy_error" and str(error) in trajectory.outcome.reason
        assert trajectory.steps == []


def test_format_errors_and_cut_observations_are_recorded(run):
    trajectory = run(Fixed("I think the answer is 3e-5.", action("print('y' * 5000)"), action("abstain('no')")), observation_chars=1_000)
    first, second, _ = trajectory.steps
    assert first.format_error and first.code is None and "```python" in first.observation
    assert second.observation_chars_cut > 0 and len(second.observation) <= 1_000
    assert "[observation cut:" in second.observation


def test_an_episode_of_floods_keeps_its_records_within_its_budgets_and_says_where_it_cut(run):
    """Issue 31: 500 calls an action recorded 4.7 MB of arguments, 47 MB an episode, in the trajectory
    and in memory; now each action's and each episode's records have a budget, in the config."""
    flood = "q = '\\U0001F600' * 990\nfor i in range(500):\n    try:\n        submit('x' * 1990, evidence=[q] * 7)\n    except ToolError:\n        pass"
    trajectory = run(Fixed(action(flood)), max_steps=8, record_kb=64, episode_record_kb=200)
    assert trajectory.config.record_kb == 64 and trajectory.config.episode_record_kb == 200
    limits = [step.limit_hit for step in trajectory.steps]
    assert limits[:2] == ["records", "records"] and limits[-1] == "episode_records"
    for step in trajectory.steps:
        assert f"Limit hit: {step.limit_hit}." in step.observation and step.tool_calls[-1].error.startswith("not run:")
    recorded = sum(len(call.model_dump_json().encode()) for step in trajectory.steps for call in step.tool_calls)
    assert recorded <= 200 * 1024 + 1_000 * len(trajectory.steps)  # past the budget, one short record per action


def test_messages_rebuild_the_conversation_with_the_tool_page_once(run):
    trajectory = run(make_policy(make_config("scripted")))
    messages = trajectory.messages()
    assert [m["role"] for m in messages[:2]] == ["system", "user"]
    assert len(messages) == 2 + 2 * len(trajectory.steps)
    assert sum(m["content"].count("## search(") for m in messages) <= 1


@pytest.mark.parametrize("name", ["scripted", "direct-submit", "single-shot-rag", "read-all"])
def test_two_runs_give_identical_trajectories(run, small_demo, name):
    question = small_demo.questions[3]
    first, second = run(make_policy(make_config(name)), question), run(make_policy(make_config(name)), question)
    assert without_timings(first) == without_timings(second)


def test_direct_submit_never_calls_a_tool_and_scripted_does(run, small_demo):
    for question in small_demo.questions[:10]:
        direct = run(make_policy(make_config("direct-submit")), question)
        assert len(direct.steps) == 1 and [c.name for c in direct.steps[0].tool_calls] == ["submit"]
        scripted = run(make_policy(make_config("scripted")), question)
        names = [c.name for s in scripted.steps for c in s.tool_calls]
        assert names[:3] == ["search", "read", "extract"] and names[-1] in ("submit", "abstain")


def test_read_all_reads_section_by_section_within_the_step_limit(run):
    trajectory = run(make_policy(make_config("read-all"), max_steps=10), max_steps=10)
    reads = [c for s in trajectory.steps for c in s.tool_calls if c.name == "read" and c.arguments.get("section") is not None]
    assert [c.arguments["section"] for c in reads] == list(range(len(reads))) and len(reads) >= 3
    assert trajectory.outcome.status in ("submitted", "abstained")


def test_replay_reproduces_and_reports_drift(run, small_demo, tmp_path, tiny_tokenizer):
    original = run(make_policy(make_config("scripted")))
    path = tmp_path / "t.jsonl"
    with TrajectoryLog(path) as log:
        log.append(original)
    replayed = run(make_policy(make_config("replay", replay=path)))
    assert without_timings(replayed)["steps"][0]["action_text"] == original.steps[0].action_text
    assert all(s.policy_info.previous_observation_matches is not False for s in replayed.steps)
    assert replayed.outcome == original.outcome
    from paper_explorer.agent.parity import check_trajectory
    from paper_explorer.agent.renderer import ChatRenderer

    assert check_trajectory(replayed, ChatRenderer.from_directory(tiny_tokenizer)) is None
    # drift: the recording says the first search saw something else
    data = json.loads(original.model_dump_json())
    data["steps"][0]["observation"] = "Out: []"
    path.write_text(json.dumps(data) + "\n")
    drifted = run(make_policy(make_config("replay", replay=path)))
    assert drifted.steps[1].policy_info.previous_observation_matches is False
    assert drifted.steps[1].policy_info.drift.position >= 0
    assert replayed.steps[-1].policy_info.final_observation_matches is True
    # drift in the last observation (after submit) is caught too
    data = json.loads(original.model_dump_json())
    data["steps"][-1]["observation"] = "Out: 'something else'"
    path.write_text(json.dumps(data) + "\n")
    last = run(make_policy(make_config("replay", replay=path)))
    assert last.steps[-1].policy_info.final_observation_matches is False and last.steps[-1].policy_info.final_drift is not None


def test_replay_without_a_recording_for_the_question_is_a_policy_error(run, small_demo, tmp_path):
    original = run(make_policy(make_config("scripted")), small_demo.questions[0])
    path = tmp_path / "t.jsonl"
    with TrajectoryLog(path) as log:
        log.append(original)
    other = run(make_policy(make_config("replay", replay=path)), small_demo.questions[5])
    assert other.outcome.status == "policy_error" and "no episode" in other.outcome.reason


def test_unknown_policy_is_a_usage_error():
    with pytest.raises(AgentError, match="unknown policy 'gpt'"):
        load_config(RunConfig, None, {"policy.name": "gpt"})
    with pytest.raises(AgentError, match=r"needs policy\.replay"):
        make_policy(make_config("replay"))


def test_log_appends_whole_lines_and_repairs_a_torn_tail(run, tmp_path):
    path = tmp_path / "log.jsonl"
    trajectory = run(Fixed(action("abstain('no')")))
    with TrajectoryLog(path) as log:
        log.append(trajectory)
        log.append(trajectory)
    whole = path.read_bytes()
    path.write_bytes(whole + whole[:137])  # a kill in the middle of the third line
    assert repair(path) == 137 and path.read_bytes() == whole
    assert [t.episode_id for t in read_trajectories(path)] == [trajectory.episode_id] * 2
    assert isinstance(read_trajectories(path)[0], Trajectory)


@pytest.mark.parametrize(
    "content, message",
    [
        (b'{"schema_version": 1}\n', "not a trajectory"),
        (b"not json\n", "not JSON"),
        (b'{"a": 1}', "torn last line"),
    ],
)
def test_bad_trajectory_files_are_one_clear_error(tmp_path, content, message):
    path = tmp_path / "bad.jsonl"
    path.write_bytes(content)
    with pytest.raises(AgentError, match=message):
        read_trajectories(path)
