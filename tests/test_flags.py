"""Each setting declared once: the flags of exec, run, eval, train, sft build and improve are made from the config
models' fields (cli.flags), so a flag's bounds, default and help are its field's, a value the
model refuses is refused by the flag, and a new field gets a flag with no other edit."""

from __future__ import annotations

import inspect
import json
import math
from typing import Literal

import pytest
import typer
from pydantic import BaseModel, ConfigDict, Field
from typer.testing import CliRunner

from paper_explorer.agent.config import EvalConfig, RunConfig, build_config
from paper_explorer.agent.errors import AgentError
from paper_explorer.agent.policies.base import Reply, Sampling
from paper_explorer.agent.policy_registry import setting_fields
from paper_explorer.agent.trajectory import EpisodeConfig, Generation, StepPolicyInfo
from paper_explorer.cli.flags import NOT_FLAGS, bounds_text, config_flags, model_flags
from paper_explorer.sft.config import BuildConfig, ImproveSettings, TrainConfig
from paper_explorer.tools.limits import Limits, SandboxSettings
from tests.conftest import run_cli

try:  # what recent typer parses with (cli.usage_errors says why)
    from typer._click.exceptions import UsageError as ClickUsageError
except ImportError:
    from click.exceptions import UsageError as ClickUsageError

# command -> (its config model, arguments it needs to parse at all)
COMMANDS = {
    "exec": (SandboxSettings, ["action.py"]),
    "run": (RunConfig, []),
    "eval": (EvalConfig, ["--out", "run"]),
    "train": (TrainConfig, []),
    "sft build": (BuildConfig, ["-t", "t.jsonl", "--tokenizer", "tok", "--out", "data"]),
    "improve": (ImproveSettings, ["--out", "rounds"]),
}


def click_command(name: str):
    """The command that ``name``'s words name (``sft build``: build, of the sft group)."""
    from paper_explorer.cli.main import app

    command = typer.main.get_command(app)
    for word in name.split():
        command = command.commands[word]
    return command


def accepted_by_flag(command: str, flag, value) -> bool:
    """Whether the command line parses with the flag given ``value`` (nothing runs)."""
    _, needed = COMMANDS[command]
    try:
        click_command(command).make_context(command, [*needed, flag.names[0].split("/")[0], str(value)])
    except ClickUsageError:
        return False
    return True


def accepted_by_model(model, flag, value) -> bool:
    """Whether the model takes the value; a policy's setting is given with a policy that has it."""
    section, _, setting = flag.dotted.rpartition(".")
    owners = sorted(setting_fields().get(setting, ()), key=lambda name: name == "memory-reader")  # it takes a backend's only with --backend
    policy = {"policy.name": owners[0]} if section == "policy" and setting != "name" else {}
    try:
        build_config(model, {}, {**policy, flag.dotted: value}, "test")
    except AgentError:
        return False
    return True


def probes(flag) -> list:
    """Values at and just past each of the field's bounds."""
    step = 1 if flag.kind is int else 1e-6
    values = []
    for bound, limit in flag.bounds.items():
        past = limit - step if bound in ("ge", "gt") else limit + step
        values += [limit, past]
    if flag.kind is float:
        values += [math.inf, math.nan]
    return values


@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_flag_refuses_exactly_what_its_field_refuses(command):
    model, _ = COMMANDS[command]
    checked = 0
    for flag in model_flags(model):
        for value in probes(flag):
            assert accepted_by_flag(command, flag, value) == accepted_by_model(model, flag, value), (flag.dotted, value)
            checked += 1
    assert checked > 10


@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_field_has_its_flag_with_its_bounds_and_default_in_the_help(command):
    model, _ = COMMANDS[command]
    options = {param.name: param for param in click_command(command).params}
    for flag in model_flags(model):
        option = options[flag.identifier]
        assert set(option.opts + option.secondary_opts) >= {name for part in flag.names for name in part.split("/")}
        assert (flag.field.description or "!") in option.help, flag.dotted
        if flag.bounds:
            assert bounds_text(flag.bounds) in option.help
        if flag.default not in (None, []):  # an empty list (no probes) has nothing to show
            assert "[default: " in option.help


