"""Reload re-scoring (``explorer rescore``, ``evaluation.rescore``) on a tiny model with the real
Qwen3 vocabulary ("Yes" and "No" one token each): a run's recorded probe probabilities come back
from the files on disk, with and without the cache and after reloading an adapter; a tampered
record, another model, another tokenizer, a missing adapter and a run without probes are named."""

from __future__ import annotations

import json
import shutil

import pytest
import typer
from typer.testing import CliRunner

from paper_explorer.agent.config import EvalConfig
from paper_explorer.agent.policies import make_config
from paper_explorer.agent.trajectory import EpisodeConfig
from paper_explorer.cli.flags import flag_spelling
from paper_explorer.cli.main import INPUT_ERRORS
from paper_explorer.cli.rescore_command import rescore_command
from paper_explorer.corpus.setting_names import spelled
from paper_explorer.evaluation.errors import EvaluationError
from paper_explorer.evaluation.rescore import rescore
from paper_explorer.evaluation.run import evaluate

pytest.importorskip("torch")

TOLERANCE = 1e-5  # the tiny model reloads bit for bit: tighter than the default holds


def rescore_cli(*args: str) -> tuple[int, str, str]:
    """`explorer rescore ARGS`: (exit status, stdout, stderr). The command in an app of its own,
    its settings named by their flags and an input error printed and its status set as
    cli.main.main does (one line, exit 2)."""
    app = typer.Typer()
    app.command("rescore")(rescore_command)
    app.command("unused")(lambda: None)  # two commands, so the first argument names the command as in explorer
    with spelled(flag_spelling):
        result = CliRunner().invoke(app, ["rescore", *args])
    if isinstance(result.exception, INPUT_ERRORS):
        return 2, result.stdout, f"error: {result.exception}\n"
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture(scope="module")
def qwen3_model(tmp_path_factory, qwen3_tokenizer):
    from paper_explorer.agent.testing.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("rescore-model") / "model", tokenizer_from=qwen3_tokenizer)


@pytest.fixture(scope="module")
def adapter(qwen3_model, tmp_path_factory):
    """A LoRA adapter of random (non-zero) weights: it changes the probabilities, so a reload without it would show."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    directory = tmp_path_factory.mktemp("rescore-adapter") / "adapter"
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    get_peft_model(AutoModelForCausalLM.from_pretrained(qwen3_model), lora).save_pretrained(directory)
    return directory


def probe_run(out, model, small_demo, adapter=None):
    policy = make_config("hf", model=str(model), adapter=adapter, max_new_tokens=8)
    config = EvalConfig(split="all", limit=2, policy=policy, episode=EpisodeConfig(max_steps=2, probes=["answerable", "correct"]))
    return evaluate(config, out=out, corpus=small_demo).directory


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, qwen3_model, small_demo):
    return probe_run(tmp_path_factory.mktemp("rescore-runs") / "plain", qwen3_model, small_demo)


@pytest.fixture(scope="module")
def adapter_run_dir(tmp_path_factory, qwen3_model, adapter, small_demo):
    return probe_run(tmp_path_factory.mktemp("rescore-runs") / "adapter", qwen3_model, small_demo, adapter)


def tampered(run_dir, tmp_path, change):
    """A copy of the run whose first episode's record ``change(record)`` edits in place."""
    copy = tmp_path / "tampered"
    shutil.copytree(run_dir, copy)
    path = copy / "trajectories.jsonl"
    lines = path.read_bytes().split(b"\n")
    record = json.loads(lines[0])
    change(record)
    lines[0] = json.dumps(record).encode()
    path.write_bytes(b"\n".join(lines))
    return copy, record["episode_id"]


# -- the check holds --------------------------------------------------------------------------------


