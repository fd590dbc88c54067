"""The third-party warnings every training run printed, silenced where we know them and why;
any other warning still shows.

* transformers 5 renamed gradient checkpointing to activation checkpointing and warns on the
  old names until v6: ``TrainingArguments(gradient_checkpointing=..., gradient_checkpointing_kwargs=...)``
  (ours), ``gradient_checkpointing_enable`` (ours and peft's) and ``is_gradient_checkpointing``
  (the Trainer's own). The old names are the only ones the transformers versions we support
  (>=4.56) all take, and they work until v6, which our pin (<6) keeps out.
* bitsandbytes on a CPU with AVX512-BF16 logs, on import, that it could not load the optional
  ``kernels`` package's 4-bit matmul: it then uses its own CPU kernel, which is what we test on.
"""

from __future__ import annotations

import logging
import warnings
from contextlib import contextmanager

RENAMED_IN_TRANSFORMERS_5 = (
    "gradient_checkpointing",
    "gradient_checkpointing_kwargs",
    "gradient_checkpointing_enable",
    "is_gradient_checkpointing",
)
# warnings' message filter is a regular expression matched at the start of the message.
RENAMED_MESSAGE = rf"`({'|'.join(RENAMED_IN_TRANSFORMERS_5)})` is deprecated and will be removed in v6"
BITSANDBYTES_CPU_LOGGER = "bitsandbytes.backends.cpu.ops"
BITSANDBYTES_NO_KERNELS = "Failed to load CPU gemm_4bit_forward from kernels-community"


class _WithoutOptionalKernelNote(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(BITSANDBYTES_NO_KERNELS)


@contextmanager
def known_warnings_silenced():
    """While training: the warnings above are not shown; every other one is, as before. Restored on
    exit (a Python caller's own warning filters and loggers are theirs again)."""
    logger, quiet = logging.getLogger(BITSANDBYTES_CPU_LOGGER), _WithoutOptionalKernelNote()
    logger.addFilter(quiet)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=RENAMED_MESSAGE, category=FutureWarning)
            yield
    finally:
        logger.removeFilter(quiet)
