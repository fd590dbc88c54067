import json
import logging

import numpy as np
import pytest

from paper_explorer.corpus import BM25Index, BM25Params


@pytest.fixture
def isolated_cache(tmp_path, monkeypatch):
    """A cache directory of this test's own: other tests' caches must not count here."""
    directory = tmp_path / "explorer-cache"
    monkeypatch.setenv("EXPLORER_CACHE_DIR", str(directory))
    return directory


def cache_files(directory):
    return sorted(directory.glob("bm25-*.npz"))


def test_cache_is_written_then_loaded_with_identical_results(small_demo, isolated_cache):
    built = BM25Index.cached(small_demo)
    assert built.source == "built" and len(cache_files(isolated_cache)) == 1
    loaded = BM25Index.cached(small_demo)
    assert loaded.source == "cache"
    for query in ("learning rate", "datasets baselines evaluation", "nothing-matches"):
        assert np.array_equal(loaded.scores(query), built.scores(query))
        assert loaded.search(query, k=7) == built.search(query, k=7)
    assert loaded.quotes.text == built.quotes.text and np.array_equal(loaded.quotes.starts, built.quotes.starts)
    for quote in (built.paragraphs[-1].text[5:60], built.paragraphs[-1].text.split()[-1] * 3):
        assert loaded.find_quote(quote) == built.find_quote(quote)


def test_cache_whose_quote_offsets_cannot_address_its_text_is_rebuilt(small_demo, isolated_cache, caplog):
    BM25Index.cached(small_demo)
    (path,) = cache_files(isolated_cache)
    with np.load(path) as data:
        arrays = dict(data)
    arrays["quote_starts"] = arrays["quote_starts"][::-1].copy()
    np.savez(path, **arrays)
    index = BM25Index.cached(small_demo)
    assert index.source == "built" and "inconsistent" in caplog.text


def test_cache_of_other_settings_is_rebuilt_not_trusted(small_demo, isolated_cache):
    BM25Index.cached(small_demo)
    assert BM25Index.cached(small_demo, BM25Params(k1=1.2)).source == "built"
    assert BM25Index.cached(small_demo, stopwords=False).source == "built"


def test_cache_with_a_different_hash_in_its_header_is_rebuilt(small_demo, isolated_cache, caplog):
    BM25Index.cached(small_demo)
    (path,) = cache_files(isolated_cache)
    with np.load(path) as data:
        arrays = dict(data)
    header = json.loads(arrays["header"].tobytes())
    header["papers_sha256"] = "0" * 64
    arrays["header"] = np.frombuffer(json.dumps(header, sort_keys=True).encode(), dtype=np.uint8)
    arrays["weights"] = arrays["weights"] * 0  # what a trusted stale cache would serve
    np.savez(path, **arrays)
    with caplog.at_level(logging.INFO):
        index = BM25Index.cached(small_demo)
    assert index.source == "built" and "built for other content" in caplog.text
    assert index.scores("learning rate").max() > 0


def test_corrupt_cache_is_rebuilt_with_a_warning(small_demo, isolated_cache, caplog):
    BM25Index.cached(small_demo)
    (path,) = cache_files(isolated_cache)
    path.write_bytes(path.read_bytes()[:100])
    index = BM25Index.cached(small_demo)
    assert index.source == "built" and "unreadable" in caplog.text
    assert BM25Index.cached(small_demo).source == "cache"  # the rebuild replaced the bad file


def test_unwritable_cache_directory_still_gives_an_index(small_demo, tmp_path, caplog):
    blocker = tmp_path / "file-not-dir"
    blocker.write_text("")
    index = BM25Index.cached(small_demo, directory=blocker / "cache")
    assert index.source == "built" and "could not write" in caplog.text


def test_cache_whose_array_header_asks_for_more_than_it_holds_is_rebuilt_unread(small_demo, isolated_cache, caplog):
    """numpy allocates the shape an .npy header says before reading: a cache of a few bytes that
    says 10^12 weights is refused from the sizes, not allocated."""
    import io
    import zipfile

    BM25Index.cached(small_demo)
    (path,) = cache_files(isolated_cache)
    with np.load(path) as data:
        arrays = {name: data[name] for name in data.files}
    bomb = io.BytesIO()
    np.lib.format.write_array_header_1_0(bomb, {"descr": "<f4", "fortran_order": False, "shape": (10**12,)})
    bomb.write(b"\0" * 64)
    with zipfile.ZipFile(path, "w") as archive:
        for name, array in arrays.items():
            if name == "weights":
                archive.writestr("weights.npy", bomb.getvalue())
            else:
                member = io.BytesIO()
                np.save(member, array)
                archive.writestr(f"{name}.npy", member.getvalue())
    index = BM25Index.cached(small_demo)
    assert index.source == "built" and "larger than the bytes that hold it" in caplog.text
    assert BM25Index.cached(small_demo).source == "cache"
