"""Log-probabilities of generated tokens: what the engine measures per token, and the three answer
shapes clients read them in.

The engine thread fills :class:`TokenLogprob` tuples (plain data, cheap to make per token); the
engine's HTTP plane, the bus and the coordinator's front door render the same tuples, so both doors
answer in the same shapes:

- OpenAI chat (``choices[].logprobs.content``) and llama-server's native ``completion_probabilities``:
  one object per token, ``{id, token, bytes, logprob, top_logprobs: [{id, token, bytes, logprob}]}``
  (``id`` is llama-server's addition to OpenAI's shape);
- OpenAI's legacy completions: ``{tokens, token_logprobs, top_logprobs, text_offset}``, where each
  ``top_logprobs`` entry maps a token's text to its log-probability and holds the chosen token too
  ("up to logprobs + 1 elements", as OpenAI documents).

A token's ``token`` text is its bytes up to an incomplete UTF-8 sequence at their end (as llama-server
cuts it), other invalid bytes replaced: a character split over two tokens is in ``bytes``, whole.

With llama-server's ``post_sampling_probs`` the numbers are probabilities after the sampler chain
(top-k, top-p, min-p, temperature) rather than log-probabilities over the vocabulary, and the entry
shapes say so: ``prob`` and ``top_probs`` instead of ``logprob`` and ``top_logprobs`` (``post``
below). The tuples carry either in ``logprob``; the request says which.
"""

from __future__ import annotations

import codecs
from typing import Any, Iterable, NamedTuple

MAX_TOP_LOGPROBS = 20
"""Most alternatives per token on OpenAI's doors (OpenAI's own bound on ``top_logprobs``), and so the
most a bus message carries."""

MAX_LEGACY_LOGPROBS = 5
"""OpenAI's bound on the legacy completions' integer ``logprobs``."""

MAX_N_PROBS = 100
"""Most alternatives per token on llama-server's ``/completion`` (llama-server has no bound; every one is
a JSON object per generated token)."""

FLOOR = -9999.0
"""What a log-probability of zero probability (a logit of -inf) is reported as: JSON has no infinity."""


class Alternative(NamedTuple):
    """One of the most likely tokens at a position (``logprob``: its probability after the sampler
    chain, for a request that asked for post-sampling probabilities)."""

    id: int
    piece: bytes
    logprob: float


class TokenLogprob(NamedTuple):
    """A generated token, its log-probability over the full vocabulary, and the most likely tokens at
    its position, most likely first."""

    id: int
    piece: bytes
    logprob: float
    top: tuple[Alternative, ...]


def token_text(piece: bytes) -> str:
    """A token's bytes as text: an incomplete UTF-8 sequence at the end is cut, other invalid bytes
    replaced (llama-server's ``validate_utf8`` cut, then its JSON writer's replacement)."""
    try:
        return piece.decode("utf-8")
    except UnicodeDecodeError:
        pass
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    return decoder.decode(piece, final=False)


def _alternative(alt: Alternative | TokenLogprob, post: bool = False) -> dict[str, Any]:
    return {"id": alt.id, "token": token_text(alt.piece), "bytes": list(alt.piece),
            "prob" if post else "logprob": alt.logprob}


def entry(tok: TokenLogprob, post: bool = False) -> dict[str, Any]:
    """One token as OpenAI's chat ``logprobs.content`` item and llama-server's
    ``completion_probabilities`` item (``post``: post-sampling probabilities, llama-server's
    ``prob``/``top_probs`` shape)."""
    return {**_alternative(tok, post),
            "top_probs" if post else "top_logprobs": [_alternative(a, post) for a in tok.top]}


def content(tokens: Iterable[TokenLogprob], post: bool = False) -> list[dict[str, Any]]:
    return [entry(t, post) for t in tokens]


def chat(tokens: Iterable[TokenLogprob], post: bool = False) -> dict[str, Any]:
    """``choices[].logprobs`` of a chat completion or chunk."""
    return {"content": content(tokens, post)}


class TextOffsets:
    """``text_offset`` of the legacy shape: where each token's text starts in the completion, in
    characters. A character split over tokens starts in the token that completes it; kept across the
    chunks of a stream."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._chars = 0

    def next(self, piece: bytes) -> int:
        at = self._chars
        self._chars += len(self._decoder.decode(piece))
        return at


def legacy(tokens: Iterable[TokenLogprob], offsets: TextOffsets) -> dict[str, Any]:
    """``choices[].logprobs`` of a legacy completion or chunk (OpenAI's ``/v1/completions`` shape)."""
    out: dict[str, list[Any]] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for tok in tokens:
        text = token_text(tok.piece)
        out["tokens"].append(text)
        out["token_logprobs"].append(tok.logprob)
        top: dict[str, float] = {}
        for alt in tok.top:
            top.setdefault(token_text(alt.piece), alt.logprob)
        top.setdefault(text, tok.logprob)
        out["top_logprobs"].append(top)
        out["text_offset"].append(offsets.next(tok.piece))
    return out


def render(kind: str, tokens: Iterable[TokenLogprob], offsets: TextOffsets | None = None,
           post: bool = False) -> dict[str, Any]:
    """``choices[].logprobs`` for an OpenAI answer of ``kind`` ("chat" or "completion"); ``post``
    (chat only: the legacy shape has no place for it) renders post-sampling probabilities."""
    if kind == "chat":
        return chat(tokens, post)
    return legacy(tokens, offsets if offsets is not None else TextOffsets())
