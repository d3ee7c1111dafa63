"""Turn a stream of token pieces into text that is safe to send to clients.

Two problems sit between llama.cpp's token loop and a streaming response:

* A token's piece is raw bytes and may end in the middle of a multi-byte
  UTF-8 character; decoding each piece on its own would emit garbage.
* A stop string may arrive split over several tokens; text that might be
  the start of one must be held back until we know, because once streamed
  it cannot be taken back.

Both are pure bookkeeping, kept apart from the engine so they can be tested
exhaustively without a model.
"""

from __future__ import annotations

import codecs
from collections.abc import Iterable

__all__ = ["MAX_STOPS", "StopMatcher", "Utf8Detokenizer"]

MAX_STOPS = 4
"""The OpenAI API accepts at most four stop sequences per request."""


class Utf8Detokenizer:
    """Decode token piece bytes incrementally, holding back split characters.

    Invalid byte sequences become U+FFFD instead of raising: a model can emit
    byte-fallback tokens that never form valid UTF-8, and that must not abort
    a generation.
    """

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, piece: bytes) -> str:
        """Feed one token's bytes; return all text that is complete so far."""
        return self._decoder.decode(piece, final=False)

    def flush(self) -> str:
        """End of generation: return the held-back tail (U+FFFD if incomplete)."""
        return self._decoder.decode(b"", final=True)

    def reset(self) -> None:
        """Forget any held-back bytes, to reuse the decoder for a new stream."""
        self._decoder.reset()


class StopMatcher:
    """Cut streamed text at the first stop string, without emitting it.

    "First" means the stop occurrence that is completed first while reading
    the text, ties going to the one that starts earlier. That is the only
    rule under which the result does not depend on how text is split into
    pushes, which is what makes streaming and non-streaming responses agree.
    """

    def __init__(self, stops: Iterable[str]) -> None:
        """Match ``stops``; empty strings are ignored, more than four rejected."""
        unique = list(dict.fromkeys(s for s in stops if s))
        if len(unique) > MAX_STOPS:
            raise ValueError(f"at most {MAX_STOPS} stop sequences are allowed, got {len(unique)}")
        self._stops = unique
        self._prefixes = frozenset(s[:n] for s in unique for n in range(1, len(s)))
        self._max_hold = max((len(s) - 1 for s in unique), default=0)
        self._held = ""
        self._matched: str | None = None

    @property
    def stopped(self) -> bool:
        """Whether a stop string has been seen; later pushes emit nothing."""
        return self._matched is not None

    @property
    def matched(self) -> str | None:
        """The stop string that ended the text, if any."""
        return self._matched

    @property
    def held(self) -> str:
        """Text withheld because it may be the start of a stop string."""
        return self._held

    def push(self, text: str) -> tuple[str, bool]:
        """Feed new text; return (text safe to emit now, stopped)."""
        if self._matched is not None:
            return "", True
        if not self._stops:
            return text, False
        buf = self._held + text
        hit = self._first_completed(buf)
        if hit is not None:
            start, stop = hit
            self._held = ""
            self._matched = stop
            return buf[:start], True
        keep = self._holdback(buf)
        self._held = buf[len(buf) - keep :]
        return buf[: len(buf) - keep], False

    def flush(self) -> str:
        """End of generation: release the held text, which is no stop after all."""
        out, self._held = self._held, ""
        return out

    def _first_completed(self, buf: str) -> tuple[int, str] | None:
        best: tuple[int, int, str] | None = None
        for stop in self._stops:
            start = buf.find(stop)
            if start < 0:
                continue
            # Order by end, then start: the stop that finishes first wins.
            candidate = (start + len(stop), start, stop)
            if best is None or candidate < best:
                best = candidate
        return None if best is None else (best[1], best[2])

    def _holdback(self, buf: str) -> int:
        """Length of the longest suffix of ``buf`` that starts some stop string."""
        for n in range(min(len(buf), self._max_hold), 0, -1):
            if buf[-n:] in self._prefixes:
                return n
        return 0