def test_a_run_rescored_after_reload_agrees_exactly(run_dir, qwen3_model):
    report = rescore(run_dir, str(qwen3_model))
    assert report.holds and len(report.comparisons) == 2 and report.recorded_policy == "hf"
    assert report.agreement == 1.0 and report.cached_flips == 0
    assert report.largest_difference <= TOLERANCE and report.largest_cached_difference <= TOLERANCE
    assert all(c.cached_tokens > 0 for c in report.comparisons)  # the cached reading did reuse a warmed cache
    print(f"largest difference: reloaded {report.largest_difference:.3g}, cached {report.largest_cached_difference:.3g}")
    status, out, err = rescore_cli(str(run_dir), "--model", str(qwen3_model))
    assert status == 0, err
    assert "probes compared: 2 of 2 episodes" in out and "agreement: 1.0000 (2 of 2 decisions)" in out
    assert "cached vs uncached: 0 flips" in out and "rescore holds" in out
    status, out, _ = rescore_cli(str(run_dir), "--model", str(qwen3_model), "--json")
    figures = json.loads(out)
    assert status == 0 and figures["agreement"] == 1.0 and figures["holds"] and len(figures["comparisons"]) == 2


def test_a_run_with_an_adapter_agrees_after_reloading_it(adapter_run_dir, qwen3_model, adapter, run_dir):
    report = rescore(adapter_run_dir, str(qwen3_model), adapter=adapter)
    assert report.holds and report.agreement == 1.0 and report.largest_difference <= TOLERANCE, report.mismatch
    plain = {c.question_id: c.recorded for c in rescore(run_dir, str(qwen3_model)).comparisons}
    assert any(c.recorded != plain[c.question_id] for c in report.comparisons)  # the adapter did change what was recorded
    with pytest.raises(EvaluationError, match="the run's policy used the adapter .*; pass it as adapter$"):
        rescore(adapter_run_dir, str(qwen3_model))
    with pytest.raises(EvaluationError, match="the run used no adapter"):
        rescore(run_dir, str(qwen3_model), adapter=adapter)


def test_an_adapter_whose_files_changed_is_refused(adapter_run_dir, qwen3_model, adapter, tmp_path):
    changed = tmp_path / "adapter"
    shutil.copytree(adapter, changed)
    config = json.loads((changed / "adapter_config.json").read_text())
    (changed / "adapter_config.json").write_text(json.dumps(config | {"lora_alpha": 16}))
    status, out, err = rescore_cli(str(adapter_run_dir), "--model", str(qwen3_model), "--adapter", str(changed))
    assert status == 2 and err.count("\n") == 1
    assert "adapter_config.json is not the run's (SHA-256" in err


def test_a_run_recorded_through_a_server_is_rescored_with_the_hf_model(qwen3_model, qwen3_tokenizer, small_demo, tmp_path):
    """A server of the same weights: its probe answers are the tiny model's own log-probabilities,
    as vLLM labels them; every episode submits, so both probes are asked."""
    from paper_explorer.agent.policies.hf import HFPolicy
    from tests.agent.test_probes import probe_answer, scripted_server

    served = HFPolicy.load(str(qwen3_model))

    def top_logprobs(body):
        yes, no = served.renderer.text("Yes")[0], served.renderer.text("No")[0]
        reading = served.probe(body["prompt"], [yes, no], use_cache=False)
        return 200, probe_answer({f"token_id:{yes}": reading.logprobs[0], f"token_id:{no}": reading.logprobs[1]})

    server = scripted_server(probe=top_logprobs)
    policy = make_config("openai", base_url=[server.url], model="served", tokenizer=qwen3_tokenizer, retries=1)
    config = EvalConfig(split="all", limit=2, policy=policy, episode=EpisodeConfig(max_steps=2, probes=["answerable", "correct"]))
    try:
        run_dir = evaluate(config, out=tmp_path / "served", corpus=small_demo).directory
    finally:
        server.server.shutdown()
    status, out, err = rescore_cli(str(run_dir), "--model", str(qwen3_model))
    assert status == 0, err
    assert "note: recorded by --policy openai (served model served): rescored with the hf model" in out
    assert "probes compared: 4 of 2 episodes" in out and "agreement: 1.0000 (4 of 4 decisions)" in out


# -- the check fails: exit 1, naming the first mismatch ---------------------------------------------


