"""A real pretrained chat model, SmolLM2-135M-Instruct (``make smollm2``), through the hf path:
its own ChatML template token for token as transformers renders it, episodes whose every step is
text the model wrote, train/serve parity, the memory reader, the option probes and their reload
check, SFT data built with its tokenizer and a LoRA adapter trained on it.

What a real model shows that the random-weight tiny model never did: it answers in prose after
its own generation prompt (no blank replies), and its probe options hold a small share of the
next-token distribution. Skipped without the model locally; under CI=true a missing model fails."""

import json
import re
import shutil

import pytest

from paper_explorer.agent.chat_template import read_template
from paper_explorer.agent.renderer import PROBE, ChatRenderer
from tests.conftest import run_cli

pytestmark = pytest.mark.real_model
SMALL = ("--threads", "1", "--max-new-tokens", "32")


@pytest.fixture(scope="module")
def renderer(smollm2):
    return ChatRenderer.from_directory(smollm2)


# A probe the model does not answer with its options: after "Yes or No" it gives "Tree" and
# "Monday" about a millionth of its next-token distribution together.
FAINT = """
[answerable]
text = "Can the question you were given be answered from these papers? Reply with one word, Yes or No."
options = ["Yes", "No"]

[faint]
text = "Can the question you were given be answered from these papers? Reply with one word, Yes or No."
options = ["Tree", "Monday"]
"""


@pytest.fixture(scope="module")
def run(smollm2, tmp_path_factory):
    directory = tmp_path_factory.mktemp("smollm2")
    (directory / "probes.toml").write_text(FAINT)
    out = directory / "run"
    done = run_cli(
        "eval", "--policy", "hf", "--model", str(smollm2), *SMALL, "--split", "validation", "--limit", "2", "--max-steps", "2",
        "--probes-file", str(directory / "probes.toml"), "--probe", "answerable", "--probe", "faint", "--out", str(out),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "probe answerable: its options held" in done.stdout and "probe faint: its options held" in done.stdout
    return out


def episodes(run) -> list[dict]:
    return [json.loads(line) for line in (run / "trajectories.jsonl").read_text().splitlines()]


def test_its_own_template_token_for_token_as_transformers_renders_it(renderer, smollm2):
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(smollm2))
    for turns in (2, 4):
        expected = hf.apply_chat_template(PROBE[:turns], tokenize=True, add_generation_prompt=True, return_dict=True)["input_ids"]
        assert renderer.prompt(PROBE[:turns]) == list(expected)
    expected = hf.apply_chat_template(PROBE, tokenize=True, return_dict=True)["input_ids"]
    assert renderer.render(PROBE).ids == list(expected)
    without_system = hf.apply_chat_template([PROBE[1]], tokenize=False, add_generation_prompt=True)
    assert renderer.decode(renderer.user_prompt([PROBE[1]["content"]])) == without_system  # its default system prompt
    assert not renderer.thinking_supported and renderer.check.end_of_turn == "<|im_end|>" and not renderer.check.rewrites_history


def test_every_step_is_text_the_model_wrote_and_parity_holds(run, smollm2):
    found = episodes(run)
    steps = [step for episode in found for step in episode["steps"]]
    assert len(found) == 2 and steps
    assert all(step["action_text"].strip() for step in steps), "a real model after its own generation prompt writes, not blanks"
    settings = found[0]["policy"]["settings"]
    assert settings["chat_template_sha256"] == read_template(smollm2).sha256 and settings["threads"] == 1
    assert settings["max_context"] == 8192  # the model's own max_position_embeddings, not a Qwen3 default
    parity = run_cli("check-parity", "--trajectories", str(run / "trajectories.jsonl"), "--tokenizer", str(smollm2))
    assert parity.returncode == 0 and f"parity holds: 2 trajectories, {len(steps)} steps" in parity.stdout, parity.stderr


def test_show_prints_the_models_words(run):
    shown = run_cli("show", str(run / "trajectories.jsonl"), "--line", "1")
    assert shown.returncode == 0
    first = episodes(run)[0]["steps"][0]["action_text"].split()[0]
    assert first in shown.stdout


