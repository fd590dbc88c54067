"""A policy's errors name its settings as the caller set them: a Python caller reads the argument
(``policy.model``), a user of the CLI the flag (``--model``; tests/agent/test_hf_policy.py and
test_policy_registry.py hold the CLI's wording)."""

import pytest

from paper_explorer import EvalConfig, evaluate
from paper_explorer.agent.errors import AgentError
from paper_explorer.agent.policies import make_config, make_policy
from tests.conftest import run_cli


def test_evaluate_without_a_model_names_the_argument_not_a_flag(tmp_path):
    out = tmp_path / "run"
    with pytest.raises(AgentError) as raised:
        evaluate(EvalConfig(limit=1, policy={"name": "hf"}), out=out)
    said = str(raised.value)
    assert said.startswith("policy.name='hf' needs policy.model (") and "--" not in said, said
    assert not out.exists()


@pytest.mark.parametrize(
    ("settings", "api", "cli"),
    [
        (
            {"name": "openai", "api": "chat"},
            "policy.name='openai' policy.api='chat' needs policy.base_url and policy.model (the teacher's name)",
            "--policy openai --api chat needs --base-url and --model (the teacher's name)",
        ),
        (
            {"name": "memory-reader"},
            "policy.name='memory-reader' needs policy.backend: hf (with policy.model)",
            "--policy memory-reader needs --backend: hf (with --model)",
        ),
        (
            {"name": "openai", "base_url": "ftp://server", "model": "m", "tokenizer": "t"},
            "policy.base_url 'ftp://server' must start with http:// or https://",
            "--base-url 'ftp://server' must start with http:// or https://",
        ),
    ],
)
def test_make_policy_names_arguments_where_the_cli_names_flags(settings, api, cli, tmp_path):
    with pytest.raises(AgentError) as raised:
        make_policy(make_config(**settings))
    assert api in str(raised.value) and "--" not in str(raised.value), raised.value
    flags = [f"--{key.replace('_', '-')}" if key != "name" else "--policy" for key in settings]
    done = run_cli("run", *[part for flag, value in zip(flags, settings.values(), strict=True) for part in (flag, value)])
    assert done.returncode == 2 and cli in done.stderr, done.stderr


def test_a_setting_another_policy_takes_is_refused_by_its_argument_name():
    with pytest.raises(AgentError, match=r"policy\.model is for policy\.name hf, memory-reader or openai, not 'scripted'"):
        make_config("scripted", model="m")
    with pytest.raises(AgentError, match=r"policy\.tempreature is no setting of any policy \(did you mean policy\.temperature\?\)"):
        make_config("scripted", tempreature=0.5)
