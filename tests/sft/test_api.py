"""sft's Python API, called in this process as a researcher's script would: ``teach``,
``build_dataset`` and ``train`` with their configs, the one-line refusals they raise, the third-party warnings
training no longer prints, and figures rounded for people while the records keep every digit."""

import json
import logging
import re
import warnings

import pytest

from paper_explorer.sft.build import NothingToTrain, build_dataset
from paper_explorer.sft.config import BuildConfig, TrainConfig
from paper_explorer.sft.errors import TrainingError
from paper_explorer.sft.improve import ImproveSettings, improve
from paper_explorer.sft.interrupts import TrainingInterrupted, interrupted_message
from paper_explorer.sft.known_warnings import BITSANDBYTES_CPU_LOGGER, known_warnings_silenced
from paper_explorer.sft.records import BuildReport, TrainingSummary
from paper_explorer.sft.train import train
from paper_explorer.sft.validation import shown

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def corpus():
    from paper_explorer.corpus import DemoConfig, generate

    return generate(DemoConfig(papers=16, seed=2))


def teach(corpus, path, direct: bool = False):
    """Gold-guided teacher trajectories for every question, as ``explorer sft teach --split all`` writes them."""
    from paper_explorer import TeachConfig
    from paper_explorer import teach as teach_all

    teach_all(TeachConfig(split="all", direct=direct), out=path, corpus=corpus)
    return path


@pytest.fixture(scope="module")
def built(tmp_path_factory, tiny_model, corpus):
    """A dataset for the tiny model, built in this process; its directory and its report."""
    directory = tmp_path_factory.mktemp("api")
    config = BuildConfig(evaluation_split="none", validation_share=0.25)
    report = build_dataset(
        config, trajectories=[teach(corpus, directory / "t.jsonl")], tokenizer=tiny_model, out=directory / "data", corpus=corpus
    )
    return directory / "data", report


def small(tiny_model, **fields) -> TrainConfig:
    return TrainConfig(
        **{
            "model": str(tiny_model),
            "quantization": "none",
            "max_steps": 2,
            "gradient_accumulation_steps": 1,
            "max_length": 4096,
            "learning_rate": 1e-3,
            "validation_examples": 1,
            "validation_episodes": 1,
            "validation_max_steps": 2,
            "validation_max_new_tokens": 8,
            **fields,
        }
    )


def test_build_dataset_writes_the_data_and_returns_its_report(built):
    data, report = built
    assert isinstance(report, BuildReport) and report.kept["train"] > 0 and report.parity.mismatches == 0
    assert report.settings == BuildConfig(evaluation_split="none", validation_share=0.25).model_dump()  # recorded whole
    assert BuildReport.model_validate_json((data / "build_report.json").read_text()) == report
    assert len((data / "train.jsonl").read_bytes().splitlines()) == report.kept["train"]


def test_build_dataset_refuses_in_one_line(built, tiny_model, corpus, tmp_path):
    data, report = built
    with pytest.raises(TrainingError, match="already holds a built dataset; pass force=True"):
        build_dataset(BuildConfig(), trajectories=report.sources, tokenizer=tiny_model, out=data, corpus=corpus)
    direct = teach(corpus, tmp_path / "direct.jsonl", direct=True)  # every first action submits: best-of keeps none
    with pytest.raises(NothingToTrain, match="no training example survived the filters"):
        build_dataset(
            BuildConfig(best_of=1, evaluation_split="none"),
            trajectories=[direct],
            tokenizer=tiny_model,
            out=tmp_path / "none",
            corpus=corpus,
        )
    assert not (tmp_path / "none").exists()
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(TrainingError, match="hold no episodes"):
        build_dataset(BuildConfig(), trajectories=[tmp_path / "empty.jsonl"], tokenizer=tiny_model, out=tmp_path / "x", corpus=corpus)