def test_a_tampered_probability_is_named(run_dir, qwen3_model, tmp_path):
    def nudge(record):
        yes, no = record["probes"][0]["probabilities"]
        record["probes"][0]["probabilities"] = [yes + 1e-3, no - 1e-3]  # the same decision, off by 1e-3

    copy, episode = tampered(run_dir, tmp_path, nudge)
    status, out, err = rescore_cli(str(copy), "--model", str(qwen3_model))
    assert status == 1 and "agreement: 1.0000" in out and "rescore holds" not in out
    assert f"rescore broken: episode {episode} " in err and "probe answerable differs by 0.001 (tolerance 5e-05)" in err
    assert "recorded [" in err and "recomputed [" in err
    status, _, err = rescore_cli(str(copy), "--model", str(qwen3_model), "--tolerance", "0.01")
    assert status == 0, err  # the tolerance is what says how close is close enough


def test_a_tampered_conversation_stops_before_the_model_loads(run_dir, qwen3_model, tmp_path):
    def edit(record):
        record["steps"][0]["observation"] += " (edited)"

    copy, episode = tampered(run_dir, tmp_path, edit)
    status, out, err = rescore_cli(str(copy), "--model", str(qwen3_model))
    assert status == 1 and "probes compared" not in out
    assert f"episode {episode} " in err and "its prompt rebuilt from the trajectory" in err and "is not the recorded one" in err


def test_another_model_with_the_same_tokenizer_is_named(run_dir, qwen3_tokenizer, tmp_path):
    from paper_explorer.agent.testing.tiny_model import build_tiny_model

    other = build_tiny_model(tmp_path / "other", seed=1, tokenizer_from=qwen3_tokenizer)
    report = rescore(run_dir, str(other))
    assert not report.holds and report.largest_difference > TOLERANCE
    status, _, err = rescore_cli(str(run_dir), "--model", str(other))
    assert status == 1 and err.startswith("rescore broken: episode ") and "recomputed [" in err


# -- bad input: one line, exit 2 --------------------------------------------------------------------


def test_a_model_with_another_tokenizer_is_refused(run_dir, tiny_model):
    status, _, err = rescore_cli(str(run_dir), "--model", str(tiny_model))
    assert status == 2 and err.count("\n") == 1 and "its tokenizer" in err and "name the run's model" in err


def test_a_run_without_probes_and_a_missing_directory_are_one_line(tmp_path, small_demo, qwen3_model):
    plain = evaluate(EvalConfig(split="all", limit=1), out=tmp_path / "scripted", corpus=small_demo).directory
    status, _, err = rescore_cli(str(plain), "--model", str(qwen3_model))
    assert (status, err) == (2, f"error: {plain}: no probes, so nothing to rescore; record them with explorer eval --probe answerable\n")
    status, _, err = rescore_cli(str(tmp_path / "nowhere"), "--model", str(qwen3_model))
    assert (status, err) == (2, f"error: {tmp_path / 'nowhere'}: no such run directory\n")


# -- every recorded field is checked (attack 25) ----------------------------------------------------


@pytest.mark.parametrize(
    ("field", "change", "said"),
    [
        # 1e-3 on a log-probability near -12: 8.3e-5 relative to its size, above the tolerance (its
        # third digit depends on the value, which moves with the system prompt the model was given)
        (
            "logprob",
            lambda probe: probe["logprobs"].__setitem__(0, probe["logprobs"][0] + 1e-3),
            "e-05 relative to their size",  # 1e-3 / |-12|: 8.3e-5, its last digit the recorded value's
        ),
        ("mass", lambda probe: probe.__setitem__("mass", 0.9), "its options' mass differs by"),
        ("prompt_tokens", lambda probe: probe.__setitem__("prompt_tokens", probe["prompt_tokens"] + 1), "is not the recorded one"),
    ],
)
def test_a_tampered_logprob_mass_or_prompt_length_is_named(run_dir, qwen3_model, tmp_path, field, change, said):
    copy, episode = tampered(run_dir, tmp_path, lambda record: change(record["probes"][0]))
    status, out, err = rescore_cli(str(copy), "--model", str(qwen3_model))
    assert status == 1 and "rescore holds" not in out, field
    assert f"rescore broken: episode {episode} " in err and "probe answerable" in err and said in err


