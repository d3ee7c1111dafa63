"""Token-piece decoding and stop-string cutting, checked over arbitrary chunkings."""

from __future__ import annotations

from typing import TypeVar

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hydrad.engine.textstream import StopMatcher, Utf8Detokenizer

# A small alphabet makes stop strings occur often; "€" and "😀" are multi-byte.
ALPHABET = "ab€😀"

Seq = TypeVar("Seq", bytes, str)


def split_at(seq: Seq, data: st.DataObject) -> list[Seq]:
    """Split ``seq`` at hypothesis-chosen cut points (empty chunks included)."""
    cuts = data.draw(st.lists(st.integers(0, len(seq)), max_size=12))
    bounds = [0, *sorted(cuts), len(seq)]
    return [seq[a:b] for a, b in zip(bounds, bounds[1:])]


def first_stop_oracle(text: str, stops: list[str]) -> tuple[str, bool]:
    """Read one character at a time; cut at the first stop that completes."""
    stops = [s for s in stops if s]
    seen = ""
    for ch in text:
        seen += ch
        ending = [s for s in stops if seen.endswith(s)]
        if ending:
            return seen[: len(seen) - max(map(len, ending))], True
    return text, False


# --- Utf8Detokenizer -------------------------------------------------------


def test_split_character_is_held_until_complete() -> None:
    detok = Utf8Detokenizer()
    dash = "—".encode()
    assert detok.push(b"loading " + dash[:1]) == "loading "
    assert detok.push(dash[1:2]) == ""
    assert detok.push(dash[2:] + b" 42%") == "— 42%"
    assert detok.flush() == ""


def test_incomplete_tail_flushes_as_replacement_char() -> None:
    detok = Utf8Detokenizer()
    assert detok.push("é".encode()[:1]) == ""
    assert detok.flush() == "\ufffd"


def test_invalid_bytes_become_replacement_char() -> None:
    detok = Utf8Detokenizer()
    assert detok.push(b"a\xffb") == "a\ufffdb"
    assert detok.push(b"\xc3(") == "\ufffd("


def test_reset_drops_held_bytes() -> None:
    detok = Utf8Detokenizer()
    detok.push(b"\xf0\x9f")
    detok.reset()
    assert detok.push(b"ok") == "ok"
    assert detok.flush() == ""


@given(st.text(), st.data())
def test_detokenizer_roundtrips_any_chunking(text: str, data: st.DataObject) -> None:
    detok = Utf8Detokenizer()
    out = "".join(detok.push(chunk) for chunk in split_at(text.encode(), data))
    assert out + detok.flush() == text


@given(st.binary(max_size=64), st.data())
def test_detokenizer_matches_one_shot_decode_on_any_bytes(raw: bytes, data: st.DataObject) -> None:
    detok = Utf8Detokenizer()
    out = "".join(detok.push(chunk) for chunk in split_at(raw, data))
    assert out + detok.flush() == raw.decode("utf-8", errors="replace")


# --- StopMatcher -----------------------------------------------------------


def test_passthrough_without_stops() -> None:
    matcher = StopMatcher([])
    assert matcher.push("hello") == ("hello", False)
    assert matcher.held == ""
    assert matcher.flush() == ""


def test_empty_stops_are_ignored() -> None:
    matcher = StopMatcher(["", ""])
    assert matcher.push("abc") == ("abc", False)


def test_more_than_four_stops_rejected() -> None:
    with pytest.raises(ValueError, match="at most 4"):
        StopMatcher(["a", "b", "c", "d", "e"])
    StopMatcher(["a", "b", "c", "d", "d", ""])  # duplicates and blanks don't count


def test_stop_split_across_pushes() -> None:
    matcher = StopMatcher(["</s>"])
    assert matcher.push("Hello <") == ("Hello ", False)
    assert matcher.push("/") == ("", False)
    assert matcher.push("s> trailing") == ("", True)
    assert matcher.matched == "</s>"
    assert matcher.push("more") == ("", True)
    assert matcher.flush() == ""


def test_false_alarm_is_released() -> None:
    matcher = StopMatcher(["</s>"])
    assert matcher.push("a </") == ("a ", False)
    assert matcher.push("p>") == ("</p>", False)
    assert matcher.push("x <") == ("x ", False)
    assert matcher.flush() == "<"


def test_stop_completed_first_wins() -> None:
    matcher = StopMatcher(["abcd", "bc"])
    assert matcher.push("xabcd") == ("xa", True)
    assert matcher.matched == "bc"


def test_longer_stop_wins_when_both_end_together() -> None:
    matcher = StopMatcher(["bc", "abc"])
    assert matcher.push("xabc") == ("x", True)
    assert matcher.matched == "abc"


stops_strategy = st.lists(st.text(alphabet=ALPHABET, max_size=4), max_size=4)


@given(st.text(alphabet=ALPHABET, max_size=40), stops_strategy, st.data())
def test_stop_matcher_is_independent_of_chunking(text: str, stops: list[str], data: st.DataObject) -> None:
    matcher = StopMatcher(stops)
    max_hold = max((len(s) - 1 for s in stops if s), default=0)
    out, fed, stopped = "", 0, False
    for chunk in split_at(text, data):
        piece, stopped = matcher.push(chunk)
        out += piece
        fed += len(chunk)
        if stopped:
            break
        held = fed - len(out)
        assert held == len(matcher.held) <= max_hold
    if not stopped:
        out += matcher.flush()
    assert (out, stopped) == first_stop_oracle(text, stops)
    assert matcher.stopped == stopped


@given(st.text(max_size=40), st.data())
def test_stop_matcher_passthrough_has_no_holdback(text: str, data: st.DataObject) -> None:
    matcher = StopMatcher([])
    for chunk in split_at(text, data):
        assert matcher.push(chunk) == (chunk, False)
    assert matcher.flush() == ""


@given(st.text(alphabet=ALPHABET, max_size=40), stops_strategy, st.data())
def test_detokenizer_feeding_matcher(text: str, stops: list[str], data: st.DataObject) -> None:
    detok, matcher = Utf8Detokenizer(), StopMatcher(stops)
    out, stopped = "", False
    for chunk in split_at(text.encode(), data):
        piece, stopped = matcher.push(detok.push(chunk))
        out += piece
        if stopped:
            break
    if not stopped:
        piece, stopped = matcher.push(detok.flush())
        out += piece
        if not stopped:
            out += matcher.flush()
    assert (out, stopped) == first_stop_oracle(text, stops)


def test_long_stop_costs_linear_memory_and_time() -> None:
    """The longest allowed stop is matched without building its prefixes: a text that keeps
    almost matching it is scanned in one pass (the old prefix set held ~8 M characters)."""
    import time
    import tracemalloc

    from hydrad.wire.requests import MAX_STOP_CHARS

    stop = "a" * (MAX_STOP_CHARS - 1) + "b"
    tracemalloc.start()
    t0 = time.monotonic()
    matcher = StopMatcher([stop])
    out = ""
    for _ in range(MAX_STOP_CHARS // 64):
        piece, stopped = matcher.push("a" * 64)
        out += piece
        assert not stopped
    piece, stopped = matcher.push("b")
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert stopped and out + piece == "a"  # one "a" more than the stop's run, then the stop itself
    assert peak < 2_000_000
    assert time.monotonic() - t0 < 2


def test_stop_longer_than_the_bound_is_refused() -> None:
    from hydrad.wire.requests import MAX_STOP_CHARS

    with pytest.raises(ValueError, match="at most"):
        StopMatcher(["x" * (MAX_STOP_CHARS + 1)])
