"""Slot KV state over HTTP: ``GET /slots/{slot}/state`` (a state stream), ``/state/meta`` and
``PUT /slots/{slot}/state`` (a restore, parsed as the body arrives). Same gate as /control/*."""

from __future__ import annotations

from typing import Any, AsyncIterator

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from hydrad.engine.core import StateError
from hydrad.engine.http.context import HttpContext, ctx_of
from hydrad.wire import protocol as P
from hydrad.wire.errors import state_http_status
from hydrad.wire.kvstream import StateReceiver, StreamAssembler, chunked
from hydrad.wire.openai import ApiError

_DISCARD_MIN = 64 << 20  # a refused state upload is drained at least this far before the answer


def slot_id(request: Request) -> int:
    try:
        return int(request.path_params["slot"])
    except ValueError:
        raise ApiError(400, "slot id must be an integer", "invalid_slot") from None


async def _read_state(request: Request) -> tuple[dict[str, Any], Any]:
    ctx = ctx_of(request)
    ctx.guard_control(request)
    try:
        return await ctx.core.state_get(slot_id(request))
    except StateError as exc:
        raise ApiError(state_http_status(exc.kind), str(exc), exc.kind) from None


async def state_get(request: Request) -> Response:
    meta, data = await _read_state(request)
    chunk = ctx_of(request).settings.rpc.chunk_size

    async def body() -> AsyncIterator[bytes]:
        for piece in chunked(meta, data, chunk):
            yield bytes(piece)

    return StreamingResponse(body(), media_type="application/x-hydra-kv",
                             headers={"X-Hydra-State-Bytes": str(meta["bytes"]), "X-Hydra-Tokens": str(meta["n_tokens"])})


async def state_meta(request: Request) -> Response:
    meta, _ = await _read_state(request)
    return JSONResponse(meta)


async def discard_body(stream: AsyncIterator[bytes], limit: int) -> None:
    """Read and drop what is left of a request body (at most ``limit`` bytes). An HTTP client sends
    the whole body before it reads the answer; closing with its bytes unread makes the kernel reset
    the connection, and the client would see ECONNRESET instead of the 4xx that explains why."""
    seen = 0
    try:
        async for piece in stream:
            seen += len(piece)
            if seen > limit:
                return  # past the bound: let the server close; a client that big gets a reset
    except Exception:  # the client went away meanwhile: nothing left to protect
        return


async def state_put(request: Request) -> Response:
    """Restore a slot from a state stream, parsed as it arrives (never buffered whole first).

    Every refusal that comes before the end of the body (forbidden, no token, a meta refused up
    front, a bad stream) first drains the rest of the body, bounded, so the client reads the answer."""
    ctx = ctx_of(request)
    stream = request.stream()
    try:
        return await _receive_state(ctx, request, stream)
    except ApiError:
        limit = max(_DISCARD_MIN, ctx.settings.rpc.max_state_bytes + (1 << 20))
        await discard_body(stream, limit)
        raise


async def _receive_state(ctx: HttpContext, request: Request, stream: AsyncIterator[bytes]) -> Response:
    core = ctx.core
    max_bytes = ctx.settings.rpc.max_state_bytes
    trusted = ctx.guard_control(request)
    sid = slot_id(request)
    decoder = P.FrameDecoder(P.RESPONSE_CODES)

    def open_receiver(meta: dict[str, Any]) -> StateReceiver:
        refused = core.check_put(sid, meta, max_bytes)
        if refused is not None:
            raise ApiError(state_http_status(refused.kind), str(refused), refused.kind)
        return StateReceiver(meta["bytes"], core.state_buffers.take)

    stream_in = StreamAssembler(open_receiver)
    try:
        async for piece in stream:
            for frame in decoder.feed(piece):
                stream_in.add(frame)
        decoder.eof()
    except P.ProtocolError as exc:
        raise ApiError(413 if exc.status == P.Status.TOO_LARGE else 400, f"bad state stream: {exc}; the slot is unchanged",
                       "bad_state_stream") from None
    if not stream_in.complete:
        raise ApiError(400, "incomplete state stream (needs STATE_META, data, STATE_END); the slot is unchanged",
                       "bad_state_stream")
    meta, rx, end = stream_in.meta, stream_in.rx, stream_in.end
    assert meta is not None and rx is not None and end is not None
    problem = rx.verify(end)
    if problem:
        raise ApiError(400, problem + "; the slot is unchanged", "state_mismatch")
    try:
        result = await core.state_put(sid, meta, rx.buffer, trusted=trusted)
    except StateError as exc:
        raise ApiError(state_http_status(exc.kind), str(exc), exc.kind) from None
    except RuntimeError as exc:
        raise ApiError(500, str(exc), "restore_failed") from None
    return JSONResponse(result)
