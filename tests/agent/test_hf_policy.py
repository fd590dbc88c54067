"""The hf policy on the tiny random-weight Qwen3: whole episodes, KV reuse, 4-bit, LoRA, parity."""

import json

import pytest

from paper_explorer.agent.parity import check_trajectory
from paper_explorer.agent.policies import make_config, make_policy
from paper_explorer.agent.policies.hf import HFPolicy
from paper_explorer.agent.renderer import ChatRenderer
from paper_explorer.agent.runner import EpisodeRunner
from paper_explorer.agent.trajectory import EpisodeConfig
from paper_explorer.corpus import BM25Index
from tests.conftest import run_cli

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def index(small_demo):
    return BM25Index.build(small_demo)


def episode(small_demo, index, policy, steps=10):
    question = small_demo.questions[0]
    return EpisodeRunner(small_demo, index, policy, EpisodeConfig(max_steps=steps)).run(question.text, question)


@pytest.fixture(scope="module")
def cached_and_naive(tiny_model, small_demo, index):
    cached = episode(small_demo, index, HFPolicy.load(str(tiny_model), max_new_tokens=16))
    naive = episode(small_demo, index, HFPolicy.load(str(tiny_model), max_new_tokens=16, reuse_cache=False))
    return cached, naive


def test_nonsense_actions_run_whole_episodes_cleanly(cached_and_naive):
    cached, _ = cached_and_naive
    assert cached.outcome.status == "step_limit" and len(cached.steps) == 10
    for step in cached.steps:
        assert step.format_error or step.error or step.code is not None
        assert step.generation.generated_tokens == 16 and step.generation.hit_cap


def test_kv_cache_reuse_prefills_about_the_final_length_once(cached_and_naive, tiny_model):
    cached, naive = cached_and_naive
    renderer = ChatRenderer.from_directory(tiny_model)
    final_length = len(renderer.render(cached.messages()).ids)
    prefilled = sum(step.generation.prefill_tokens for step in cached.steps)
    naive_prefilled = sum(step.generation.prefill_tokens for step in naive.steps)
    assert prefilled <= 1.1 * final_length
    assert naive_prefilled == sum(step.generation.prompt_tokens for step in naive.steps) > 5 * final_length
    # the cache changes the cost, never the actions
    assert [s.action_text for s in cached.steps] == [s.action_text for s in naive.steps]


def test_greedy_overrides_the_models_sampling_defaults(cached_and_naive):
    settings = cached_and_naive[0].policy.settings
    assert settings["do_sample"] is False and settings["decoding"] == "greedy"
    assert settings["overridden_generation_config"]["do_sample"] is True
    assert settings["overridden_generation_config"]["temperature"] == 0.6


def test_parity_holds_on_model_trajectories(cached_and_naive, tiny_model):
    renderer = ChatRenderer.from_directory(tiny_model)
    for trajectory in cached_and_naive:
        assert check_trajectory(trajectory, renderer) is None


def test_four_bit_loading_on_cpu(tiny_model, small_demo, index):
    import bitsandbytes as bnb

    policy = HFPolicy.load(str(tiny_model), quantization="4bit", max_new_tokens=4)
    assert any(isinstance(module, bnb.nn.Linear4bit) for module in policy.model.modules())
    quantized = next(m for m in policy.model.modules() if isinstance(m, bnb.nn.Linear4bit))
    assert quantized.weight.quant_type == "nf4" and quantized.weight.quant_state.nested  # double quantization
    trajectory = episode(small_demo, index, policy, steps=2)
    assert trajectory.policy.settings["quantization"] == "4bit" and len(trajectory.steps) == 2


def test_a_lora_adapter_is_loaded_and_hashed(tiny_model, tmp_path, small_demo, index):
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_model)
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    get_peft_model(base, config).save_pretrained(tmp_path / "adapter")
    policy = make_policy(make_config("hf", model=str(tiny_model), adapter=tmp_path / "adapter", max_new_tokens=4))
    assert isinstance(policy.model, PeftModel)
    trajectory = episode(small_demo, index, policy, steps=2)
    hashes = trajectory.policy.settings["adapter_sha256"]
    assert "adapter_config.json" in hashes and len(hashes["adapter_model.safetensors"]) == 64


def test_context_limit_from_the_model(tiny_model, small_demo, index):
    policy = HFPolicy.load(str(tiny_model), max_new_tokens=8, max_context=900)
    trajectory = episode(small_demo, index, policy)
    assert trajectory.outcome.status == "context_limit" and "exceeds the context of 900" in trajectory.outcome.reason


def test_tiny_model_and_hf_run_through_the_cli(tmp_path):
    built = run_cli("tiny-model", "--out", str(tmp_path / "tiny"))
    assert built.returncode == 0, built.stderr
    assert (tmp_path / "tiny" / "tokenizer.json").exists() and (tmp_path / "tiny" / "model.safetensors").exists()
    again = run_cli("tiny-model", "--out", str(tmp_path / "tiny"))
    assert again.returncode == 2 and "--force" in again.stderr
    done = run_cli(
        "run",
        "--policy",
        "hf",
        "--model",
        str(tmp_path / "tiny"),
        "--max-new-tokens",
        "8",
        "--max-steps",
        "3",
        "--out",
        str(tmp_path / "runs"),
    )
    assert done.returncode == 0, done.stderr
    (trajectory,) = [json.loads(line) for line in (tmp_path / "runs" / "trajectories.jsonl").read_text().splitlines()]
    assert trajectory["outcome"]["status"] == "step_limit" and trajectory["steps"][0]["generation"]["prompt_tokens"] > 0
    parity = run_cli("check-parity", "--trajectories", str(tmp_path / "runs" / "trajectories.jsonl"), "--tokenizer", str(tmp_path / "tiny"))
    assert parity.returncode == 0 and "parity holds" in parity.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (["--policy", "hf"], "needs --model"),
        (["--policy", "hf", "--model", "./no/such/dir"], "no such model directory"),
        (["--policy", "scripted", "--model", "x"], "--model is for --policy hf, memory-reader or openai, not 'scripted'"),
        (["--policy", "openai", "--model", "m"], "needs --base-url"),
    ],
)
def test_model_policy_arguments_are_checked(args, message):
    done = run_cli("run", *args)
    assert done.returncode == 2 and message in done.stderr, done.stderr


def test_hf_refuses_parallel_workers(tmp_path, tiny_model):
    done = run_cli("eval", "--policy", "hf", "--model", str(tiny_model), "--workers", "2", "--out", str(tmp_path / "r"))
    assert done.returncode == 2 and "one episode at a time" in done.stderr
