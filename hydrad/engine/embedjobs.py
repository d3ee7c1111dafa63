"""Embedding requests on the engine thread: queued by an ``Embed`` command, computed one decode at
a time between generation steps.

Each pass of the engine loop computes at most one embedding decode (up to the embedding context's
``n_tokens`` tokens and ``MAX_SEQS`` inputs, packed from the oldest requests first), then steps the
generating slots: a large batch of inputs delays each generated token by one embedding decode at
most, and is never starved by generation either. Only the engine thread touches the embedding
context (``engine/embedder.py``), like every other llama.cpp object of a generation.

:class:`EmbedRunner` is the engine core's component for them; ``embed()`` runs on the event
loop, the rest on the engine thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from hydrad.engine.commands import Embed
from hydrad.engine.embedder import MAX_SEQS



class EmbedRefused(Exception):
    """An embedding request the engine cannot serve now; ``status`` and ``code`` are the HTTP answer's."""

    def __init__(self, message: str, status: int, code: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


@dataclass
class _Job:
    cmd: Embed
    done: int = 0  # inputs handed to a decode so far
    results: list[Any] = field(default_factory=list)


def _settle(fut: cf.Future[Any], result: Any = None, exc: BaseException | None = None) -> None:
    """Answer a job's future unless its caller gave up on it (the client went away)."""
    try:
        if exc is not None:
            fut.set_exception(exc)
        else:
            fut.set_result(result)
    except cf.InvalidStateError:  # cancelled meanwhile
        pass


class EmbedRunner:
    """Owns the embedding requests waiting or being computed (engine thread, but :meth:`embed`)."""

    def __init__(self, core: Any) -> None:  # the EngineCore this is part of (it imports us)
        self.core = core
        self.jobs: deque[_Job] = deque()

    async def embed(self, gen_id: int, inputs: list[list[int]]) -> list[Any]:
        """The embeddings of ``inputs`` (token lists) by generation ``gen_id``; EmbedRefused when the
        engine cannot take them or that generation is no longer serving."""
        cmd = Embed(gen_id, inputs)
        self.core.put(cmd)
        return await asyncio.wrap_future(cmd.fut)

    def queue(self, cmd: Embed) -> None:
        if not self.core.admitting:
            _settle(cmd.fut, exc=EmbedRefused("engine is shutting down", 503, "shutting_down"))
        elif len(self.jobs) >= self.core.max_queue:
            _settle(cmd.fut, exc=EmbedRefused("too many embedding requests are waiting", 503, "queue_full"))
        else:
            self.jobs.append(_Job(cmd))

    def fail(self, message: str, status: int = 503, code: str = "shutting_down") -> None:
        while self.jobs:
            _settle(self.jobs.popleft().cmd.fut, exc=EmbedRefused(message, status, code))

    def step(self) -> None:
        """One embedding decode for the oldest waiting inputs (engine thread)."""
        jobs = self.jobs
        while jobs and jobs[0].cmd.fut.cancelled():
            jobs.popleft()
        if not jobs:
            return
        gen = self.core.gen
        embedder = gen.embedder if gen is not None else None
        if gen is None or embedder is None or jobs[0].cmd.gen_id != gen.id:
            _settle(jobs.popleft().cmd.fut, exc=EmbedRefused("the model was replaced before the embeddings were "
                                                             "computed; retry", 503, "reloading"))
            return
        packed: list[tuple[_Job, list[int]]] = []
        used = 0
        for job in jobs:
            if job.cmd.gen_id != gen.id or job.cmd.fut.cancelled():
                break
            for tokens in job.cmd.inputs[job.done:]:
                if len(packed) == MAX_SEQS or used + len(tokens) > embedder.n_tokens:
                    break
                packed.append((job, tokens))
                used += len(tokens)
            else:
                continue
            break
        if not packed:  # a T2 rebuild made the embedding context smaller than this input after it was checked
            job = jobs.popleft()
            _settle(job.cmd.fut, exc=EmbedRefused(f"an input has more tokens than this engine now embeds at once "
                                                  f"({embedder.n_tokens}); retry", 400, "input_too_long"))
            return
        try:
            vectors = embedder.run([tokens for _, tokens in packed])
        except Exception as exc:
            for job in {id(j): j for j, _ in packed}.values():
                jobs.remove(job)
                _settle(job.cmd.fut, exc=EmbedRefused(f"the embedding decode failed: {exc}", 500, "embedding_failed"))
            return
        stats = self.core.stats  # an embedding's prompt costs a decode, as llama-server counts it
        stats.prompt_tokens_total += used
        stats.n_decode_total += 1
        for (job, _), vector in zip(packed, vectors):
            job.results.append(vector)
            job.done += 1
        while jobs and jobs[0].done == len(jobs[0].cmd.inputs):
            job = jobs.popleft()
            _settle(job.cmd.fut, job.results)
