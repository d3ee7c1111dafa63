"""Where a long prompt may be cut (the real tokenizer's tokens are compared in
tests/integration/test_long_prompts.py)."""

from __future__ import annotations

from hydrad.engine.tokenchunks import ATTR_LSTRIP, MIN_CUT_CHARS, PIECE_CHARS, Marker, tokenize

SPECIALS = {"<|im_start|>": 8, "<|im_end|>": 8, "<|endoftext|>": 8}
PROBE = "<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n"


def test_the_longest_special_of_a_message_is_the_marker() -> None:
    m = Marker.choose(PROBE, SPECIALS, add_eos=False)
    assert m is not None and m.text == "<|im_start|>" and m.conflicts == ()


def test_no_marker_where_a_cut_could_change_the_tokens() -> None:
    assert Marker.choose(PROBE, SPECIALS, add_eos=True) is None
    assert Marker.choose(PROBE, {**SPECIALS, "<|im_start|>": 8 | ATTR_LSTRIP}, add_eos=False) is None
    assert Marker.choose("plain text", SPECIALS, add_eos=False) is None
    assert Marker.choose("abab", {"abab": 8}, add_eos=False) is None  # overlaps itself
    # specials matched before the marker (as long or longer) that contain or overlap it conflict;
    # shorter ones are matched after it is cut out, and cannot
    m = Marker.choose(PROBE, {**SPECIALS, "<|im_start|>system": 8, "xxxxxxxxxx<|im_": 16, "xx<|im_": 16,
                              "unrelated-special-token": 8}, add_eos=False)
    assert m is not None and set(m.conflicts) == {"<|im_start|>system", "xxxxxxxxxx<|im_"}


def test_cuts_fall_before_the_marker_and_rebuild_the_text() -> None:
    m = Marker("<|im_start|>", ())
    text = "<|im_start|>user\nhello<|im_end|>\n" * 2000
    pieces = m.cuts(text)
    assert pieces is not None and "".join(pieces) == text and len(pieces) > 2
    assert all(p.startswith("<|im_start|>") for p in pieces[1:])
    assert all(len(p) >= PIECE_CHARS for p in pieces[:-1])
    assert m.cuts(text[:MIN_CUT_CHARS - 1]) is None
    assert Marker("<|im_start|>", ("<|im_start|>system",)).cuts(text + "<|im_start|>system") is None


def test_only_the_first_piece_adds_special_tokens() -> None:
    calls: list[tuple[str, bool]] = []

    def one_call(piece: str, add: bool) -> list[int]:
        calls.append((piece, add))
        return [len(piece)]

    text = "<|im_start|>a\n" * 5000
    out = tokenize(text, Marker("<|im_start|>", ()), True, one_call)
    assert [a for _, a in calls] == [True] + [False] * (len(calls) - 1) and sum(out) == len(text)