def test_the_probe_reads_a_real_distribution_and_rescore_reloads_it(run, smollm2, tmp_path):
    probes = [probe for episode in episodes(run) for probe in episode["probes"] if probe["probe"] == "answerable"]
    assert len(probes) == 2 and all(probe["options"] == ["Yes", "No"] for probe in probes)
    # after its own generation prompt the model answers the question: Yes and No hold a real share
    assert all(0.05 < probe["mass"] < 1 for probe in probes), [probe["mass"] for probe in probes]
    # A faithful reload (same files, CPU, float32; recorded with a cache, recomputed without) holds at
    # the default tolerance: log-probabilities are compared relative to their size (issue 37).
    rescored = run_cli("rescore", str(run), "--model", str(smollm2))
    assert rescored.returncode == 0 and "agreement: 1.0000 (4 of 4 decisions)" in rescored.stdout, rescored.stdout + rescored.stderr
    # one recorded probability changed in its fourth digit is found
    edited = tmp_path / "edited"
    shutil.copytree(run, edited)
    lines = (edited / "trajectories.jsonl").read_text().splitlines()
    first = json.loads(lines[0])
    yes, no = first["probes"][0]["probabilities"]
    first["probes"][0]["probabilities"] = [yes - 2e-4, no + 2e-4]
    (edited / "trajectories.jsonl").write_text("\n".join([json.dumps(first), *lines[1:]]) + "\n")
    broken = run_cli("rescore", str(edited), "--model", str(smollm2))
    said = re.search(r"probe answerable differs by ([0-9.e-]+) ", broken.stderr)
    assert broken.returncode == 1 and said is not None, broken.stdout + broken.stderr
    assert float(said.group(1)) == pytest.approx(2e-4, abs=1e-5)  # the edit, give or take a faithful reload's 1e-6


def test_a_probe_the_model_does_not_answer_shows_its_mass_and_calibrate_refuses_it(run, tmp_path):
    faint = [probe for episode in episodes(run) for probe in episode["probes"] if probe["probe"] == "faint"]
    assert len(faint) == 2 and all(probe["mass"] < 1e-3 for probe in faint), [probe["mass"] for probe in faint]
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["probe_mass"]["faint"]["below"] == 2 and metrics["probe_mass"]["answerable"]["below"] == 0
    assert "faint" not in (metrics["calibration"] or {})  # no episode measured a belief: no figures
    shown = run_cli("inspect", str(run), env={"COLUMNS": "200"})
    assert "probe faint: its options held" in shown.stdout and "2 of 2 episodes under the minimum 0.1 measured no belief" in shown.stdout
    refused = run_cli("calibrate", "fit", str(run), "--probe", "faint", "--out", str(tmp_path / "faint.json"))
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1 and "measure no belief" in refused.stderr, refused.stderr
    assert not (tmp_path / "faint.json").exists()


def test_thinking_is_refused_before_the_weights_load(smollm2):
    done = run_cli("run", "--policy", "hf", "--model", str(smollm2), "--thinking", "--question-id", "demo-00007-q1")
    assert done.returncode == 2 and "no thinking mode; drop --thinking" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_the_memory_reader_runs_on_it_and_check_parity_rebuilds_its_prompts(smollm2, tmp_path):
    out = tmp_path / "reader"
    done = run_cli(
        "eval", "--policy", "memory-reader", "--backend", "hf", "--model", str(smollm2), "--threads", "1",
        "--page-tokens", "1024", "--memory-tokens", "48", "--answer-tokens", "48", "--scope", "search:1",
        "--limit", "1", "--out", str(out),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (episode,) = episodes(out)
    reading = [step for step in episode["steps"] if (step.get("policy_info") or {}).get("reading")]
    assert reading, "the reader recorded its updates"
    parity = run_cli("check-parity", "--trajectories", str(out / "trajectories.jsonl"), "--tokenizer", str(smollm2))
    assert parity.returncode == 0 and "memory-reader prompts rebuilt and matched" in parity.stdout, parity.stdout + parity.stderr


def test_sft_data_built_with_its_tokenizer_trains_an_adapter_the_hf_policy_loads(smollm2, tmp_path):
    teach = tmp_path / "teach"
    taught = run_cli("eval", "--policy", "scripted", "--split", "train", "--limit", "6", "--out", str(teach))
    assert taught.returncode == 0, taught.stderr
    data = tmp_path / "data"
    built = run_cli(
        "sft", "build", "--trajectories", str(teach / "trajectories.jsonl"), "--tokenizer", str(smollm2), "--out", str(data),
        "--evaluation-split", "none", "--validation-share", "0.25",
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    report = json.loads((data / "build_report.json").read_text())
    assert report["chat_template"]["chat_template_sha256"] == read_template(smollm2).sha256 and report["parity"]["mismatches"] == 0
    trained = run_cli(
        "train", "--model", str(smollm2), "--data", str(data), "--out", str(tmp_path / "train"), "--threads", "1",
        "--max-steps", "2", "--gradient-accumulation-steps", "1", "--validation-examples", "1", "--validation-episodes", "1",
        "--validation-max-steps", "1", "--validation-max-new-tokens", "8", "--eval-steps", "2", "--save-steps", "2",
    )  # fmt: skip
    assert trained.returncode == 0, trained.stderr
    summary = json.loads((tmp_path / "train" / "training_summary.json").read_text())
    adapter = tmp_path / "train" / summary["best_checkpoint"]
    assert (adapter / "adapter_config.json").exists(), summary
    ran = run_cli(
        "eval", "--policy", "hf", "--model", str(smollm2), "--adapter", str(adapter), *SMALL,
        "--limit", "1", "--max-steps", "1", "--out", str(tmp_path / "adapted"),
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    assert episodes(tmp_path / "adapted")[0]["policy"]["settings"]["adapter_sha256"]
