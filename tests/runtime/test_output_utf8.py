"""runtime.output.utf8_text: the kept log's UTF-8 made a piece at a time, exactly as as_text makes text."""

import random

import pytest

from evaluations.runtime.output import as_text, utf8_text

# Valid characters of 1-4 bytes, NUL, and invalid UTF-8: a lone continuation byte, truncated sequences,
# an overlong form, a surrogate's encoding, a code point past U+10FFFF, a byte that never starts one.
PARTS = [b"a", b"\n", b"\0", "\u00e9".encode(), "\u241e".encode(), "\U0001f600".encode(), b"\x80", b"\xc3",
         b"\xe2\x90", b"\xf0\x9f\x98", b"\xff", b"\xc0\xaf", b"\xed\xa0\x80", b"\xf4\x90\x80\x80"]  # fmt: skip


def test_any_bytes_cut_anywhere_become_what_as_text_makes_of_them():
    rng = random.Random(38)
    for _ in range(3000):
        data = b"".join(rng.choice(PARTS) for _ in range(rng.randint(0, 40)))
        for piece in (1, 2, 3, 5, 64):  # pieces cut inside sequences, valid or not
            assert utf8_text(data, piece) == as_text(data).encode(), (data, piece)


def test_a_long_run_of_continuation_bytes_is_one_piece_and_still_replaced():
    data = b"a" + b"\x80" * 1000 + "\u00e9".encode()
    assert utf8_text(data, 4) == as_text(data).encode() == ("a" + "\ufffd" * 1000 + "\u00e9").encode()


def test_valid_utf8_without_nul_is_returned_as_it_is():
    data = ("\u241e === running_agent ===\n" + "x" * 100_000 + "\u00e9\n").encode()
    assert utf8_text(data) is data  # no copy of a log already as it is stored


@pytest.mark.parametrize("data", [b"", b"\0", b"ok\xff", b"x" * 70_000 + b"\xe2\x90"])
def test_what_as_text_changes_is_changed(data):
    assert utf8_text(data) == as_text(data).encode()
