"""Loading a causal language model and its renderer, once for serving and training alike.

``load_causal_lm`` is the one place that decides quantization (4-bit NF4 with double
quantization and the compute dtype for QLoRA), dtype and device; the hf policy and
``sft.model`` both call it, so a model is served exactly as it is trained. Heavy imports
(torch, transformers) happen inside the functions.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import paper_explorer.corpus.files as files
from paper_explorer.agent.errors import AgentError
from paper_explorer.agent.renderer import ChatRenderer

QUANTIZATIONS = ("auto", "4bit", "none")


def file_sha256(path: Path, inside: Path | None = None) -> str:
    """A file's SHA-256, read in blocks (``corpus.files.sha256``: a regular file, never a FIFO or a
    device, bounded in size; ``inside``: the directory it must not be linked out of)."""
    try:
        return files.sha256(path, inside=inside)
    except files.FileRefused as error:
        raise AgentError(str(error)) from None


def file_hashes(directory: Path) -> dict[str, str]:
    """SHA-256 of every file in a directory (an adapter, a checkpoint), by relative path. A link out
    of the directory is refused: its hash would fingerprint (and read) a file the adapter is not."""
    return {
        str(path.relative_to(directory)): file_sha256(path, directory) for path in sorted(p for p in directory.rglob("*") if p.is_file())
    }


def resolve_model(model: str) -> str:
    """A local model directory (absolute) or a hub id; one clear line when it is neither."""
    path = Path(model)
    if path.exists():
        if not (path / "config.json").exists():
            raise AgentError(f"{model}: no config.json; name a model directory or a hub id")
        return str(path.resolve())
    if model.startswith((".", "/", "~")) or model.count("/") > 1:
        raise AgentError(f"{model}: no such model directory (a hub id looks like Qwen/Qwen3-8B)")
    return model


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")  # the renderer reads these
HUB_HTTP_LOGGER = "huggingface_hub.utils._http"  # where the hub logs each failed request and each retry


class _RetriesSaidOnce(logging.Filter):
    """The hub logs two lines per failed request and retries five times (about 23 s offline): the
    user sees one line of ours at the first retry, with what to do, and none of the hub's."""

    def __init__(self, model: str) -> None:
        super().__init__()
        self.model = model
        self.said = False

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.getMessage().startswith("Retrying in") or self.said:
            return False
        self.said = True
        record.msg = (
            f"{self.model}: the Hugging Face hub does not answer; retrying for about 20 s "
            "(offline, set HF_HUB_OFFLINE=1 to use only the local cache, or name a model directory)"
        )
        record.args = ()
        return True


@contextmanager
def hub_retries_said_once(model: str) -> Iterator[None]:
    """While the hub is asked for ``model``'s files, its failed requests and retries are one line."""
    logger = logging.getLogger(HUB_HTTP_LOGGER)
    quiet = _RetriesSaidOnce(model)
    logger.addFilter(quiet)
    try:
        yield
    finally:
        logger.removeFilter(quiet)


def tokenizer_file(model: str) -> Path:
    """The tokenizer.json of a model: in its directory, or the hub's (fetched once into the
    Hugging Face cache with the files that hold its chat template, so its fingerprint is that of
    the file every later load reads)."""
    path = Path(model)
    if path.exists():
        file = path / "tokenizer.json" if path.is_dir() else path
        if not file.exists():
            raise AgentError(f"{model}: no tokenizer.json; name a model or tokenizer directory")
        return file
    try:
        from huggingface_hub import hf_hub_download
        from huggingface_hub.errors import EntryNotFoundError

        with hub_retries_said_once(model):
            file = Path(hf_hub_download(model, TOKENIZER_FILES[0]))
            for name in TOKENIZER_FILES[1:]:
                try:
                    hf_hub_download(model, name)  # beside tokenizer.json in the same snapshot folder
                except EntryNotFoundError:
                    pass  # a repository has one or the other; read_template says when neither holds a template
        return file
    except Exception as error:  # offline, no such repository, or no tokenizer.json in it
        raise AgentError(f"{model}: cannot fetch its tokenizer.json ({str(error).splitlines()[0]})") from None


def load_renderer(model: str) -> ChatRenderer:
    """The chat renderer of a model: its directory's tokenizer.json and chat template, or the hub's."""
    return ChatRenderer.from_file(tokenizer_file(model))


def default_threads() -> int:
    """Half the CPUs this process may use, at least 1: torch's default (every core) loses badly on
    a machine shared with other work (1.3 against 14.8 tokens/s on a loaded 2-core machine)."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, usable // 2)


def set_threads(threads: int | None) -> int:
    """Set torch's CPU threads (None: ``default_threads``) and return how many, to be recorded."""
    import torch

    chosen = threads if threads is not None else default_threads()
    if torch.get_num_threads() != chosen:
        torch.set_num_threads(chosen)
    return chosen


@dataclass
class LoadedModel:
    model: Any
    quantization: str  # what was done: "4bit" or "none"
    dtype: Any
    threads: int = 1  # torch's CPU threads, as set for it


def load_causal_lm(model: str, quantization: str = "auto", device_map: Any = None, threads: int | None = None) -> LoadedModel:
    """The model in 4-bit (NF4, double quantization, bf16 compute) or full precision; ``auto`` is
    4-bit on CUDA and full precision on a CPU. ``device_map`` defaults to the whole model on this
    process's GPU (``LOCAL_RANK`` under accelerate launch) or the CPU. ``threads``: torch's CPU
    threads (``set_threads``)."""
    import torch
    from transformers import AutoModelForCausalLM

    if quantization not in QUANTIZATIONS:
        raise AgentError(f"unknown quantization {quantization!r}; choose {', '.join(QUANTIZATIONS)}")
    model = resolve_model(model)
    cuda = torch.cuda.is_available()
    chosen = ("4bit" if cuda else "none") if quantization == "auto" else quantization
    dtype = torch.bfloat16 if cuda else torch.float32
    if device_map is None:
        device_map = {"": int(os.environ.get("LOCAL_RANK", 0))} if cuda else "cpu"
    arguments: dict[str, Any] = {"dtype": dtype, "device_map": device_map}
    if chosen == "4bit":
        from transformers import BitsAndBytesConfig

        arguments["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=dtype,
        )
    from huggingface_hub import utils as hub_utils
    from transformers.utils import logging as transformers_logging

    # transformers' bar over reading weights already on disk is noise in every log, but a download
    # (16 GB for Qwen3-8B) must show its progress: transformers' switch turns both off, so the
    # hub's bars are turned back on unless they were off before (HF_HUB_DISABLE_PROGRESS_BARS=1).
    downloads_silent = hub_utils.are_progress_bars_disabled()
    transformers_logging.disable_progress_bar()
    if not downloads_silent:
        hub_utils.enable_progress_bars()
    try:
        with hub_retries_said_once(model):
            loaded = AutoModelForCausalLM.from_pretrained(model, **arguments)
    except OSError as error:
        raise AgentError(f"{model}: cannot load the model ({str(error).splitlines()[0]})") from None
    return LoadedModel(loaded, chosen, dtype, set_threads(threads))