def test_the_fields_without_a_flag_say_why():
    fields = {f.dotted for f in model_flags(EvalConfig)}
    assert set(NOT_FLAGS) & fields == set()
    assert all(len(reason) > 20 for reason in NOT_FLAGS.values())
    assert "policy.served_adapter" not in fields and "episode.wall_seconds" in fields


@pytest.mark.parametrize(
    "args, flag, field",
    [
        (["exec", "x.py", "--memory-mb", "10"], "--memory-mb", "memory_mb must be at least 64"),
        (["eval", "--out", "{tmp}/run", "--top-p", "0"], "--top-p", "policy.top_p must be a positive number"),
        (["run", "--wall-seconds", "0"], "--wall-seconds", "episode.wall_seconds must be a positive number"),
        (
            ["eval", "--out", "{tmp}/run", "--quantization", "8bit"],
            "--quantization",
            "unknown --quantization '8bit'; choose 'auto', '4bit' or 'none'",
        ),
        (["train", "--dry-run", "--epochs", "0"], "--epochs", "epochs must be a positive number"),
    ],
)
def test_a_value_the_model_refuses_is_refused_by_the_flag_in_one_line(tmp_path, args, flag, field):
    done = run_cli(*(arg.format(tmp=tmp_path) for arg in args))
    assert done.returncode == 2, done
    (line,) = done.stderr.strip().splitlines()
    assert flag in line and field in line and line.startswith("error: "), line
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("columns", ["80", ""], ids=["COLUMNS=80", "piped"])
@pytest.mark.parametrize("command", list(COMMANDS))
def test_help_at_80_columns_shows_every_option_name_whole(command, columns):
    done = run_cli(*command.split(), "--help", env={"COLUMNS": columns})
    assert done.returncode == 0, done.stderr
    assert "…" not in done.stdout, done.stdout
    assert max(len(line) for line in done.stdout.splitlines()) <= 80
    words = set(done.stdout.replace("│", " ").split())
    for param in click_command(command).params:
        for name in param.opts + param.secondary_opts:
            if name.startswith("-"):
                assert name in words, (name, done.stdout)


def test_help_groups_the_settings_in_panels():
    done = run_cli("eval", "--help", env={"COLUMNS": "80"})
    titles = [line.split("─")[1].strip() for line in done.stdout.splitlines() if line.startswith("╭─")]
    assert {"Run", "Policy", "Sampling", "Episode", "Sandbox limits"} <= set(titles)
    trained = run_cli("train", "--help", env={"COLUMNS": "80"})
    assert {"Model", "LoRA", "Training", "Checkpoints"} <= {
        line.split("─")[1].strip() for line in trained.stdout.splitlines() if line.startswith("╭─")
    }


class Throwaway(BaseModel):
    """A config no command has: what the builder makes of fields it has never seen."""

    model_config = ConfigDict(extra="forbid")

    rate: float = Field(0.5, gt=0, le=1, description="How fast.")
    mode: Literal["fast", "slow"] = Field("fast", description="Which way.")
    names: list[str] = Field(default_factory=list, description="Who.")
    loud: bool = Field(False, description="Whether to shout.")
    episode: EpisodeConfig = EpisodeConfig()


class Grown(Throwaway):
    """The same config with one field added, and nothing else edited."""

    patience: int = Field(3, ge=0, description="Steps to wait.")


def throwaway_app(model) -> typer.Typer:
    app = typer.Typer()

    @app.command()
    @config_flags(model, panel="Toy")
    def toy(overrides: dict = None) -> None:
        """Print what the flags gave."""
        typer.echo(json.dumps({key: value for key, value in overrides.items() if value is not None}))

    @app.command()
    def other() -> None:
        """A second command, so that the first is named."""

    return app


