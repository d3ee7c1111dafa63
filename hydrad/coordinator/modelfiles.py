"""The registry's model files, served to the pool's engines: ``GET /models/files/{name}``.

An engine asked to load a model its disk lacks fetches the file from here (``hydrad.engine.fetch``),
resuming with ``Range: bytes=N-`` from the bytes its partial file already holds. What this door
guarantees, and why:

- **Who**: a request must carry ``Authorization: Bearer <token>`` with the pool's bus token (every
  engine holds it: it is what admits an engine to the bus, which already hands it users' prompts) or
  the admin token. A coordinator without a bus token serves no file at all (403): on a shared host
  another local user could otherwise copy the weights. The path is one of the control surfaces of
  ``hydrad.common.cors``, so no browser page gets a CORS answer for it, and a page cannot add the
  ``Authorization`` header to a request it sends without one. The front door's API keys do not
  apply (``hydrad.common.apikey.OWN_CREDENTIALS``): an engine presents the pool's token, not a
  tenant's key.
- **What**: only a registry entry's own file, named by the entry's key or one of its aliases, found
  under the coordinator's ``models_dir`` (an entry whose path is absolute, or leads out of that
  directory through ``..`` or a link, is never served). The name in the URL is looked up in the
  registry, never joined to a path.
- **How**: ``Range`` with one byte range (``a-``, ``a-b``, ``-n``) is answered 206 with
  ``Content-Range``; a start past the end is 416; any other ``Range`` is ignored (the whole file,
  200), as RFC 9110 allows. ``HEAD`` answers the headers alone. The file is read in 1 MiB pieces on
  a worker thread, never on the event loop, and ``model_files_rate_mib_s`` caps each transfer's rate
  so that a fetch does not take the link the pool's requests share.
"""

from __future__ import annotations

import asyncio
import os
import re
import time
from pathlib import Path
from typing import Any, AsyncIterator, BinaryIO

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from hydrad.common import tokenfile
from hydrad.common.registry import ModelEntry, Registry
from hydrad.wire.openai import ApiError

FILES_PREFIX = "/models/files/"
CHUNK = 1 << 20
AVAILABLE_TTL_S = 5.0
_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")


def byte_range(header: str | None, size: int) -> tuple[int, int] | None:
    """The ``(first, last)`` bytes (inclusive) one ``Range`` header asks for, or None to send the whole
    file (no header, or one this door does not take). ``ApiError`` 416 for a range that starts past
    the end of the file."""
    if header is None:
        return None
    m = _RANGE.match(header.strip())
    if m is None or (not m.group(1) and not m.group(2)):
        return None
    if not m.group(1):  # a suffix: the last n bytes
        n = int(m.group(2))
        if n == 0:
            raise _unsatisfiable(size)
        return max(0, size - n), size - 1
    first = int(m.group(1))
    if first >= size:
        raise _unsatisfiable(size)
    last = int(m.group(2)) if m.group(2) else size - 1
    if last < first:
        return None
    return first, min(last, size - 1)


def _unsatisfiable(size: int) -> ApiError:
    return ApiError(416, f"the range starts past the end of the file ({size} bytes)", "range_not_satisfiable",
                    headers={"Content-Range": f"bytes */{size}"})


