"""Operator-supplied jinja chat templates, rendered under a time and a memory limit.

jinja's sandbox keeps a template from touching anything but what it is given; it does not keep one
from running for ever (``{% for i in range(100000) %}{% for j in range(100000) %}``) or from
building a string of a gigabyte (``{{ 'x' * 1000000000 }}``). A thread cannot be stopped in the
middle of that, so templates are rendered in worker processes (:mod:`hydrad.engine.jinjaworker`),
started on first use and kept for the next render, at most ``WORKERS`` at once:

- **time**: a render that has not answered within ``render_timeout_s`` is stopped, its worker
  killed (another starts with the next render), and the request fails with that reason;
- **memory**: each worker limits its own address space (``render_memory_bytes``); past it the
  render fails with a ``MemoryError`` there, and the engine's memory is untouched;
- **output**: a render that writes more than ``max_output_chars`` characters is stopped as it
  writes them.

Each failure is a :class:`~hydrad.engine.jinja.TemplateFailed` (a ``ValueError``): the request that
asked for the render gets a 400 ``template_error`` saying which limit stopped it; the engine, and
every other request, go on.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import threading
import time
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from hydrad.engine.jinja import TemplateFailed

WORKERS = 2  # renders at once (the preparation threads that ask for them are few)


class TemplateLimits(BaseModel):
    """How far an operator's jinja chat template may go for one request."""

    model_config = ConfigDict(extra="forbid")
    render_timeout_s: float = Field(5.0, gt=0, le=600, description="Longest a jinja chat template may take to render "
                                    "one request's prompt; past it the render is stopped and the request fails "
                                    "with a 400 template_error.")
    render_memory_bytes: int = Field(512 << 20, ge=64 << 20, le=64 << 30, description="Address space of the "
                                     "process a jinja chat template is rendered in: a template that builds more "
                                     "fails its request, not the engine.")
    max_output_chars: int = Field(32 << 20, ge=4096, le=1 << 30, description="Most characters a jinja chat template "
                                  "may write for one request; past it the render is stopped.")


class _Worker:
    def __init__(self, memory: int) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "hydrad.engine.jinjaworker", str(memory)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, close_fds=True)

    def ask(self, request: bytes, deadline: float) -> dict[str, Any] | None:
        """Send one request and read its answer; None when the worker ended without one. TimeoutError
        past ``deadline`` (monotonic)."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        try:
            self.proc.stdin.write(len(request).to_bytes(4, "big") + request)
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            return None
        fd = self.proc.stdout.fileno()
        head = self._read(fd, 4, deadline)
        if head is None:
            return None
        body = self._read(fd, int.from_bytes(head, "big"), deadline)
        return json.loads(body) if body is not None else None

    @staticmethod
    def _read(fd: int, n: int, deadline: float) -> bytes | None:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        parts: list[bytes] = []
        while n:
            left = deadline - time.monotonic()
            if left <= 0 or not poller.poll(left * 1000):
                raise TimeoutError
            chunk = os.read(fd, min(n, 1 << 20))
            if not chunk:
                return None
            parts.append(chunk)
            n -= len(chunk)
        return b"".join(parts)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()


class JinjaBox:
    """Thread-safe: any preparation thread may render."""

    def __init__(self, limits: TemplateLimits | None = None) -> None:
        self.limits = limits or TemplateLimits()
        self._idle: list[_Worker] = []
        self._running = 0
        self._cv = threading.Condition()

    def render(self, template: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
               bos_token: str, eos_token: str, kwargs: dict[str, Any] | None = None,
               add_generation_prompt: bool = True) -> str:
        lim = self.limits
        request = json.dumps({"template": template, "messages": messages, "tools": tools, "bos": bos_token,
                              "eos": eos_token, "max_chars": lim.max_output_chars, "kwargs": kwargs,
                              "agp": add_generation_prompt},
                             ensure_ascii=False).encode("utf-8", "surrogatepass")
        worker = self._take()
        try:
            try:
                reply = worker.ask(request, time.monotonic() + lim.render_timeout_s)
            except TimeoutError:
                worker.kill()
                raise TemplateFailed(f"the chat template took longer than {lim.render_timeout_s:g} s to render "
                                     "(render_timeout_s); it was stopped") from None
            if reply is None or reply.get("error") == "memory":
                worker.kill()
                raise TemplateFailed(f"the chat template needed more than {lim.render_memory_bytes >> 20} MiB to "
                                     "render (render_memory_bytes); it was stopped")
            if "error" in reply:
                raise TemplateFailed(str(reply["error"]))
            return str(reply["text"])
        finally:
            self._give(worker)

    def _take(self) -> _Worker:
        with self._cv:
            while not self._idle and self._running >= WORKERS:
                self._cv.wait()
            self._running += 1
            if self._idle:
                return self._idle.pop()
        try:
            return _Worker(self.limits.render_memory_bytes)
        except BaseException:
            with self._cv:
                self._running -= 1
                self._cv.notify()
            raise

    def _give(self, worker: _Worker) -> None:
        with self._cv:
            self._running -= 1
            if worker.alive():
                self._idle.append(worker)
            self._cv.notify()

    def close(self) -> None:
        with self._cv:
            idle, self._idle = self._idle, []
        for w in idle:
            w.kill()


_box: JinjaBox | None = None
_box_lock = threading.Lock()


def configure(limits: TemplateLimits) -> None:
    """The limits every later render runs under (the daemon calls this once, from its settings)."""
    global _box
    with _box_lock:
        old, _box = _box, JinjaBox(limits)
    if old is not None:
        old.close()


def render(template: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
           bos_token: str, eos_token: str, kwargs: dict[str, Any] | None = None,
           add_generation_prompt: bool = True) -> str:
    """:meth:`JinjaBox.render` on the engine's box (made with the default limits if none was configured)."""
    global _box
    with _box_lock:
        if _box is None:
            _box = JinjaBox()
        box = _box
    return box.render(template, messages, tools, bos_token, eos_token, kwargs, add_generation_prompt)
