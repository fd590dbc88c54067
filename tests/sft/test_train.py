"""QLoRA training on CPU with the tiny model: 4-bit, loss going down, the assistant-only loss,
checkpoints that reload into the hf policy, behavioural validation, and the shortcut caught."""

import json

import pytest

from paper_explorer.sft.config import TrainConfig
from paper_explorer.sft.memory import QWEN3_8B, Shape, estimate
from paper_explorer.sft.model import assistant_loss, load_model
from paper_explorer.sft.records import TeacherForced, ValidationRecord
from paper_explorer.sft.train import train
from paper_explorer.sft.validation import select_checkpoint
from tests.conftest import run_cli

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def data(tmp_path_factory, tiny_model):
    """Teacher trajectories of a small corpus, built into a dataset for the tiny model."""
    directory = tmp_path_factory.mktemp("sft")
    corpus = directory / "corpus.jsonl"
    assert run_cli("corpus", "generate", "--papers", "16", "--seed", "2", "--out", str(corpus)).returncode == 0
    assert run_cli("sft", "teach", "--corpus", str(corpus), "--split", "all", "--out", str(directory / "t.jsonl")).returncode == 0
    done = run_cli(
        "sft",
        "build",
        "--corpus",
        str(corpus),
        "-t",
        str(directory / "t.jsonl"),
        "--tokenizer",
        str(tiny_model),
        "--out",
        str(directory / "data"),
        "--evaluation-split",
        "none",
        "--validation-share",
        "0.25",
    )
    assert done.returncode == 0, done.stderr
    return directory


def small_config(tiny_model, **fields):
    return TrainConfig(
        **{
            "model": str(tiny_model),
            "quantization": "4bit",
            "epochs": 1,
            "gradient_accumulation_steps": 1,
            "max_length": 4096,
            "validation_examples": 2,
            "validation_episodes": 2,
            "validation_max_steps": 2,
            "validation_max_new_tokens": 8,
            **fields,
        }
    )


def test_the_assistant_only_loss_equals_the_usual_shifted_loss(tiny_model, data):
    from paper_explorer.sft.dataset import load_examples

    model, _ = load_model(small_config(tiny_model, quantization="none", gradient_checkpointing=False))
    model.eval()
    example = load_examples(data / "data" / "train.jsonl")[0]
    ids, labels = torch.tensor([example.input_ids]), torch.tensor([example.labels])
    with torch.no_grad():
        ours, _, _ = assistant_loss(model, ids, labels)
        usual = model(input_ids=ids, labels=labels).loss
    assert torch.allclose(ours, usual, rtol=1e-5)


def test_loss_decreases_on_a_repeated_batch_in_4_bit(tiny_model, data, tmp_path):
    import bitsandbytes as bnb

    repeated = tmp_path / "repeated"
    repeated.mkdir()
    first = (data / "data" / "train.jsonl").read_text().splitlines()[0]
    (repeated / "train.jsonl").write_text((first + "\n") * 6)
    (repeated / "validation.jsonl").write_text("")
    (repeated / "build_report.json").write_text((data / "data" / "build_report.json").read_text())
    config = small_config(tiny_model, learning_rate=1e-2, validation_episodes=0)
    model, quantized = load_model(config)
    assert quantized and any(isinstance(m, bnb.nn.Linear4bit) for m in model.modules())
    del model
    summary = train(config, data=repeated, out=tmp_path / "out", corpus=None, log=lambda *_: None)
    assert summary.steps == 6 and summary.losses[-1] < summary.losses[0]


def test_gradient_accumulation_logs_the_mean_loss_not_a_multiple(tiny_model, data, tmp_path):
    from paper_explorer.sft.dataset import load_examples

    repeated = tmp_path / "repeated"
    repeated.mkdir()
    first = (data / "data" / "train.jsonl").read_text().splitlines()[0]
    (repeated / "train.jsonl").write_text((first + "\n") * 4)
    (repeated / "validation.jsonl").write_text("")
    (repeated / "build_report.json").write_text((data / "data" / "build_report.json").read_text())
    config = small_config(tiny_model, quantization="none", gradient_accumulation_steps=4, learning_rate=1e-9, validation_episodes=0)
    model, _ = load_model(config)
    example = load_examples(repeated / "train.jsonl")[0]
    with torch.no_grad():
        expected, _, _ = assistant_loss(model.eval(), torch.tensor([example.input_ids]), torch.tensor([example.labels]))
    del model
    summary = train(config, data=repeated, out=tmp_path / "out", corpus=None, log=lambda *_: None)
    assert summary.steps == 1 and summary.losses[0] == pytest.approx(expected.item(), rel=0.02)


