"""A chat answer's think block on the engine thread: its reasoning split from its content
(:class:`hydrad.wire.reasoning.ReasoningStream`) and its reasoning budget kept.

A budget is kept by writing the end of the block for the model: once the answer has thought for
``budget`` tokens inside its block, the next tokens are not sampled but ``</think>``'s own, fed to
the model as if it had chosen them (the sampler's penalties learn them too), and the model goes on
from there into its answer. With a budget of 0 a block the template opened, or the answer opens, is
closed at once. Under a grammar (the request's or its tools') nothing is forced: the grammar decides
the whole answer, and a token it rejects would end the request; the doors refuse a positive budget
with a grammar, and a template's opened block is not assumed (the grammar's answer starts at its
first token).

Everything here is a few comparisons per token, on text the engine thread makes anyway.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from hydrad.engine import chatprompt
from hydrad.wire.reasoning import CLOSE, ReasoningStream, opens_thinking

TAIL_TOKENS = 8
"""Prompt tokens read back to see whether the template's generation prompt ends inside a think block."""


class Thinking:
    """One request's think block: :meth:`split` its text, :meth:`check` its budget after each piece."""

    def __init__(self, stream: ReasoningStream, budget: int | None, close: list[int]) -> None:
        self.stream = stream
        self.budget = budget  # tokens of thinking allowed; None: no limit
        self.close = close  # the tokens of </think>, written for the model when the budget is spent
        self.forced: deque[int] = deque()  # tokens to feed next instead of sampling
        self.since: int | None = None  # the tokens made when the block was seen open
        self.spent = False  # the block was closed for the model (once)

    def split(self, text: str, end: bool) -> tuple[str, str]:
        """(reasoning, content) of the next piece of text; ``end``: what is left at the end."""
        return self.stream.finish() if end else self.stream.feed(text)

    def check(self, made: int) -> None:
        """After ``made`` tokens were turned into text: close the block for the model once it has
        thought for its budget."""
        if self.budget is None or self.spent or not self.stream.thinking:
            return
        if self.since is None:
            self.since = made
        if made - self.since >= self.budget:
            self.forced.extend(self.close)
            self.spent = True


def start(model: Any, params: Any, request: Any, tokens: list[int], grammar: str | None) -> Thinking | None:
    """The think block of a chat request about to take a slot (None: nothing to split or keep): its
    reasoning format and budget (the request's, else the engine's), and whether the prompt's last
    tokens leave the answer inside a block the template opened."""
    if request.messages is None:
        return None
    fmt = request.reasoning_format or params.reasoning_format
    budget = None if grammar is not None else chatprompt.budget(request, params)
    if fmt == "none" and budget is None:
        return None
    opened = False
    if grammar is None:
        tail = b"".join(model.detokenize([t for t in tokens[-TAIL_TOKENS:] if t >= 0], pieces=True))  # type: ignore[arg-type]  # (no image tokens)
        opened = opens_thinking(tail.decode("utf-8", "replace"))
    close = model.tokenize(CLOSE, add_special=False, parse_special=True) if budget is not None else []
    think = Thinking(ReasoningStream(fmt, opened), budget, close)
    think.check(0)
    return think