class ModelFiles:
    """The door's state: where the files are, who may read them, and how fast."""

    def __init__(self, registry: Registry, models_dir: Path | None, tokens: list[str], rate_mib_s: float) -> None:
        self.registry = registry
        self.models_dir = models_dir.resolve() if models_dir is not None else None
        self.tokens = tokens
        self.rate = rate_mib_s * (1 << 20) if rate_mib_s > 0 else 0.0
        self.served_bytes = 0  # every body byte sent, for /metrics and the tests' resume check
        self._available: tuple[float, frozenset[str]] = (-AVAILABLE_TTL_S, frozenset())

    def available(self) -> frozenset[str]:
        """The registry names this door would serve now (a file under ``models_dir``, and a token to
        check requests against): routing's on-demand loads may send an engine that lacks one of these
        to fetch it. Looked up again at most every :data:`AVAILABLE_TTL_S` (a stat per entry)."""
        at, names = self._available
        now = time.monotonic()
        if now - at < AVAILABLE_TTL_S:
            return names
        found = set()
        if self.tokens and self.models_dir is not None:
            for key in self.registry.entries:
                try:
                    self.path_of(key)
                    found.add(key)
                except ApiError:
                    continue
        self._available = (now, frozenset(found))
        return self._available[1]

    def _authorize(self, request: Request) -> None:
        if not self.tokens:
            raise ApiError(403, "this coordinator serves model files only to holders of the pool's bus token, "
                                "and it has none (set bus_token_file)", "forbidden")
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        presented = given.strip() if scheme.lower() == "bearer" else None
        ok = False
        for token in self.tokens:  # every one compared, in constant time
            ok |= tokenfile.same(presented, token)
        if not ok:
            why = "a bearer token is required" if presented is None else "the bearer token is not valid"
            raise ApiError(401, f"/models/files: {why} (Authorization: Bearer <bus token>)", "unauthorized",
                           headers={"WWW-Authenticate": 'Bearer realm="hydra-models"'})

    def path_of(self, name: str) -> tuple[ModelEntry, Path]:
        """The file a registry name stands for, checked to lie under ``models_dir``; 404 otherwise."""
        if self.models_dir is None:
            raise ApiError(404, "this coordinator serves no model files (models_dir is not set)", "model_not_found")
        key = name if name in self.registry.entries else \
            next((k for k, e in self.registry.entries.items() if name in e.aliases), None)
        entry = self.registry.entries.get(key) if key is not None else None
        if entry is None or Path(entry.path).is_absolute():
            raise ApiError(404, f"no registry model '{name[:200]}' is served here", "model_not_found")
        path = (self.models_dir / entry.path).resolve()
        if not path.is_relative_to(self.models_dir) or not path.is_file():
            raise ApiError(404, f"model '{name[:200]}' has no file under this coordinator's models_dir",
                           "model_not_found")
        return entry, path

    async def serve(self, request: Request) -> Response:
        self._authorize(request)
        entry, path = self.path_of(request.path_params["name"])
        f: BinaryIO = await asyncio.to_thread(path.open, "rb")
        try:
            size = os.fstat(f.fileno()).st_size  # a stat of an open file: no disk read
            span = byte_range(request.headers.get("range"), size)
        except BaseException:
            f.close()
            raise
        first, last = span if span is not None else (0, size - 1)
        headers = {"Accept-Ranges": "bytes", "Content-Length": str(last - first + 1 if size else 0),
                   "Cache-Control": "no-store"}
        if entry.sha256:
            headers["X-Hydra-Sha256"] = entry.sha256
        if span is not None:
            headers["Content-Range"] = f"bytes {first}-{last}/{size}"
        status = 206 if span is not None else 200
        if request.method == "HEAD" or size == 0:
            f.close()
            return Response(b"", status_code=status, headers=headers, media_type="application/octet-stream")
        return StreamingResponse(self._body(f, first, last), status_code=status, headers=headers,
                                 media_type="application/octet-stream")

    async def _body(self, f: BinaryIO, first: int, last: int) -> AsyncIterator[bytes]:
        """The bytes ``first..last`` read on a worker thread, at most ``rate`` bytes a second."""
        try:
            await asyncio.to_thread(f.seek, first)
            left = last - first + 1
            t0, sent = time.monotonic(), 0
            while left > 0:
                piece = await asyncio.to_thread(f.read, min(CHUNK, left))
                if not piece:
                    return  # the file shrank under us: the client sees a short body and fails its check
                left -= len(piece)
                sent += len(piece)
                self.served_bytes += len(piece)
                yield piece
                if self.rate:
                    ahead = sent / self.rate - (time.monotonic() - t0)
                    if ahead > 0:
                        await asyncio.sleep(ahead)
        finally:
            await asyncio.to_thread(f.close)

    def public(self) -> dict[str, Any]:
        return {"models_dir": str(self.models_dir) if self.models_dir else None, "served_bytes": self.served_bytes,
                "rate_mib_s": self.rate / (1 << 20) if self.rate else None}


def model_file_routes(files: ModelFiles) -> list[Route]:
    return [Route(FILES_PREFIX + "{name}", files.serve, methods=["GET", "HEAD"])]