def test_a_new_field_gets_a_flag_with_no_other_edit():
    runner = CliRunner()
    given = runner.invoke(
        throwaway_app(Grown),
        ["toy", "--rate", "0.25", "--mode", "slow", "--names", "a", "--names", "b", "--loud", "--patience", "7", "--wall-seconds", "2"],
    )
    assert given.exit_code == 0, given.output
    assert json.loads(given.output) == {
        "rate": 0.25,
        "mode": "slow",
        "names": ["a", "b"],
        "loud": True,
        "patience": 7,
        "episode.wall_seconds": 2.0,
    }
    refused = runner.invoke(throwaway_app(Grown), ["toy", "--patience", "-1"])
    assert refused.exit_code == 2 and "patience must be at least 0" in refused.output
    before = runner.invoke(throwaway_app(Throwaway), ["toy", "--patience", "7"])
    assert before.exit_code == 2  # the flag came from the field, and from nothing else
    shown = runner.invoke(throwaway_app(Grown), ["toy", "--help"], env={"COLUMNS": "80"})
    assert "--patience" in shown.output and "Steps to wait. [default: 3; x>=0]" in shown.output
    assert "--no-loud" in shown.output and "0<x<=1" in shown.output


def test_a_field_no_flag_can_carry_must_say_why():
    class Tabled(BaseModel):
        table: dict[str, str] = Field(default_factory=dict, description="A table.")

    with pytest.raises(TypeError, match="NOT_FLAGS"):
        model_flags(Tabled)


@pytest.mark.parametrize("model", [TrainConfig, BuildConfig, ImproveSettings])
def test_every_sft_setting_has_a_flag_or_says_why_not(model):
    flagged = {flag.dotted for flag in model_flags(model)}
    for name in model.model_fields:
        assert name in flagged or name in NOT_FLAGS, name
    assert {"lora_dropout", "target_modules", "batch_size", "seed", "selection_metric", "validation_max_steps"} <= {
        flag.dotted for flag in model_flags(TrainConfig)
    }


# -- the sandbox limits: declared once, in tools.limits.SandboxSettings ------------------------------------------


def test_the_sandbox_limits_are_declared_once():
    assert set(SandboxSettings.model_fields) <= set(EpisodeConfig.model_fields)
    assert all(EpisodeConfig.model_fields[name] is not None for name in SandboxSettings.model_fields)
    assert Limits.from_settings(SandboxSettings()) == Limits() == Limits.from_settings(EpisodeConfig())
    # what the host enforces is the user's settings, not a copy of them: the same fields and defaults
    assert issubclass(Limits, SandboxSettings)
    for name, field in SandboxSettings.model_fields.items():
        assert Limits.model_fields[name].default == field.default, name
    given = Limits.from_settings(EpisodeConfig(memory_mb=100, record_kb=128), allowed_modules=("math",))
    assert (given.memory_bytes, given.record_bytes, given.allowed_modules) == (100 * 2**20, 128 * 2**10, ("math",))
    assert Limits.model_validate(json.loads(json.dumps(given.model_dump(mode="json")))) == given  # as the episode host gets them
    assert {f.dotted for f in model_flags(SandboxSettings)} == set(SandboxSettings.model_fields)


def test_an_episode_config_keeps_the_json_old_runs_recorded():
    """A manifest's and a trajectory's ``episode`` as written before the limits moved: read, and written
    back with every key and value it had, in order, and the limits added since (the budgets for
    tool-call records: issue 31) at their defaults, where they are declared."""
    recorded = {
        "max_steps": 6,
        "observation_chars": 4000,
        "context_chars": 100000,
        "seed": 3,
        "wall_seconds": 20.0,
        "cpu_seconds": 10,
        "host_seconds": 5.0,
        "memory_mb": 2048,
        "output_chars": 20000,
        "record_prompt_ids": False,
    }
    added = {"record_kb": 1024, "episode_record_kb": 16384, "rerank_url": None}  # and the reranker (issue 35)
    written = json.loads(EpisodeConfig.model_validate(recorded).model_dump_json())
    assert written == {**recorded, **added}
    assert list(written) == [*list(recorded)[:-1], *added, "record_prompt_ids"]  # the keys' order too
    old = {key: value for key, value in recorded.items() if key not in ("host_seconds", "record_prompt_ids")}  # older still
    assert EpisodeConfig.model_validate(old).host_seconds == 5.0


# -- policies: keyword arguments, typed records ------------------------------------------------------------------


