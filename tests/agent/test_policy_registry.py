"""The policy registry: a policy is one module (its config, its factory), the configs are one
union on ``name``, a setting of another policy is one line naming its flag and the policies it is
for, runs recorded with the old flat config still load, and the docs' example is a working policy."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path
from typing import Literal

import pytest
from pydantic import Field

from paper_explorer.agent import policy_registry
from paper_explorer.agent.config import EvalConfig, RunConfig, load_config
from paper_explorer.agent.errors import AgentError
from paper_explorer.agent.policies import Policy, PolicyConfig, PolicyError, make_config, make_policy, register_policy
from paper_explorer.agent.policies.base import EpisodeStart
from paper_explorer.agent.policies.scripted import Scripted
from paper_explorer.agent.runner import EpisodeRunner
from paper_explorer.agent.trajectory import EpisodeConfig
from paper_explorer.cli.flags import policy_flags
from paper_explorer.corpus import BM25Index
from tests.conftest import run_cli

ROOT = Path(__file__).resolve().parents[2]

# A manifest's [policy] as every run recorded it before the registry (commit 251b07f): every
# setting of every policy, those of the others at their defaults.
OLD_FLAT_POLICY = {
    "name": "scripted",
    "replay": None,
    "model": None,
    "adapter": None,
    "served_adapter": None,
    "quantization": "auto",
    "threads": None,
    "max_new_tokens": 512,
    "max_context": None,
    "base_url": None,
    "tokenizer": None,
    "api": "completions",
    "prompt_format": "ids",
    "timeout": 120.0,
    "retries": 4,
    "temperature": 0.0,
    "top_p": 1.0,
    "top_k": 0,
    "thinking": False,
    "thinking_budget": 1024,
    "backend": None,
    "scope": "search:3",
    "page_tokens": 5000,
    "memory_tokens": 1024,
    "answer_tokens": 256,
    "passes": 1,
    "outlines": True,
    "outline_sections": 24,
    "keep_sentinel": "<KEEP_MEMORY>",
    "token_budget": None,
    "preset": None,
}


@pytest.fixture
def registry(monkeypatch):
    """The registry as it is, restored after the test: what a test registers goes with it."""
    monkeypatch.setattr(policy_registry, "_registry", dict(policy_registry.registered()))
    monkeypatch.setattr(policy_registry, "_checked", set())
    policy_registry.union_adapter.cache_clear()
    yield policy_registry
    policy_registry.union_adapter.cache_clear()


def one_error_line(done) -> str:
    assert done.returncode == 2, (done.stdout, done.stderr)
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("error: ") and "Traceback" not in done.stderr
    return line


# -- names and stray settings ---------------------------------------------------------------------


def test_an_unknown_policy_says_the_nearest_one_and_every_choice(tmp_path):
    line = one_error_line(run_cli("run", "--policy", "scriptd"))
    assert "unknown policy 'scriptd' (did you mean 'scripted'?); choose one of direct-submit, hf," in line
    assert "field" not in line
    config = tmp_path / "run.toml"
    config.write_text('[policy]\nname = "memory_reader"\n')
    line = one_error_line(run_cli("run", "--config", str(config)))
    assert f"{config}: unknown policy 'memory_reader' (did you mean 'memory-reader'?)" in line and "field" not in line
    with pytest.raises(AgentError, match="did you mean 'openai'"):
        make_config("opneai")


@pytest.mark.parametrize(
    "args, said",
    [
        (["--thinking"], "--thinking is for --policy hf or openai, not 'scripted'"),
        (["--temperature", "0.5"], "--temperature is for --policy hf, memory-reader or openai, not 'scripted': it is deterministic"),
        (["-p", "read-all", "--model", "m"], "--model is for --policy hf, memory-reader or openai, not 'read-all'"),
        (["-p", "memory-reader", "--thinking"], "not 'memory-reader': it writes memories and an answer, not actions"),
        (["-p", "memory-reader", "--backend", "hf", "--base-url", "http://127.0.0.1:9/v1"], "--base-url is for --backend openai, not hf"),
        (["-p", "hf", "--tokenizer", "tok"], "not 'hf': it serves with its model's own tokenizer"),
        (["-p", "openai", "--replay", "x.jsonl"], "--replay is for --policy replay, not 'openai'"),
        (["-p", "hf", "--scope", "paper"], "--scope is for --policy memory-reader, not 'hf'"),
    ],
)
def test_a_setting_of_other_policies_is_one_line_naming_its_flag_and_their_names(args, said):
    assert said in one_error_line(run_cli("run", *args))


def test_a_setting_no_policy_has_says_the_nearest(tmp_path):
    config = tmp_path / "run.toml"
    config.write_text('[policy]\nname = "hf"\ntemprature = 0.5\n')
    assert "--temprature is no setting of any policy (did you mean --temperature?)" in one_error_line(
        run_cli("run", "--config", str(config))
    )


def test_a_setting_at_its_default_counts_as_not_given():
    assert make_config("scripted", thinking=False, temperature=0.0).model_dump() == {"name": "scripted", "tokenizer": None}
    with pytest.raises(AgentError, match=r"policy\.thinking is for policy\.name hf or openai"):
        make_config("scripted", thinking=True)


def test_each_policy_has_its_own_config_and_every_setting_has_one_flag():
    configs = {name: type(make_config(name)) for name in policy_registry.policy_names()}
    assert len(set(configs.values())) == len(configs) == 8
    assert "thinking" in configs["hf"].model_fields and "thinking" not in configs["scripted"].model_fields
    flags = {flag.dotted: flag for flag in policy_flags("policy.")}
    assert set(flags) == {f"policy.{name}" for name in policy_registry.setting_fields()} - {"policy.served_adapter"}
    assert flags["policy.max_new_tokens"].field.description.startswith("hf, memory-reader or openai: Tokens per action")
    assert flags["policy.scope"].panel == "Memory reader" and flags["policy.temperature"].panel == "Sampling"


def test_a_run_config_validates_the_table_by_its_name_and_writes_it_whole():
    config = EvalConfig(policy={"name": "openai", "base_url": "http://h/v1", "model": "m", "tokenizer": "t"})
    assert type(config.policy).__name__ == "OpenAIConfig" and config.policy.base_url == ["http://h/v1"]
    written = json.loads(config.model_dump_json())["policy"]
    assert written["retries"] == 4 and "scope" not in written
    assert EvalConfig.model_validate_json(config.model_dump_json()) == config
    schema = EvalConfig.model_json_schema()
    assert set(schema["properties"]["policy"]["discriminator"]["mapping"]) == set(policy_registry.policy_names())


# -- runs recorded before the registry ------------------------------------------------------------


@pytest.fixture(scope="module")
def old_run(tmp_path_factory):
    """A scripted run whose manifest records the policy as every run did before: the flat table."""
    runs = tmp_path_factory.mktemp("old")
    assert run_cli("eval", "--limit", "3", "--out", str(runs / "old")).returncode == 0
    manifest = json.loads((runs / "old" / "manifest.json").read_text())
    manifest["config"]["policy"] = OLD_FLAT_POLICY
    (runs / "old" / "manifest.json").write_text(json.dumps(manifest))
    return runs / "old"


def test_a_run_recorded_with_the_flat_policy_config_still_resumes_inspects_and_compares(old_run, tmp_path):
    resumed = run_cli("eval", "--out", str(old_run), "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert run_cli("inspect", str(old_run)).returncode == 0
    other = tmp_path / "new"
    assert run_cli("eval", "--limit", "3", "--out", str(other)).returncode == 0
    compared = run_cli("compare", str(old_run), str(other), "--json")
    assert compared.returncode == 0, compared.stderr


def test_a_flat_manifest_with_another_policys_setting_given_is_refused_naming_it(old_run, tmp_path):
    stray = tmp_path / "stray"
    stray.mkdir()
    for name in ("manifest.json", "trajectories.jsonl"):
        (stray / name).write_bytes((old_run / name).read_bytes())
    manifest = json.loads((stray / "manifest.json").read_text())
    manifest["config"]["policy"] = {**OLD_FLAT_POLICY, "thinking": True}
    (stray / "manifest.json").write_text(json.dumps(manifest))
    done = run_cli("eval", "--out", str(stray), "--resume")
    assert done.returncode == 2 and "--thinking is for --policy hf or openai, not 'scripted'" in done.stderr, done.stderr


# -- the scripted policy after a limit (issue 32, item 8) -------------------------------------------


def test_a_scripted_step_that_hit_a_limit_is_taken_again_not_read(tmp_path):
    done = run_cli("run", "--wall-seconds", "0.001", "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr
    (trajectory,) = [json.loads(line) for line in (tmp_path / "trajectories.jsonl").read_text().splitlines()]
    assert trajectory["outcome"]["status"] != "policy_error" and "no attribute" not in done.stdout
    scripted = Scripted()
    scripted.start(EpisodeStart(seed=0, question="How long does it take to train MetaFlow++?"))
    opening = [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}]
    search = scripted.act(opening)
    limited = [*opening, {"role": "assistant", "content": search.text}, {"role": "user", "content": "Limit hit: wall_clock."}]
    assert scripted.act(limited).text == search.text  # the search again, not an abstention read from no result


class Failing(Policy):
    name = "failing"

    def act(self, messages):
        raise PolicyError("it always fails")


class FailingConfig(PolicyConfig):
    name: Literal["failing"] = "failing"


def test_when_every_episode_fails_a_policy_without_a_server_is_not_told_to_fix_one(registry, tmp_path):
    register_policy(FailingConfig)(lambda config, max_steps: Failing())
    config = tmp_path / "failing.toml"
    config.write_text('[policy]\nname = "failing"\n')
    done = run_cli("eval", "--config", str(config), "--limit", "2", "--out", str(tmp_path / "run"))
    assert done.returncode != 0 and "ended in policy_error" in done.stderr
    assert "fix the policy, then run" in done.stderr and "server" not in done.stderr, done.stderr


# -- the registry's own checks --------------------------------------------------------------------


def test_the_registry_refuses_a_name_twice_a_setting_without_help_and_one_flag_of_two_types(registry):
    class Again(PolicyConfig):
        name: Literal["scripted"] = "scripted"

    with pytest.raises(TypeError, match="registered twice"):
        register_policy(Again)(lambda config, max_steps: Scripted())

    class Unsaid(PolicyConfig):
        name: Literal["unsaid"] = "unsaid"
        depth: int = 3

    with pytest.raises(TypeError, match="no description"):
        register_policy(Unsaid)

    class Clashing(PolicyConfig):
        name: Literal["clashing"] = "clashing"
        model: int = Field(1, description="A number, where others take a model's name.")

    register_policy(Clashing)(lambda config, max_steps: Scripted())
    with pytest.raises(TypeError, match="share one flag \\(--model\\)"):
        policy_registry.registered()


# -- the docs' example ----------------------------------------------------------------------------


def docs_block(page: Path, file_name: str) -> str:
    found = re.search(rf"^```python {re.escape(file_name)}\n(.*?)^```", page.read_text(), re.MULTILINE | re.DOTALL)
    assert found, f"{page} shows no {file_name}"
    return found.group(1)


def test_the_docs_example_is_a_whole_policy_in_one_file(registry, tmp_path, small_demo, monkeypatch):
    module = tmp_path / "first_hit.py"
    module.write_text(docs_block(ROOT / "docs" / "extending.md", "plugins/first_hit.py"))
    spec = importlib.util.spec_from_file_location("first_hit", module)
    assert spec and spec.loader
    loaded = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "first_hit", loaded)
    spec.loader.exec_module(loaded)  # registers it: nothing else is edited

    config = load_config(RunConfig, None, {"policy.name": "first-hit", "policy.hits": 2}).policy
    question = small_demo.questions[0]
    runner = EpisodeRunner(small_demo, BM25Index.cached(small_demo), make_policy(config), EpisodeConfig(max_steps=4))
    trajectory = runner.run(question.text, question)
    assert trajectory.policy.name == "first-hit" and trajectory.policy.settings == {"hits": 2}
    assert trajectory.outcome.status in ("submitted", "abstained") and trajectory.steps[0].tool_calls[0].name == "search"
    with pytest.raises(AgentError, match="hits"):
        make_config("first-hit", hits=0)
    (hits,) = [flag for flag in policy_flags("policy.") if flag.dotted == "policy.hits"]
    assert hits.names == ("--hits",) and "first-hit: Hits the one search returns" in hits.help and "1<=x<=50" in hits.help

    toml = tmp_path / "first.toml"
    toml.write_text('[policy]\nname = "first-hit"\nhits = 2\n')
    done = run_cli("run", "--config", str(toml), "--out", str(tmp_path / "runs"))  # the CLI takes it from a config file
    assert done.returncode == 0, done.stderr
