"""A checkpoint's completion copies the base model's tokenizer files through corpus.files: a bounded
regular file, never written through a link in the checkpoint (``shutil.copy`` did both)."""

import json

import pytest

from paper_explorer.sft.checkpoints import MANIFEST, complete_checkpoint
from paper_explorer.sft.config import TrainConfig
from paper_explorer.sft.errors import TrainingError


@pytest.fixture
def places(tmp_path):
    model, data, checkpoint = tmp_path / "model", tmp_path / "data", tmp_path / "out" / "checkpoint-2"
    for directory in (model, data, checkpoint):
        directory.mkdir(parents=True)
    (data / "build_report.json").write_text("{}")
    (model / "tokenizer_config.json").write_text(json.dumps({"chat_template": "x"}))
    return model, data, checkpoint


def complete(model, data, checkpoint):
    complete_checkpoint(checkpoint, TrainConfig(model=str(model)), data, quantized=False, tokenizer_sha256=None, record=None)


def test_the_tokenizer_files_are_copied_and_hashed(places):
    model, data, checkpoint = places
    (model / "tokenizer.json").write_text('{"model": {}}')
    complete(model, data, checkpoint)
    assert (checkpoint / "tokenizer.json").read_text() == '{"model": {}}'
    assert set(json.loads((checkpoint / MANIFEST).read_text())["files"]) == {"tokenizer.json", "tokenizer_config.json"}


def test_a_link_in_the_checkpoint_is_replaced_never_written_through(places, tmp_path):
    model, data, checkpoint = places
    (model / "tokenizer.json").write_text('{"model": {}}')
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text("mine")
    (checkpoint / "tokenizer.json").symlink_to(elsewhere)
    complete(model, data, checkpoint)
    assert elsewhere.read_text() == "mine"
    assert not (checkpoint / "tokenizer.json").is_symlink()


def test_a_tokenizer_file_over_its_bound_or_not_a_file_is_one_line_and_no_manifest(places, tmp_path):
    model, data, checkpoint = places
    with open(model / "tokenizer.json", "wb") as handle:
        handle.truncate(65 << 20)  # sparse: over the 64 MiB bound of a document, costing no disk
    with pytest.raises(TrainingError, match=r"tokenizer.json: more than 64 MiB.*left incomplete") as refused:
        complete(model, data, checkpoint)
    assert "\n" not in str(refused.value)
    assert not (checkpoint / "tokenizer.json").exists() and not (checkpoint / MANIFEST).exists()
    (model / "tokenizer.json").unlink()
    (model / "tokenizer.json").symlink_to("/dev/null")
    with pytest.raises(TrainingError, match="character device"):
        complete(model, data, checkpoint)