def test_policy_settings_are_never_taken_by_position():
    from paper_explorer.agent.policies.hf import HFPolicy
    from paper_explorer.agent.policies.openai_chat import OpenAIChatPolicy
    from paper_explorer.agent.policies.openai_server import OpenAIPolicy

    for function, positional in (
        (OpenAIPolicy.__init__, {"self"}),
        (OpenAIChatPolicy.__init__, {"self"}),
        (HFPolicy.load, {"model"}),
        (HFPolicy.__init__, {"self", "model", "renderer"}),
    ):
        parameters = inspect.signature(function).parameters.values()
        assert {p.name for p in parameters if p.kind is not p.KEYWORD_ONLY} == positional, function.__qualname__
    with pytest.raises(TypeError):
        Sampling(0.7, 0.9)  # type: ignore[misc]
    assert EvalConfig(policy={"name": "hf", "temperature": 0.7, "top_p": 0.9}).policy.sampling == Sampling(temperature=0.7, top_p=0.9)


def test_a_replayed_step_reports_a_typed_record(small_demo):
    from paper_explorer.agent.policies import make_config, make_policy
    from paper_explorer.agent.policies.base import EpisodeStart
    from paper_explorer.agent.policies.replay import Replay
    from paper_explorer.agent.runner import EpisodeRunner
    from paper_explorer.corpus import BM25Index

    question = small_demo.questions[0]
    runner = EpisodeRunner(small_demo, BM25Index.cached(small_demo), make_policy(make_config()), EpisodeConfig(max_steps=3))
    recorded = runner.run(question.text, question)
    replay = Replay([recorded])
    replay.start(EpisodeStart(seed=0, question=recorded.question, question_id=recorded.question_id))
    opening = recorded.messages(0)
    first = replay.act(opening)
    assert isinstance(first.info, StepPolicyInfo) and first.info.replayed_step == 0
    second = replay.act([*opening, {"role": "assistant", "content": first.text}, {"role": "user", "content": "something else"}])
    assert second.info.previous_observation_matches is False and second.info.drift.position == 0


def test_a_reply_carries_the_trajectory_records_and_writes_the_json_it_always_did():
    generation = Generation(prompt_tokens=12, generated_tokens=3, hit_cap=False, finish_reason="stop", api_retries=0)
    reply = Reply("x", generation=generation)
    assert isinstance(reply.generation, Generation)
    old_line = {"prompt_tokens": 12, "generated_tokens": 3, "hit_cap": False, "finish_reason": "stop", "api_retries": 0}
    assert json.loads(generation.model_dump_json()) == old_line == json.loads(Generation.model_validate(old_line).model_dump_json())


def every_command() -> list[list[str]]:
    """Each command and subcommand of explorer, as the words that name it."""
    import typer

    from paper_explorer.cli import main as cli_main

    found, pending = [], [([], typer.main.get_command(cli_main.app))]
    while pending:
        words, command = pending.pop()
        for name, sub in sorted(getattr(command, "commands", {}).items()):
            pending.append(([*words, name], sub))
            found.append([*words, name])
    return sorted(found)


@pytest.mark.parametrize("words", every_command(), ids=" ".join)
def test_every_commands_help_fits_80_columns_with_option_names_whole(words):
    done = run_cli(*words, "--help", env={"COLUMNS": "80"})
    assert done.returncode == 0, done.stderr
    assert "…" not in done.stdout, done.stdout
    assert max(len(line) for line in done.stdout.splitlines()) <= 80


@pytest.mark.parametrize(
    "flag, value",
    [
        ("--wall-seconds", "1e308"),
        ("--wall-seconds", "3000000"),
        ("--host-seconds", "1e308"),
        ("--cpu-seconds", str(2**70)),
        ("--output-chars", str(2**70)),
    ],
)
def test_a_limit_too_large_to_be_a_limit_is_refused_in_one_line(flag, value, tmp_path):
    """A wall clock past what poll() can wait crashed the host, and a cap of 2**70 characters was no cap."""
    action = tmp_path / "a.py"
    action.write_text("print(1)\n")
    done = run_cli("exec", flag, value, str(action))
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("error: ") and flag in line and "at most" in line
