"""Long prompts tokenized in pieces, so that llama.cpp's pass over special tokens stays linear.

llama.cpp first cuts a text at every special token it contains (``<|im_start|>``,
``<start_of_turn>``) and then tokenizes the pieces between them; the cutting costs time in the
square of the number of special tokens in one call. A chat of 10,000 empty messages (280 KB of
template text, 50,000 tokens) took 4.5 s to tokenize in one call on the 2-core machine, 40,000
messages 77 s, while the same text cut before each ``<|im_start|>`` and tokenized piece by piece
took 0.57 s for 10,000: the same tokens, since llama.cpp would have cut there itself.

Cutting is only done where it provably gives llama.cpp's own tokens:

- the cut goes before an occurrence of the **marker**, the longest special token in the text the
  model's chat template makes for one message, so each piece after the first begins with a
  special token, and llama.cpp treats the text after a special token the same at the start of a
  call as in the middle of one (no space prefix, no BOS);
- no special token llama.cpp would match before the marker (one as long or longer) overlaps the
  marker in the text: each such one that contains or overlaps the marker text is looked for,
  and if it is in the text nothing is cut;
- the marker does not strip the whitespace before it (``lstrip``: the piece before would keep
  what the whole call strips), does not overlap itself, and the model does not append an
  end-of-sequence token to each call (``add_eos``). Otherwise the text is tokenized whole.

Pieces are at least :data:`PIECE_CHARS` long (several markers each), so short prompts and the
common case never pay the per-call cost.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

MIN_CUT_CHARS = 16 << 10
"""Texts shorter than this are tokenized in one call (their special tokens are few)."""

PIECE_CHARS = 4 << 10
"""Cuts are this far apart at least: long enough that llama.cpp's per-call cost is small."""

ATTR_LSTRIP = 1 << 7  # llama_token_attr: LLAMA_TOKEN_ATTR_LSTRIP


@dataclass(frozen=True)
class Marker:
    """Where a model's prompts may be cut (the module says why these conditions)."""

    text: str
    conflicts: tuple[str, ...]  # special tokens matched before the marker that could overlap it

    @classmethod
    def choose(cls, probe: str, specials: dict[str, int], add_eos: bool) -> "Marker | None":
        """The marker for prompts shaped like ``probe`` (one message as the template renders it),
        given every special token's text and attributes; None when no cut is safe."""
        if add_eos:
            return None
        present = sorted((t for t in specials if t and t in probe), key=len, reverse=True)
        if not present:
            return None
        text = present[0]
        if specials[text] & ATTR_LSTRIP or _borders(text):
            return None
        conflicts = tuple(t for t in specials if t != text and len(t) >= len(text) and _overlap(text, t))
        return cls(text, conflicts)

    def cuts(self, text: str) -> list[str] | None:
        """``text`` in pieces, each after the first starting with the marker; None when it cannot
        be cut (a conflicting special token in it) or is not worth cutting."""
        if len(text) < MIN_CUT_CHARS or any(c in text for c in self.conflicts):
            return None
        pieces: list[str] = []
        start, pos = 0, text.find(self.text, PIECE_CHARS)
        while pos > 0:
            pieces.append(text[start:pos])
            start = pos
            pos = text.find(self.text, pos + PIECE_CHARS)
        pieces.append(text[start:])
        return pieces if len(pieces) > 1 else None


def _borders(s: str) -> bool:
    """Whether a proper prefix of ``s`` is also its suffix (so two occurrences could overlap)."""
    return any(s[:k] == s[-k:] for k in range(1, len(s)))


def _overlap(a: str, b: str) -> bool:
    """Whether an occurrence of ``b`` could share characters with one of ``a`` without being it."""
    if a in b:
        return True
    return any(a.endswith(b[:k]) or b.endswith(a[:k]) for k in range(1, min(len(a), len(b))))


def tokenize(text: str, marker: Marker | None, add_special: bool,
             one_call: Callable[[str, bool], list[int]]) -> list[int]:
    """``text``'s tokens with special parsing, in pieces where ``marker`` allows; ``one_call(piece,
    add_special)`` is llama.cpp's tokenizer for one piece."""
    pieces = marker.cuts(text) if marker is not None else None
    if pieces is None:
        return one_call(text, add_special)
    tokens = one_call(pieces[0], add_special)
    for piece in pieces[1:]:
        tokens += one_call(piece, False)
    return tokens
