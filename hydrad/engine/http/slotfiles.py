"""llama-server's slot persistence: ``POST /slots/{id}?action=save|restore|erase``.

``save`` writes the slot's KV state to a file of the slot directory (``slot_save_dir``,
llama-server's ``--slot-save-path``), ``restore`` puts such a file back into a slot, ``erase``
empties the slot. Answered in llama-server's shapes; served only when the directory is set (501
otherwise, as llama-server answers without ``--slot-save-path``).

A slot holds a user's conversation and a restore writes KV, so every action passes the gate of
``/slots/{id}/state`` (``control_allow_from`` and the engine's token), and a restore from a caller
that did not prove the token leaves the slot *foreign*, exactly as an upload does (docs/engine.md).
The file format and the name rules are :mod:`hydrad.engine.slotfile`'s. A refused restore (another
model, a damaged or truncated file, a busy slot) leaves the slot as it was.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any, BinaryIO

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from hydrad.common.logs import log_event
from hydrad.engine.core import StateError
from hydrad.engine.http.context import HttpContext, ctx_of
from hydrad.engine.http.slotstate import slot_id
from hydrad.engine.slotfile import BadName, NotUsable, capacity_bytes, checked_name, open_slot_file, write_atomic
from hydrad.wire import protocol as P
from hydrad.wire.errors import state_http_status
from hydrad.wire.kvstream import StateReceiver, StreamAssembler, chunked
from hydrad.wire.openai import ApiError

log = logging.getLogger("hydrad.http")

ACTIONS = ("save", "restore", "erase")
_READ_CHUNK = 4 << 20


def _state_error(exc: StateError) -> ApiError:
    return ApiError(state_http_status(exc.kind), str(exc), exc.kind,
                    headers={"Retry-After": "1"} if exc.kind == "conflict" else None)


async def slot_action(request: Request) -> Response:
    ctx = ctx_of(request)
    trusted = ctx.guard_control(request)
    action = request.query_params.get("action")
    if action not in ACTIONS:
        raise ApiError(400, f"action must be one of {', '.join(ACTIONS)} (POST /slots/{{id}}?action=...)",
                       "invalid_field", "action")
    directory = ctx.settings.slot_save_dir
    if directory is None:
        raise ApiError(501, "slot files are off on this engine: set slot_save_dir in its config (llama-server's "
                       "--slot-save-path) and restart it", "not_supported")
    sid = slot_id(request)
    body = await _body(ctx, request, action)
    if action == "erase":
        return await _erase(ctx, sid)
    try:
        name = checked_name(body.get("filename"))
    except BadName as exc:
        raise ApiError(400, str(exc), "invalid_field", "filename") from None
    if action == "save":
        return await _save(ctx, sid, directory, name)
    return await _restore(ctx, sid, directory, name, trusted)


async def _body(ctx: HttpContext, request: Request, action: str) -> dict[str, Any]:
    raw = await ctx.body_of(request)
    if action == "erase" and not raw.strip():
        return {}
    body = ctx.parse_object(raw, f"slot {action} body")
    known = set() if action == "erase" else {"filename"}
    extra = sorted(set(body) - known)
    if extra:
        raise ApiError(400, f"unknown field(s) for {action}: {', '.join(extra)}", "unsupported_field", extra[0])
    return body


async def _erase(ctx: HttpContext, sid: int) -> Response:
    try:
        n = await ctx.core.state_erase(sid)
    except StateError as exc:
        raise _state_error(exc) from None
    log_event(log, logging.INFO, "slot erased", slot=sid, tokens=n)
    return JSONResponse({"id_slot": sid, "n_erased": n})


async def _save(ctx: HttpContext, sid: int, directory: Path, name: str) -> Response:
    t0 = time.monotonic()
    try:
        meta, data = await ctx.core.state_get(sid)
    except StateError as exc:
        raise _state_error(exc) from None
    limit = ctx.settings.slot_file_max_bytes
    if meta["bytes"] > limit:
        raise ApiError(413, f"slot {sid}'s state has {meta['bytes']} bytes; slot files may have at most {limit} "
                       "(slot_file_max_bytes)", "too_large")
    frames = chunked(meta, data, ctx.settings.rpc.chunk_size)
    try:
        written = await asyncio.to_thread(write_atomic, directory, name, frames)
    except OSError as exc:
        log_event(log, logging.ERROR, "slot file not written", slot=sid, file=name, error=str(exc))
        raise ApiError(500, f"slot file '{name}' could not be written: {exc.strerror or exc}", "save_failed") from None
    ms = round((time.monotonic() - t0) * 1000, 3)
    log_event(log, logging.INFO, "slot saved", slot=sid, file=name, tokens=meta["n_tokens"], bytes=written, ms=ms)
    return JSONResponse({"id_slot": sid, "filename": name, "n_saved": meta["n_tokens"], "n_written": written,
                         "timings": {"save_ms": ms}})


def _limit(ctx: HttpContext) -> int:
    """The largest file a slot of the serving generation can be restored from."""
    gen = ctx.core.gen
    if gen is None:
        raise ApiError(503, "no model is loaded; configure one with POST /control/configure", "no_model")
    info = gen.model.info
    return min(ctx.settings.slot_file_max_bytes, capacity_bytes(gen.ctx.n_ctx_seq, info.n_layer, info.n_embd))


async def _restore(ctx: HttpContext, sid: int, directory: Path, name: str, trusted: bool) -> Response:
    t0 = time.monotonic()
    limit = _limit(ctx)
    try:
        f, size = await asyncio.to_thread(open_slot_file, directory, name, limit)
    except FileNotFoundError:
        raise ApiError(404, f"no slot file '{name}' in the slot directory", "not_found", "filename") from None
    except NotUsable as exc:
        raise ApiError(413 if exc.too_large else 400, f"{exc}; the slot is unchanged",
                       "too_large" if exc.too_large else "bad_slot_file", "filename") from None
    except OSError as exc:
        raise ApiError(500, f"slot file '{name}' could not be opened: {exc.strerror or exc}",
                       "restore_failed") from None
    try:
        meta, data = await _read_state(ctx, sid, name, f, limit)
    finally:
        f.close()
    try:
        await ctx.core.state_put(sid, meta, data, trusted=trusted)
    except StateError as exc:
        raise _state_error(exc) from None
    except RuntimeError as exc:  # llama.cpp refused bytes whose digest matched: made by another build
        raise ApiError(422, f"slot file '{name}': {exc}", "restore_failed") from None
    ms = round((time.monotonic() - t0) * 1000, 3)
    log_event(log, logging.INFO, "slot restored", slot=sid, file=name, tokens=meta["n_tokens"], bytes=size,
              trusted=trusted, ms=ms)
    return JSONResponse({"id_slot": sid, "filename": name, "n_restored": meta["n_tokens"], "n_read": size,
                         "timings": {"restore_ms": ms}})


async def _read_state(ctx: HttpContext, sid: int, name: str, f: BinaryIO, limit: int) -> tuple[dict[str, Any], Any]:
    """The file's meta and KV bytes, checked as an upload is: the meta against this engine's model before
    any data is read, the data against the stream's digest."""
    core = ctx.core

    def open_receiver(meta: dict[str, Any]) -> StateReceiver:
        refused = core.check_put(sid, meta, limit)
        if refused is not None:
            raise ApiError(state_http_status(refused.kind), f"slot file '{name}' cannot be restored here: {refused}; "
                           "the slot is unchanged", refused.kind)
        return StateReceiver(meta["bytes"], core.state_buffers.take)

    decoder = P.FrameDecoder(P.RESPONSE_CODES)
    stream_in = StreamAssembler(open_receiver)
    try:
        while piece := await asyncio.to_thread(f.read, _READ_CHUNK):
            for frame in decoder.feed(piece):
                stream_in.add(frame)
        decoder.eof()
    except P.ProtocolError as exc:
        raise ApiError(400, f"slot file '{name}' is not a slot file or is damaged ({exc}); the slot is unchanged",
                       "bad_slot_file", "filename") from None
    if not stream_in.complete:
        raise ApiError(400, f"slot file '{name}' is truncated (it ends before STATE_END); the slot is unchanged",
                       "bad_slot_file", "filename")
    meta, rx, end = stream_in.meta, stream_in.rx, stream_in.end
    assert meta is not None and rx is not None and end is not None
    problem = rx.verify(end)
    if problem:
        raise ApiError(400, f"slot file '{name}' is damaged: {problem}; the slot is unchanged", "bad_slot_file",
                       "filename")
    return meta, rx.buffer