def test_train_returns_the_summary_rounds_what_it_says_and_keeps_every_digit(tiny_model, built, corpus, tmp_path):
    data, _ = built
    said = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        summary = train(small(tiny_model), data=data, out=tmp_path / "out", corpus=corpus, log=said.append)
    assert isinstance(summary, TrainingSummary) and summary.steps == 2 and len(summary.losses) == 2
    assert TrainingSummary.model_validate_json((tmp_path / "out" / "training_summary.json").read_text()) == summary
    # the transformers 5 renames training used to print four times a run are silenced, nothing else is
    renamed = [
        str(w.message) for w in caught if "is deprecated and will be removed in v6" in str(w.message) and "checkpointing" in str(w.message)
    ]
    assert renamed == []
    (line,) = [line for line in said if line.startswith("validation at step 2:")]
    figures = re.findall(r"(?:loss|ends\)|direct-submit|answer F1) (\S+?)(?:,|$)", line)
    assert len(figures) == 4 and all(re.fullmatch(r"\d+\.\d{3}|-", figure) for figure in figures), line
    on_disk = json.loads((tmp_path / "out" / "validation.jsonl").read_text().splitlines()[0])
    assert shown(on_disk["teacher_forced"]["loss_all"]) in line and len(str(on_disk["teacher_forced"]["loss_all"])) > 6


def test_train_refuses_a_directory_of_another_kind_and_a_second_start(tiny_model, built, tmp_path):
    data, _ = built
    with pytest.raises(
        TrainingError,
        match=r"holds a dataset built by explorer sft build .*not a training run; "
        r"explorer train --data .* trains on it; choose another out$",
    ):
        train(small(tiny_model), data=data, out=data)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "validation.jsonl").write_text("")
    with pytest.raises(TrainingError, match="already holds a training run; pass resume=True to continue it or choose another out$"):
        train(small(tiny_model), data=data, out=tmp_path / "out")
    with pytest.raises(TrainingError, match="no training run to resume; start training without resume=True$"):
        train(small(tiny_model), data=data, out=tmp_path / "new", resume=True)
    with pytest.raises(TrainingError, match="no build_report.json; build the data with explorer sft build"):
        train(small(tiny_model), data=tmp_path / "nowhere", out=tmp_path / "new")
    assert not (tmp_path / "new").exists()


def test_improve_refuses_a_directory_of_another_kind_before_writing(tiny_model, built, corpus):
    data, _ = built
    settings = ImproveSettings(
        model=str(tiny_model), rounds=1, samples=1, temperature=0.7, best_of=1, max_steps=2, max_new_tokens=6, validation_episodes=0
    )
    with pytest.raises(TrainingError, match="holds a dataset built by explorer sft build .*not an explorer improve run"):
        improve(settings, out=data, corpus=corpus)
    assert not (data / "improve.json").exists()


def test_every_setting_carries_its_help_and_its_bounds():
    for config in (TrainConfig, BuildConfig):
        assert all(field.description for field in config.model_fields.values()), config
    for bad in ({"max_steps": 0}, {"learning_rate": 0}, {"lora_r": 0}, {"max_direct_submit_rate": 1.5}, {"learning_rte": 1}):
        with pytest.raises(ValueError):
            TrainConfig(**bad)
    assert TrainConfig(max_steps=-1).max_steps == -1 and TrainConfig(max_steps=3).max_steps == 3
    with pytest.raises(ValueError):
        BuildConfig(overflow="truncate")


def test_the_bitsandbytes_kernel_note_is_dropped_and_nothing_else(caplog):
    logger = logging.getLogger(BITSANDBYTES_CPU_LOGGER)
    note = "Failed to load CPU gemm_4bit_forward from kernels-community: %s. Please make sure you already `pip install kernels`"
    with caplog.at_level(logging.WARNING, logger=BITSANDBYTES_CPU_LOGGER):
        with known_warnings_silenced():
            logger.warning(note, "No module named 'kernels'")
            logger.warning("something else went wrong")
        logger.warning(note, "outside training")
    assert [r.getMessage() for r in caplog.records][0] == "something else went wrong"
    assert "outside training" in caplog.records[1].getMessage() and len(caplog.records) == 2


def test_the_interrupt_says_where_the_checkpoint_is_and_how_to_resume(tmp_path):
    stop = TrainingInterrupted(tmp_path / "checkpoint-3", 3, 10, main=True)
    assert interrupted_message(stop, ["explorer", "train", "--out", "my run", "--resume"]) == (
        f"interrupted at step 3 of 10: checkpoint saved to {tmp_path / 'checkpoint-3'} (not validated); "
        "resume with: explorer train --out 'my run' --resume"
    )
    assert interrupted_message(TrainingInterrupted(tmp_path, 3, 10, main=False), ["explorer"]) is None
    assert shown(7.664128237448368) == "7.664" and shown(None) == "-"
