"""Adapters that cannot be confused, against a real vLLM (its CPU build) with runtime LoRA loading:
two improve runs on one server each sample every round with their own adapter, eval --adapter
samples with its adapter, and the server's own answers prove it (its /v1/models and its log).

Its own module: under `--dist loadscope` it gets its own worker and its own server (the session
fixture), so improve's CPU training does not slow the other vLLM tests' worker.
"""

import json
from pathlib import Path

import pytest

from paper_explorer.agent.policies.adapters import ServerAdapters, planned_adapter, run_id
from tests.conftest import run_cli
from tests.sft.test_improve import improve_args, served_rounds

pytestmark = pytest.mark.vllm


def lora_adapter(model_dir: Path, directory: Path, seed: int) -> Path:
    """A LoRA adapter for the tiny model, random weights, r=4 (the server takes r <= 16)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from paper_explorer.sft.config import TARGET_MODULES

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    lora = LoraConfig(task_type="CAUSAL_LM", r=4, lora_alpha=8, target_modules=TARGET_MODULES, init_lora_weights=False)
    get_peft_model(model, lora).save_pretrained(directory)
    return directory


def listed(server) -> dict[str, str]:
    """The server's adapters: name -> the path it says it serves it from."""
    return {model["id"]: model["root"] for model in server.models()["data"] if model.get("parent") is not None}


def loaded_in_log(server) -> dict[str, str]:
    """Every adapter the server's log says it loaded: name -> path."""
    found = {}
    for line in server.log.read_text(errors="replace").splitlines():
        if "Loaded new LoRA adapter: name '" in line:
            name, path = line.split("name '", 1)[1].split("', path '")
            found[name] = path.rstrip("'")
    return found


def test_the_server_maps_each_name_to_its_path_and_refuses_another_path(vllm_server, tmp_path):
    first = planned_adapter(lora_adapter(vllm_server.model_dir, tmp_path / "a", seed=1), "test", 1)
    second = planned_adapter(lora_adapter(vllm_server.model_dir, tmp_path / "b", seed=2), "test", 1)
    assert first.name != second.name
    lines: list[str] = []
    with ServerAdapters(vllm_server.url, say=lines.append) as adapters:
        adapters.load(first)
        assert listed(vllm_server)[first.name] == first.path
        adapters.load(first)  # an earlier try's: same name, same path
        assert len(lines) == 1 and "already loaded from" in lines[0]
        confused = second.model_copy(update={"name": first.name})
        with pytest.raises(Exception, match=f"already loaded from {first.path}, not from {second.path}"):
            adapters.load(confused)
    assert first.name not in listed(vllm_server)  # unloaded at the end


def test_two_improve_runs_on_one_server_sample_every_round_with_their_own_adapter(vllm_server, tiny_model, tmp_path):
    start = lora_adapter(vllm_server.model_dir, tmp_path / "start", seed=3)  # round 1's policy
    runs = [tmp_path / "first", tmp_path / "second"]
    for out in runs:
        args = improve_args(tiny_model, tmp_path, rounds=2, samples=1, limit=2, max_steps=2, max_new_tokens=6, out=out)
        done = run_cli(*args, "--base-url", vllm_server.url, "--adapter", str(start))
        assert done.returncode == 0, done.stderr
    records = {out: served_rounds(out) for out in runs}
    assert all(len(rounds) == 2 for rounds in records.values()), records  # round 1 kept: round 2 samples its adapter
    names = [record["served_name"] for rounds in records.values() for record in rounds]
    assert len(set(names)) == 4, names  # two runs x two rounds, never one name twice
    loaded = loaded_in_log(vllm_server)  # the server's own word: which path it loaded under each name
    for out, rounds in records.items():
        assert rounds[0]["sampled_with"] == str(start) and rounds[1]["sampled_with"] == rounds[0]["adapter"]
        for record in rounds:
            assert record["served_path"] == str(Path(record["sampled_with"]).resolve())
            assert loaded[record["served_name"]] == record["served_path"]
            samples = out / f"round-{record['round']}" / "samples" / "trajectories.jsonl"
            for line in samples.read_text().splitlines():  # every request of the round named that adapter
                assert json.loads(line)["policy"]["settings"]["model"] == record["served_name"]
    assert not set(names) & set(listed(vllm_server))  # each run unloaded what it loaded


def test_eval_with_an_adapter_samples_with_it_and_unloads_it(vllm_server, tmp_path):
    adapter = lora_adapter(vllm_server.model_dir, tmp_path / "adapter", seed=4)
    run = tmp_path / "run"
    done = run_cli(
        "eval",
        "--policy",
        "openai",
        "--base-url",
        vllm_server.url,
        "--model",
        vllm_server.model,
        "--tokenizer",
        str(vllm_server.model_dir),
        "--adapter",
        str(adapter),
        "--limit",
        "2",
        "--max-steps",
        "2",
        "--max-new-tokens",
        "8",
        "--out",
        str(run),
    )
    assert done.returncode == 0, done.stderr
    served = json.loads((run / "manifest.json").read_text())["config"]["policy"]["served_adapter"]
    assert served == planned_adapter(adapter, run_id(run)).model_dump()
    assert loaded_in_log(vllm_server)[served["name"]] == str(adapter.resolve())
    for line in (run / "trajectories.jsonl").read_text().splitlines():
        trajectory = json.loads(line)
        assert trajectory["policy"]["settings"]["model"] == served["name"] and trajectory["outcome"]["status"] != "policy_error"
    assert served["name"] not in listed(vllm_server)


def test_eval_refuses_its_adapter_name_loaded_from_another_path(vllm_server, tmp_path):
    adapter = lora_adapter(vllm_server.model_dir, tmp_path / "adapter", seed=5)
    other = lora_adapter(vllm_server.model_dir, tmp_path / "other", seed=6)
    run = tmp_path / "run"
    decoy = planned_adapter(adapter, run_id(run)).model_copy(update={"path": str(other.resolve())})
    with ServerAdapters(vllm_server.url) as adapters:
        adapters.load(decoy)  # someone else's adapter under the very name the run will ask for
        done = run_cli(
            "eval",
            "--policy",
            "openai",
            "--base-url",
            vllm_server.url,
            "--model",
            vllm_server.model,
            "--tokenizer",
            str(vllm_server.model_dir),
            "--adapter",
            str(adapter),
            "--limit",
            "1",
            "--out",
            str(run),
        )
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1 and f"already loaded from {other.resolve()}" in done.stderr
        assert listed(vllm_server)[decoy.name] == str(other.resolve())  # not unloaded: not the run's
    assert not (run / "manifest.json").exists()
