"""Frames as the host decodes them: strict JSON only, numbers included. One property each."""

import json

import pytest

from paper_explorer.tools import wire


@pytest.mark.parametrize(
    "literal",
    ["1e999", "-1e999", "1e400", "123456789012345678901234567890", "-18446744073709551616", "NaN", "Infinity", "-Infinity", "1" * 5000],
)
def test_a_number_that_is_not_a_finite_float_or_a_64_bit_int_is_malformed(literal):
    with pytest.raises(wire.FrameMalformed):
        wire.decode(b'{"op":"call","args":[' + literal.encode() + b"]}")


@pytest.mark.parametrize("number", [1e308, -1e308, 5e-324, 0.0, 2**63 - 1, -(2**63), 2**64 - 1, -(2**64 - 1), 0])
def test_finite_floats_and_64_bit_ints_cross_exactly(number):
    assert wire.decode(json.dumps({"value": number}).encode())["value"] == number


def test_what_to_wire_sends_the_host_decodes():
    """The worker's side never sends a number the host refuses: it turns the rest into markers."""
    values = [2**64 - 1, -(2**64 - 1), 2**64, 10**29, 1e308, float("inf"), float("nan")]
    frame = wire.encode({"args": wire.to_wire(values)})
    decoded = wire.decode(frame[wire.HEADER.size :], wire.marker_hook)["args"]
    assert decoded[:2] == values[:2] and decoded[4] == 1e308
    assert all(isinstance(item, wire.Marker) for item in (decoded[2], decoded[3], decoded[5], decoded[6]))


def test_encode_refuses_what_decode_would():
    with pytest.raises(ValueError):
        wire.encode({"value": float("inf")})


@pytest.mark.parametrize("text", ["\U0001f600" * 100, "\x00\x1f" * 100, "\ud800" * 100, "\udc00\U0001f600\ud83dx" * 50, 'é\u2028"\\' * 100])
def test_a_frame_is_valid_utf_8_and_at_most_6_bytes_a_character(text):
    """Astral characters go as their 4 UTF-8 bytes, not as 12 bytes of escapes; lone surrogates and
    control characters as 6-byte escapes; a lone surrogate is read back as U+FFFD, as ever."""
    frame = wire.encode({"s": text})
    body = frame[wire.HEADER.size :]
    body.decode("utf-8")  # strict
    assert len(body) - len('{"s":""}') <= 6 * len(text)
    assert wire.size({"s": text}) == len(body)
    expected = "".join("\ufffd" if "\ud800" <= c <= "\udfff" else c for c in text)
    assert wire.decode(body)["s"] == expected
    if text.startswith("\U0001f600"):
        assert len(body) - len('{"s":""}') == 4 * len(text)
