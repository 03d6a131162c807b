"""The one-pass candidate scan finds exactly the lines that hold a candidate word."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.diagnose import candidates
from gpufleet.diagnose.rules import CANDIDATE_WORDS

# Pieces that make words overlap, repeat, get cut in half or run into each other across lines.
PIECES = st.sampled_from(
    [w.encode() for w in CANDIDATE_WORDS]
    + [w.encode()[: len(w) // 2] for w in CANDIDATE_WORDS]
    + [w.encode()[len(w) // 2 :] for w in CANDIDATE_WORDS]
    + [b"\n", b" ", b"x", b"NVRM", b"SXid (PCI", b"\xff", b"\x00", b"AER", b":"]
)


def _lines_with_words(block: bytes) -> set[int]:
    """Reference: line indexes whose text contains a word, by plain substring tests."""
    words = [w.encode() for w in CANDIDATE_WORDS]
    return {i for i, ln in enumerate(block.split(b"\n")) if any(w in ln for w in words)}


@settings(max_examples=300, deadline=None)
@given(st.lists(PIECES, max_size=60))
def test_starts_hit_every_line_with_a_word_and_no_other(pieces: list[bytes]) -> None:
    block = b"".join(pieces)
    starts = candidates.starts(block)
    assert starts == sorted(starts)
    hit_lines = {block.count(b"\n", 0, s) for s in starts}
    assert hit_lines == _lines_with_words(block)


@settings(max_examples=300, deadline=None)
@given(st.lists(PIECES, max_size=20))
def test_in_line_agrees_with_substring_tests(pieces: list[bytes]) -> None:
    text = b"".join(pieces).replace(b"\n", b" ").decode("utf-8", errors="replace")
    assert candidates.in_line(text) == any(w in text for w in CANDIDATE_WORDS)


def test_in_line_takes_lone_surrogates() -> None:
    assert candidates.in_line("\udc80 NVRM: Xid (PCI:0000:3b:00): 79")
    assert not candidates.in_line("\udc80 systemd[1]: Started Session 4 of user root.")


def test_overlapping_words_in_one_line_still_mark_the_next_line() -> None:
    # "detected NVSwitch" and "NVRM:" share nothing; a line with two words, then a line with one.
    block = b"nvidia-peermem nvidia-peermem\nplain\nx NETDEV WATCHDOG: eth0: transmit timed out\n"
    assert {block.count(b"\n", 0, s) for s in candidates.starts(block)} == {0, 2}