def test_checkpoints_hold_everything_and_reload_into_the_hf_policy(tiny_model, data, tmp_path, small_demo):
    from paper_explorer.agent.models import file_sha256 as sha256_file
    from paper_explorer.agent.policies.hf import HFPolicy
    from paper_explorer.agent.runner import EpisodeRunner
    from paper_explorer.agent.trajectory import EpisodeConfig
    from paper_explorer.corpus import BM25Index, load

    corpus = load(data / "corpus.jsonl")
    summary = train(small_config(tiny_model, max_steps=2), data=data / "data", out=tmp_path / "out", corpus=corpus, log=lambda *_: None)
    (record,) = summary.checkpoints
    checkpoint = tmp_path / "out" / record.checkpoint
    for name in (
        "adapter_model.safetensors",
        "adapter_config.json",
        "tokenizer.json",
        "trainer_state.json",
        "optimizer.pt",
        "scheduler.pt",
        "rng_state.pth",
        "training_args.bin",
        "explorer_manifest.json",
    ):
        assert (checkpoint / name).exists(), name
    manifest = json.loads((checkpoint / "explorer_manifest.json").read_text())
    assert all(sha256_file(checkpoint / name) == digest for name, digest in manifest["files"].items())
    # the behavioural validation ran and is logged per checkpoint
    assert record.behaviour.episodes == 2 and record.behaviour.direct_submit_rate is not None
    assert record.teacher_forced.loss_all > 0 and record.teacher_forced.first_action_end_probability is not None
    policy = HFPolicy.load(str(tiny_model), adapter=checkpoint, max_new_tokens=8)
    question = small_demo.questions[0]
    trajectory = EpisodeRunner(small_demo, BM25Index.build(small_demo), policy, EpisodeConfig(max_steps=2)).run(question.text, question)
    assert len(trajectory.steps) == 2 and trajectory.policy.settings["adapter_sha256"]["adapter_model.safetensors"]


def test_selection_prefers_behaviour_and_warns_when_loss_hides_the_shortcut():
    def record(name, loss, rate, f1):
        return ValidationRecord.model_validate(
            {
                "step": 0,
                "checkpoint": name,
                "teacher_forced": {"loss_all": loss},
                "behaviour": {"episodes": 10, "direct_submit_rate": rate, "answer_f1": f1},
            }
        )

    records = [record("checkpoint-10", 1.0, 0.1, 0.40), record("checkpoint-20", 0.8, 0.9, 0.45)]
    result = select_checkpoint(records, TrainConfig())
    assert result.best_checkpoint == "checkpoint-10"
    assert any("loss improved" in w and "direct-submit rate rose" in w for w in result.warnings)
    without_validation_set = [r.model_copy(update={"teacher_forced": TeacherForced()}) for r in records]  # sft build --validation-share 0
    assert select_checkpoint(without_validation_set, TrainConfig()).best_checkpoint == "checkpoint-10"
    none = select_checkpoint([record("checkpoint-20", 0.8, 0.9, 0.45)], TrainConfig())
    assert none.best_checkpoint is None and "none is selected" in none.warnings[0]


def test_among_equal_answers_selection_prefers_actions_then_loss():
    """Early in training no validation episode answers (F1 0 everywhere): the first checkpoint must
    not win by its place; the one whose steps hold actions does, then the lower loss."""

    def record(name, loss, errors):
        behaviour = {"episodes": 6, "direct_submit_rate": 0.0, "answer_f1": 0.0, "format_error_rate": errors}
        return ValidationRecord.model_validate(
            {"step": 0, "checkpoint": name, "teacher_forced": {"loss_all": loss}, "behaviour": behaviour}
        )

    records = [record("checkpoint-8", 1.13, 0.9), record("checkpoint-16", 0.74, 0.3), record("checkpoint-24", 0.61, 0.3)]
    result = select_checkpoint(records, TrainConfig())
    assert result.best_checkpoint == "checkpoint-24" and "fewest format errors, then lowest validation loss" in result.criterion
    older = [r.model_copy(update={"behaviour": r.behaviour.model_copy(update={"format_error_rate": None})}) for r in records]
    assert select_checkpoint(older, TrainConfig()).best_checkpoint == "checkpoint-24"  # records from before the rate: the loss decides
    more_errors = [*records[:2], records[2].model_copy(update={"behaviour": records[0].behaviour})]
    assert select_checkpoint(more_errors, TrainConfig()).best_checkpoint == "checkpoint-16"


