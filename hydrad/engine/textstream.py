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

from hydrad.wire.requests import MAX_STOP_CHARS, MAX_STOPS

__all__ = ["StopMatcher", "Utf8Detokenizer"]

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

    Each stop string runs as a Knuth-Morris-Pratt automaton whose state is the
    length of the longest prefix of the stop that ends the text read so far:
    memory is linear in the stop's length and each character costs amortised
    constant time, whatever the stop looks like. (A set of every prefix, the
    obvious way to find the held-back tail, is quadratic: a 150k-character
    stop string would need gigabytes.)
    """

    def __init__(self, stops: Iterable[str]) -> None:
        """Match ``stops``; empty strings are ignored, more than four or a longer one than
        :data:`MAX_STOP_CHARS` rejected."""
        unique = list(dict.fromkeys(s for s in stops if s))
        if len(unique) > MAX_STOPS:
            raise ValueError(f"at most {MAX_STOPS} stop sequences are allowed, got {len(unique)}")
        for stop in unique:
            if len(stop) > MAX_STOP_CHARS:
                raise ValueError(f"a stop sequence may have at most {MAX_STOP_CHARS} characters, got {len(stop)}")
        self._stops = unique
        self._fail = [_failure(s) for s in unique]
        self._state = [0] * len(unique)
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
        base = len(self._held)
        states = self._state
        for i, ch in enumerate(text):
            done: tuple[int, str] | None = None  # (start in buf, stop) of a stop completed at this character
            for k, stop in enumerate(self._stops):
                q = states[k]
                fail = self._fail[k]
                while q and stop[q] != ch:
                    q = fail[q - 1]
                if stop[q] == ch:
                    q += 1
                if q == len(stop):
                    start = base + i + 1 - len(stop)
                    if done is None or start < done[0]:
                        done = (start, stop)
                    q = fail[q - 1]
                states[k] = q
            if done is not None:
                self._held = ""
                self._matched = done[1]
                return buf[: done[0]], True
        keep = min(max(states), len(buf))
        self._held = buf[len(buf) - keep :]
        return buf[: len(buf) - keep], False

    def flush(self) -> str:
        """End of generation: release the held text, which is no stop after all."""
        out, self._held = self._held, ""
        self._state = [0] * len(self._stops)
        return out


def _failure(stop: str) -> list[int]:
    """KMP failure function: ``f[i]`` is the length of the longest proper prefix of
    ``stop[:i + 1]`` that is also its suffix."""
    f = [0] * len(stop)
    q = 0
    for i in range(1, len(stop)):
        while q and stop[i] != stop[q]:
            q = f[q - 1]
        if stop[i] == stop[q]:
            q += 1
        f[i] = q
    return f
