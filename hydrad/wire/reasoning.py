"""A model's thinking, split from its answer as it is generated: the text between ``<think>`` and
``</think>`` at the start of a chat answer is its reasoning, the rest its content (llama-server's
``--reasoning-format``).

The engine reads its own output with :class:`ReasoningStream` on its thread, where
:class:`hydrad.wire.toolcalls.ToolStream` reads tool calls (reasoning first: the content it leaves
is what the tool reader sees), so both doors and the bus carry reasoning and content apart and every
renderer only puts them in its dialect's shapes. Per piece of text the work is a few string
searches over what arrived, bounded by the marker's length held back.

- ``deepseek``: the reasoning goes apart (``reasoning_content``, Anthropic's ``thinking`` blocks);
  the content is the rest, without the tags.
- ``deepseek-legacy``: the reasoning goes apart too, and the content keeps the whole text, tags
  included (an opener the template wrote is put in front, as llama-server does).
- ``none``: no splitting; a reader is made only to follow the block for a reasoning budget, and
  gives the text back as it came.

A think block is recognised only at the start of the answer (after blank space), or from the very
start when the template opened it itself (its generation prompt ends with ``<think>``: the answer
begins inside the block). A block the answer never closes is reasoning to the end, as llama-server
reads it. The reasoning's blank edges, and the blank space after ``</think>``, are not kept.
"""

from __future__ import annotations

from typing import Literal, get_args

OPEN = "<think>"
CLOSE = "</think>"

Format = Literal["none", "deepseek", "deepseek-legacy"]
FORMATS: tuple[str, ...] = get_args(Format)


def opens_thinking(prompt_tail: str) -> bool:
    """Whether a prompt ending so leaves the answer inside a think block its template opened."""
    return prompt_tail.rstrip().endswith(OPEN)


class ReasoningStream:
    """Reads an answer as it is generated: :meth:`feed` each piece of text, :meth:`finish` at the end;
    each returns the reasoning and the content that are now certain. :attr:`thinking` says whether the
    text read so far leaves the answer inside its think block (what a reasoning budget counts)."""

    def __init__(self, fmt: str, opened: bool = False) -> None:
        self.fmt = fmt
        self.legacy = fmt == "deepseek-legacy"
        self.state = "open" if opened else "start"  # start | open (in the template's block, nothing read) | think | answer
        self.buf = ""  # text held back: what may yet be a marker, or blank space not yet placed
        self.begun = False  # some reasoning went out (its leading blank space is dropped)
        self.blank = ""  # blank reasoning held back: dropped if the block ends here
        self.skip_blank = False  # the blank space after </think> is not content
        self.raw = ""  # deepseek-legacy: text not yet sent as content (held while the opener is unknown)
        self.prefix = OPEN if opened else ""  # deepseek-legacy: the opener the template wrote, unless the answer repeats it

    @property
    def thinking(self) -> bool:
        return self.state in ("open", "think")

    def feed(self, text: str) -> tuple[str, str]:
        self.buf += text
        if self.legacy:
            self.raw += text
        reasoning: list[str] = []
        content: list[str] = []
        while self.buf:
            if self.state in ("start", "open"):
                head = self.buf.lstrip()
                if not head or (len(head) < len(OPEN) and OPEN.startswith(head)):
                    break  # blank so far, or what may yet be the opener: wait
                if head.startswith(OPEN):
                    self.buf, self.state, self.prefix = head[len(OPEN):], "think", ""
                elif self.state == "open":
                    self.buf, self.state = head, "think"
                else:
                    content.append(self.buf)
                    self.buf, self.state = "", "answer"
            elif self.state == "think":
                end = self.buf.find(CLOSE)
                if end >= 0:
                    reasoning.append(self._reasoning(self.buf[:end], last=True))
                    self.buf = self.buf[end + len(CLOSE):]
                    self.state, self.skip_blank = "answer", True
                    continue
                keep = partial_suffix(self.buf, CLOSE)
                reasoning.append(self._reasoning(self.buf[:len(self.buf) - keep]))
                self.buf = self.buf[len(self.buf) - keep:]
                break
            else:
                rest, self.buf = self.buf, ""
                if self.skip_blank:
                    rest = rest.lstrip()
                    self.skip_blank = not rest
                content.append(rest)
        if self.fmt == "none":
            return "", text
        return "".join(reasoning), self._legacy() if self.legacy else "".join(content)

    def finish(self) -> tuple[str, str]:
        """What is left at the end: held text is reasoning inside an unclosed block, else content."""
        rest, self.buf = self.buf, ""
        reasoning = content = ""
        if self.state == "start":
            content = rest
        elif self.state in ("open", "think"):
            reasoning = self._reasoning(rest, last=True)
        self.state = "answer"
        if self.fmt == "none":
            return "", ""
        return reasoning, self._legacy() if self.legacy else content

    def _reasoning(self, text: str, last: bool = False) -> str:
        """Reasoning to send now: its leading blank space and, at the block's end, its trailing blank
        space are dropped; blank space that may be trailing waits for what follows it."""
        if not self.begun:
            text = text.lstrip()
            if not text:
                return ""
            self.begun = True
        text, self.blank = self.blank + text, ""
        if last:
            return text.rstrip()
        body = text.rstrip()
        self.blank = text[len(body):]
        return body

    def _legacy(self) -> str:
        """deepseek-legacy's content: the text as generated, behind the opener the template wrote
        (held while the answer may still write the opener itself)."""
        if self.state == "open":
            return ""
        out, self.raw, self.prefix = self.prefix + self.raw, "", ""
        return out


def partial_suffix(text: str, marker: str) -> int:
    """Length of the longest end of ``text`` that begins ``marker`` (text that may yet become it)."""
    for n in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0
