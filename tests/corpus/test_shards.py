"""--shard I/N: every question in exactly one shard, the same one on every machine."""

import pytest

from paper_explorer.corpus.splits import parse_shard, shard_of


def test_every_question_falls_in_exactly_one_shard_and_the_slices_are_balanced():
    ids = [f"paper-{n}:q{n % 7}" for n in range(4000)]
    for count in (1, 2, 3, 8):
        shards = [shard_of(question_id, count) for question_id in ids]
        assert set(shards) == set(range(1, count + 1))
        assert max(shards.count(s) for s in range(1, count + 1)) < 1.25 * len(ids) / count


def test_the_shard_depends_on_the_id_only():
    assert shard_of("1909.00694:q3", 8) == shard_of("1909.00694:q3", 8)
    # sha256 of the id: a fixed value, so a change to the hash (which would re-slice runs in flight) fails here
    assert [shard_of(f"q{n}", 4) for n in range(8)] == [4, 3, 4, 4, 4, 2, 2, 4]
    assert shard_of("q0", 1) == 1


@pytest.mark.parametrize("text, expected", [("1/1", (1, 1)), ("2/8", (2, 8)), (" 3/3 ", (3, 3))])
def test_shard_parses(text, expected):
    assert parse_shard(text) == expected


@pytest.mark.parametrize("text", ["0/2", "3/2", "2", "a/b", "1/0", "-1/2", "1/2/3", ""])
def test_a_bad_shard_says_what_is_wrong(text):
    with pytest.raises(ValueError, match="shard"):
        parse_shard(text)
