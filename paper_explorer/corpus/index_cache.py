"""The BM25 index's on-disk cache: one file format and its one owner.

The cache file records the hash of the papers it was built from, the BM25 parameters, the
tokenizer settings and a format version; a cache whose record differs from the corpus at hand
is rebuilt, never trusted. Files are written whole (temporary file, fsync, rename), so a crash
mid-write cannot leave a cache that loads, and read bounded (``_bounded_npz``): a cache is a file
anyone may have written. Where caches live: ``$EXPLORER_CACHE_DIR``, else
``$XDG_CACHE_HOME/paper-explorer``, else ``~/.cache/paper-explorer``.
"""

from __future__ import annotations

import json
import logging
import os
import zipfile
from dataclasses import asdict
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, NamedTuple

import numpy as np

import paper_explorer.corpus.files as files
from paper_explorer.corpus.bm25 import BM25Params
from paper_explorer.corpus.collection import Corpus
from paper_explorer.corpus.files import atomic_file

if TYPE_CHECKING:
    from paper_explorer.corpus.bm25 import BM25
    from paper_explorer.corpus.index import QuoteText

CACHE_FORMAT = 2  # 2: the paragraphs' quote_form is cached too (a change to quote_form needs a new format)
log = logging.getLogger(__name__)


def cache_dir() -> Path:
    if os.environ.get("EXPLORER_CACHE_DIR"):
        return Path(os.environ["EXPLORER_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "paper-explorer"


class Stored(NamedTuple):
    """The arrays of a cache file that matched its header."""

    vocabulary: dict[str, int]
    indptr: np.ndarray
    indices: np.ndarray
    weights: np.ndarray
    doc_lengths: np.ndarray
    quote_text: bytes
    quote_starts: np.ndarray


def header(corpus: Corpus, params: BM25Params, stopwords: bool) -> dict:
    return {
        "format": CACHE_FORMAT,
        "papers_sha256": corpus.papers_sha256,
        "params": asdict(params),
        "stopwords": stopwords,
    }


_ARRAYS = ("indptr", "indices", "weights", "doc_lengths")


def save(path: Path, header: dict, bm25: BM25, quotes: QuoteText) -> None:
    vocabulary = "\n".join(bm25.vocabulary).encode("utf-8")  # tokens never contain a newline
    with atomic_file(path, binary=True) as handle:
        np.savez(
            handle,
            header=np.frombuffer(json.dumps(header, sort_keys=True).encode(), dtype=np.uint8),
            vocabulary=np.frombuffer(vocabulary, dtype=np.uint8),
            quote_text=np.frombuffer(quotes.text, dtype=np.uint8),
            quote_starts=quotes.starts,
            **{name: getattr(bm25, name) for name in _ARRAYS},
        )


def load(path: Path, header: dict) -> Stored | None:
    """The arrays of a cache file that matches ``header``, else None (and the reason logged)."""
    if not path.exists():
        return None
    try:
        with (
            files.open_regular(path, limit=files.DATA_BYTES, inside=path.parent, what="BM25 index cache") as handle,
            _bounded_npz(handle, path) as data,
        ):
            stored = files.parse_json(data["header"].tobytes(), path)
            if stored != header:
                log.info("rebuilding BM25 index: cache %s was built for other content or settings", path)
                return None
            words = data["vocabulary"].tobytes().decode("utf-8")
            vocabulary = {word: i for i, word in enumerate(words.split("\n"))} if words else {}
            arrays = [data[name] for name in _ARRAYS]
            quote_text, quote_starts = data["quote_text"].tobytes(), data["quote_starts"]
    except (OSError, ValueError, KeyError, zipfile.BadZipFile, UnicodeDecodeError, files.FileRefused, RecursionError) as error:
        log.warning("rebuilding BM25 index: cache %s is unreadable (%s)", path, error)
        return None
    consistent = len(vocabulary) + 1 == len(arrays[0]) and len(quote_starts) == len(arrays[-1])
    if not consistent or not _ascending_within(quote_starts, len(quote_text)):
        log.warning("rebuilding BM25 index: cache %s is inconsistent", path)
        return None
    indptr, indices, weights, doc_lengths = arrays
    return Stored(vocabulary, indptr, indices, weights, doc_lengths, quote_text, quote_starts)


CACHE_ARRAY_BYTES = 4 * files.DATA_BYTES  # all a cache's arrays decompressed: an index of the largest corpus
CACHE_HEADER_BYTES = 1 << 20  # the cache's JSON header, as an array


def _bounded_npz(handle: IO[bytes], path: Path) -> Any:
    """``np.load`` of a cache whose decompressed arrays are bounded before any is read: the sizes
    the zip declares (which ``zipfile`` holds each member to) at most CACHE_ARRAY_BYTES in all and
    the header at most CACHE_HEADER_BYTES, and each array's shape (from its .npy header) no larger
    than its member: numpy allocates the shape a header says before reading, so a small file could
    otherwise ask for terabytes. Any mismatch is a ValueError: the caller logs it and rebuilds."""
    with zipfile.ZipFile(handle) as archive:
        members = archive.infolist()
        if sum(member.file_size for member in members) > CACHE_ARRAY_BYTES:
            raise ValueError(f"arrays of more than {CACHE_ARRAY_BYTES >> 30} GiB decompressed")
        for member in members:
            if member.filename == "header.npy" and member.file_size > CACHE_HEADER_BYTES:
                raise ValueError("a header larger than a cache's")
            with archive.open(member) as array:
                version = np.lib.format.read_magic(array)
                if version == (1, 0):
                    shape, _, dtype = np.lib.format.read_array_header_1_0(array)
                elif version == (2, 0):
                    shape, _, dtype = np.lib.format.read_array_header_2_0(array)
                else:
                    raise ValueError(f"{member.filename}: an array of format {version}, not one a cache is written in")
                if dtype.hasobject or int(np.prod(shape, dtype=np.float64)) * dtype.itemsize > member.file_size:
                    raise ValueError(f"{member.filename}: an array larger than the bytes that hold it")
    handle.seek(0)
    return np.load(handle, allow_pickle=False)


def _ascending_within(starts: np.ndarray, size: int) -> bool:
    """Paragraph offsets that can address the text: ascending (each paragraph at least its
    newline long) and inside it."""
    return len(starts) == 0 or (starts[0] == 0 and bool(np.all(np.diff(starts) >= 1)) and int(starts[-1]) <= size)