def test_training_on_direct_submit_teachers_is_flagged_from_the_command_line(tiny_model, tmp_path):
    """The reference failure in miniature: the loss improves while the policy learns to answer at once."""
    corpus = tmp_path / "corpus.jsonl"
    assert (
        run_cli("corpus", "generate", "--papers", "24", "--seed", "4", "--unanswerable-ratio", "1.0", "--out", str(corpus)).returncode == 0
    )
    assert (
        run_cli("sft", "teach", "--corpus", str(corpus), "--split", "all", "--direct", "--out", str(tmp_path / "t.jsonl")).returncode == 0
    )
    built = run_cli(
        "sft",
        "build",
        "--corpus",
        str(corpus),
        "-t",
        str(tmp_path / "t.jsonl"),
        "--tokenizer",
        str(tiny_model),
        "--out",
        str(tmp_path / "data"),
        "--evaluation-split",
        "none",
        env={"COLUMNS": "200"},
    )
    assert built.returncode == 0 and "the data teaches the direct-submit shortcut" in built.stdout
    (tmp_path / "recipe.toml").write_text(
        "learning_rate = 0.01\nepochs = 3\ngradient_accumulation_steps = 1\nquantization = 'none'\nmax_length = 4096\n"
        "validation_episodes = 4\nvalidation_examples = 4\nvalidation_max_steps = 2\nvalidation_max_new_tokens = 40\n"
    )
    done = run_cli(
        "train",
        "--model",
        str(tiny_model),
        "--data",
        str(tmp_path / "data"),
        "--out",
        str(tmp_path / "out"),
        "--config",
        str(tmp_path / "recipe.toml"),
        "--corpus",
        str(corpus),
        env={"COLUMNS": "200"},
    )
    assert done.returncode == 0, done.stderr
    summary = json.loads((tmp_path / "out" / "training_summary.json").read_text())
    rates = [c["behaviour"]["direct_submit_rate"] for c in summary["checkpoints"]]
    losses = [c["teacher_forced"]["loss_all"] for c in summary["checkpoints"]]
    assert len(rates) == 3 and rates[-1] == 1.0 and losses[-1] < losses[0]
    assert "WARNING: validation loss improved" in done.stdout and summary["best_checkpoint"] != summary["checkpoints"][-1]["checkpoint"]


def test_dry_run_estimates_the_reference_recipe_on_an_l4():
    done = run_cli("train", "--dry-run", env={"COLUMNS": "200"})
    assert done.returncode == 0 and "fits a 24 GB card" in done.stdout and "published config.json (built in)" in done.stdout
    small = run_cli("train", "--dry-run", "--card-gib", "8")
    assert small.returncode == 1 and "does NOT fit" in small.stdout
    terms = estimate(Shape.from_config(QWEN3_8B), 8192, 4, ["q_proj", "v_proj"], trained_share=0.25)
    assert 3 < terms["weights"] < 8 and terms["total"] < 22


@pytest.mark.parametrize(
    "args, message",
    [
        (["train", "--model", "x"], "needs --data"),
        (["train", "--data", "nowhere", "--out", "o"], "no build_report.json"),
        (["train", "--dry-run", "--lora-r", "0"], "lora-r"),
    ],
)
def test_bad_training_arguments_are_one_line(args, message):
    done = run_cli(*args)
    assert done.returncode == 2 and message in done.stderr, done.stderr


def test_unknown_config_fields_are_refused(tmp_path):
    (tmp_path / "c.toml").write_text("learning_rte = 0.1\n")
    done = run_cli("train", "--dry-run", "--config", str(tmp_path / "c.toml"))
    assert done.returncode == 2 and "learning_rte" in done.stderr