def test_a_dropped_probe_is_named_before_the_model_loads(run_dir, qwen3_model, tmp_path):
    copy, episode = tampered(run_dir, tmp_path, lambda record: record.__setitem__("probes", []))
    status, out, err = rescore_cli(str(copy), "--model", str(qwen3_model))
    assert status == 1 and "probes compared" not in out
    assert err.startswith(f"rescore broken: episode {episode} (question ") and err.count("\n") == 1
    assert err.endswith("has no probe answerable, which the run's config asked for\n")


def test_a_probe_recorded_as_not_measured_is_rechecked(run_dir, qwen3_model, tmp_path):
    def forge(reason):
        def change(record):
            probe = record["probes"][0]
            for key in ("logprobs", "probabilities", "mass", "source", "cached_tokens"):
                probe.pop(key, None)
            probe["not_measured"] = reason.format(tokens=probe["prompt_tokens"])
            return record

        return change

    copy, episode = tampered(run_dir, tmp_path, forge("forged"))
    status, _, err = rescore_cli(str(copy), "--model", str(qwen3_model))
    assert status == 1 and f"episode {episode} " in err and "recorded as not measured (forged), but it is measurable" in err
    shutil.rmtree(copy)
    context_reason = "the probe's prompt of {tokens} tokens leaves no room for an option in the context of 32768"
    copy, episode = tampered(run_dir, tmp_path, forge(context_reason))
    status, _, err = rescore_cli(str(copy), "--model", str(qwen3_model))
    assert status == 1 and f"episode {episode} " in err and "fits the recorded max_context of" in err
    shutil.rmtree(copy)

    def overflowing(record):  # the same record, as a policy of a context too small for its prompt would have left it
        forge(context_reason)(record)
        record["policy"]["settings"]["max_context"] = record["probes"][0]["prompt_tokens"]

    copy, _ = tampered(run_dir, tmp_path, overflowing)
    report = rescore(copy, str(qwen3_model))
    assert report.holds and report.not_measured == 1 and len(report.comparisons) == 1, report.mismatch


def test_a_nan_probability_is_refused_as_the_log_is_read(run_dir, qwen3_model, tmp_path):
    """NaN is not JSON: a log that holds one is refused with its line, before any comparison."""
    copy, _ = tampered(run_dir, tmp_path, lambda record: record["probes"][0]["probabilities"].__setitem__(0, float("nan")))
    status, _, err = rescore_cli(str(copy), "--model", str(qwen3_model))
    assert status == 2 and err.count("\n") == 1 and "trajectories.jsonl:1: NaN" in err, err


@pytest.mark.parametrize("tolerance", ["inf", "1e400", "-1", "nan"])
def test_a_tolerance_that_is_not_a_finite_number_of_zero_or_more_is_one_line(run_dir, qwen3_model, tolerance):
    status, _, err = rescore_cli(str(run_dir), "--model", str(qwen3_model), "--tolerance", tolerance)
    assert status == 2 and err.count("\n") == 1 and "give a finite number of 0 or more" in err


def test_a_recorded_probes_file_that_is_gone_or_not_a_file_says_where_to_put_it(run_dir, qwen3_model, tmp_path):
    import os

    copy = tmp_path / "elsewhere"
    shutil.copytree(run_dir, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    for name, make in (("gone.toml", lambda path: None), ("fifo.toml", os.mkfifo), ("dir.toml", os.mkdir)):
        path = tmp_path / name
        make(path)
        manifest["config"]["episode"]["probes_file"] = str(path)
        (copy / "manifest.json").write_text(json.dumps(manifest))
        status, out, err = rescore_cli(str(copy), "--model", str(qwen3_model))
        assert status == 2 and err.count("\n") == 1 and "probes compared" not in out, err
        assert err.startswith(f"error: {path}: ") and f"the run asked its probes from {path}" in err and "put that file back" in err
