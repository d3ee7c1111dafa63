"""The engine's HTTP plane: OpenAI API, health, metrics and /control/*.

Handlers only translate; configure semantics live in EngineControl and generation in the
engine core. Every failure a client can see is OpenAI error JSON, never a traceback.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, AsyncIterator

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from hydrad import __version__
from hydrad.common import jsonbody
from hydrad.engine.control import EngineBusy, EngineControl, ParamError, UnknownModel
from hydrad.engine.core import PromptTooLong, StateError
from hydrad.engine.requests import Done, Failed, RequestHandle, Token
from hydrad.engine.http import metrics
from hydrad.wire import openai
from hydrad.wire.openai import ApiError
from hydrad.common.logs import log_event
from hydrad.wire import protocol as P
from hydrad.wire.kvstream import StateReceiver, chunked
from hydrad.common.serving import BodyTooLarge, read_body, until_disconnected
from hydrad.engine.settings import EngineSettings
from hydrad.wire.errors import state_http_status
from hydrad.wire.stages import HEALTH_STATUS

log = logging.getLogger("hydrad.http")

_DISCARD_MIN = 64 << 20  # a refused state upload is drained at least this far before the answer


def _err(e: ApiError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status, headers=e.headers)


def build_app(settings: EngineSettings, control: EngineControl) -> Starlette:
    core = control.core

    def guard_control(request: Request) -> bool:
        """The one gate of /control/* and /slots/*/state*: the peer address must be inside
        ``control_allow_from`` and, when the engine has a token, the request must carry it as
        ``Authorization: Bearer <token>`` (the merged port asks the same of its HELLO). Returns whether
        the caller proved the token, which is what makes a restored state trusted."""
        host = request.client.host if request.client else None
        if not settings.allows_control(host):
            raise ApiError(403, f"{request.url.path} is not allowed from {host} (control_allow_from)", "forbidden")
        if settings.rpc.token is None:
            return False
        scheme, _, presented = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not settings.token_ok(presented.strip()):
            raise ApiError(401, f"{request.url.path} needs 'Authorization: Bearer <token>' with this engine's token",
                           "unauthorized", headers={"WWW-Authenticate": 'Bearer realm="hydra"'})
        return True

    async def health(_: Request) -> Response:
        snap = core.snapshot()
        stage = snap.stage
        body: dict[str, Any] = {"stage": stage, "engine": settings.name, "slots": snap.slots}
        if snap.device is not None:
            body["device"] = snap.device
        if snap.model is not None:
            body["model"] = snap.model.id
            body["generation"] = snap.model.generation
        if snap.loading_progress is not None:
            body["progress"] = round(snap.loading_progress, 4)
        if snap.load_id is not None:
            body["load_id"] = snap.load_id
        if snap.last_error:
            body["last_error"] = snap.last_error
        if not snap.alive:
            body["status"] = "error"
            return JSONResponse(body, status_code=503)
        if snap.model is not None and snap.admitting:
            body["status"] = "ok"
            return JSONResponse(body)
        body["status"] = HEALTH_STATUS.get(stage, stage)
        return JSONResponse(body, status_code=503, headers={"Retry-After": "1"} if stage != "idle" else {})

    async def livez(_: Request) -> Response:
        beat = time.monotonic() - core.heartbeat
        alive = core.alive
        return JSONResponse({"status": "alive" if alive else "dead", "engine_heartbeat_age_s": round(beat, 3)},
                            status_code=200 if alive else 503)

    async def prom(_: Request) -> Response:
        return PlainTextResponse(metrics.render(core, settings.name), media_type="text/plain; version=0.0.4")

    async def models(_: Request) -> Response:
        data = []
        m = core.snapshot().model
        if m is not None:
            data.append({"id": m.id, "object": "model", "created": int(m.loaded_at), "owned_by": "hydra",
                         "meta": {"path": m.path, "arch": m.arch, "desc": m.desc, "size": m.size_bytes,
                                  "n_params": m.n_params, "n_ctx_train": m.n_ctx_train, "n_vocab": m.n_vocab,
                                  "n_ctx": m.n_ctx, "n_parallel": m.n_parallel}})
        return JSONResponse({"object": "list", "data": data})

    def check_serving(req: openai._Common) -> str:
        if not core.admitting:
            raise ApiError(503, "engine is shutting down", "shutting_down", headers={"Retry-After": "5"})
        gen = core.gen
        load = core.current_load
        if gen is None and load is None:
            raise ApiError(503, "no model is loaded; configure one with POST /control/configure", "no_model")
        if not control.serves(req.model):
            serving = gen.resolved.id if gen is not None else (load.model if load else None)
            raise ApiError(404, f"model '{req.model}' is not served by this engine (it serves '{serving}')",
                           "model_not_found", "model")
        # with no generation yet, the request waits in the engine's queue for the loading model
        return gen.resolved.id if gen is not None else load.model  # type: ignore[union-attr]

    async def body_of(request: Request) -> bytes:
        try:
            return await read_body(request, settings.http.max_body_bytes)
        except BodyTooLarge as exc:
            raise ApiError(413, str(exc), "request_too_large") from None

    async def json_object(request: Request, what: str) -> dict[str, Any]:
        try:
            return jsonbody.loads_object(await body_of(request), what)
        except jsonbody.BodyError as exc:
            raise ApiError(400, str(exc), exc.code, exc.param) from None

    async def generate(request: Request, kind: str) -> Response:
        t_arrival = time.monotonic()
        req, greq = openai.parse(kind, await body_of(request))
        model_id = check_serving(req)
        try:
            await core.prepare(greq)
        except PromptTooLong as exc:
            raise ApiError(400, str(exc), "context_length_exceeded", "messages" if kind == "chat" else "prompt") from None
        handle = core.submit(greq)
        rid = openai.new_id(kind)
        try:
            first = await handle.queue.get()
        except asyncio.CancelledError:
            core.cancel(handle)
            raise
        t_first_event = time.monotonic()
        # where the time to first token went, server side: parsing and queueing, prefill, hand-over to the loop
        lag = {"server_ttft_ms": round((t_first_event - t_arrival) * 1000, 3),
               "first_token_handoff_ms": round((t_first_event - handle.t_first_token) * 1000, 3)
               if handle.t_first_token else None}
        if isinstance(first, Failed):
            handle.finished = True
            raise ApiError(first.status, first.message, first.code,
                           headers={"Retry-After": "1"} if first.status == 503 else None)
        if handle.generation is not None:  # the generation that took the request, not the one asked at arrival
            model_id = handle.generation.model
        if req.stream:
            return StreamingResponse(_stream(kind, rid, model_id, req, handle, first, lag), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        parts: list[str] = []
        ev: Any = first
        gone = asyncio.ensure_future(until_disconnected(request))
        try:
            while True:
                if isinstance(ev, Token):
                    parts.append(ev.text)
                elif isinstance(ev, Done):
                    handle.finished = True
                    return JSONResponse(openai.full_response(
                        kind, rid, model_id, "".join(parts), ev.finish_reason, ev.usage.openai(),
                        ev.generation.fingerprint, {**_timings(ev), **lag}),
                        headers={"X-Hydra-Generation": ev.generation.fingerprint})
                elif isinstance(ev, Failed):
                    handle.finished = True
                    raise ApiError(ev.status, ev.message, ev.code)
                if handle.queue.empty():
                    nxt = asyncio.ensure_future(handle.queue.get())
                    await asyncio.wait((nxt, gone), return_when=asyncio.FIRST_COMPLETED)
                    if not nxt.done():  # the client went away: stop generating for nobody
                        nxt.cancel()
                        log_event(log, logging.INFO, "client disconnected; request cancelled", req=handle.id)
                        return Response(status_code=499)
                    ev = nxt.result()
                else:
                    ev = handle.queue.get_nowait()
        finally:
            gone.cancel()
            core.cancel(handle) if not handle.finished else None

    async def _stream(kind: str, rid: str, model_id: str, req: openai._Common, handle: RequestHandle,
                      first: Any, lag: dict[str, Any]) -> AsyncIterator[bytes]:
        created = int(time.time())
        fp = handle.generation.fingerprint if handle.generation else ""
        try:
            if kind == "chat":
                yield openai.chunk(kind, rid, model_id, created, "", None, fp, first=True)
            ev = first
            while True:
                if isinstance(ev, Token):
                    yield openai.chunk(kind, rid, model_id, created, ev.text, None, fp)
                elif isinstance(ev, Done):
                    handle.finished = True
                    fp = ev.generation.fingerprint
                    yield openai.chunk(kind, rid, model_id, created, None, ev.finish_reason, fp,
                                       timings={**_timings(ev), **lag})
                    if req.include_usage():
                        yield openai.usage_chunk(kind, rid, model_id, created, ev.usage.openai(), fp)
                    yield openai.DONE
                    return
                elif isinstance(ev, Failed):
                    handle.finished = True
                    yield openai.sse(ApiError(ev.status, ev.message, ev.code).body())
                    yield openai.DONE
                    return
                ev = await handle.queue.get()
        finally:
            if not handle.finished:
                core.cancel(handle)

    async def chat(request: Request) -> Response:
        return await generate(request, "chat")

    async def completions(request: Request) -> Response:
        return await generate(request, "completion")

    async def get_config(request: Request) -> Response:
        guard_control(request)
        return JSONResponse({"engine": settings.name, "params": control.layers.sources(),
                             "model": control.resolved.id if control.resolved else None})

    async def configure(request: Request) -> Response:
        guard_control(request)
        payload = await json_object(request, "configure body")
        try:
            result = await control.configure(payload)
        except ParamError as exc:
            raise ApiError(400, str(exc), exc.code, exc.fields[0] if exc.fields else None) from None
        except UnknownModel as exc:
            raise ApiError(404, str(exc), "model_not_found", "model") from None
        except EngineBusy as exc:
            raise ApiError(409, str(exc), "busy", headers={"Retry-After": "1"}) from None
        return await finish_load(request, result.public(), result.load_id)

    async def swap_quant(request: Request) -> Response:
        guard_control(request)
        body = await json_object(request, "swap_quant body")
        model = body.get("model")
        if not isinstance(model, str):
            raise ApiError(400, "swap_quant needs {\"model\": <alias or GGUF path>}", "invalid_field", "model")
        try:
            result = await control.swap_quant(model)
        except ParamError as exc:
            raise ApiError(400, str(exc), exc.code, "model") from None
        except UnknownModel as exc:
            raise ApiError(404, str(exc), "model_not_found", "model") from None
        except EngineBusy as exc:
            raise ApiError(409, str(exc), "busy", headers={"Retry-After": "1"}) from None
        return await finish_load(request, result.public(), result.load_id)

    async def finish_load(request: Request, body: dict[str, Any], load_id: int | None) -> Response:
        if load_id is None:
            return JSONResponse(body)
        if request.query_params.get("wait") in ("1", "true", "yes"):
            rec = await core.loads[load_id].wait()
            body["load"] = rec.public()
            if rec.phase != "done":
                raise ApiError(422, f"model load {rec.phase}: {rec.error}", "load_failed")
            return JSONResponse(body)
        return JSONResponse(body, status_code=202, headers={"Location": f"/control/reloads/{load_id}"})

    async def load_status(request: Request) -> Response:
        guard_control(request)
        try:
            rec = core.loads[int(request.path_params["load_id"])]  # type: ignore[assignment]
        except (KeyError, ValueError):
            raise ApiError(404, "no such load", "not_found") from None
        return JSONResponse(rec.public())

    def slot_id(request: Request) -> int:
        try:
            return int(request.path_params["slot"])
        except ValueError:
            raise ApiError(400, "slot id must be an integer", "invalid_slot") from None

    async def slots(_: Request) -> Response:
        out: list[dict[str, Any]] = []
        for row in core.slot_rows():
            item: dict[str, Any] = {"id": row["id"], "is_processing": row["busy"], "n_tokens": row["n_tokens"]}
            item.update((k, row[k]) for k in ("n_prompt", "n_decoded", "decode_tps") if k in row)
            out.append(item)
        return JSONResponse(out)

    async def read_state(request: Request) -> tuple[dict[str, Any], Any]:
        guard_control(request)
        try:
            return await core.state_get(slot_id(request))
        except StateError as exc:
            raise ApiError(state_http_status(exc.kind), str(exc), exc.kind) from None

    async def state_get(request: Request) -> Response:
        meta, data = await read_state(request)
        chunk = settings.rpc.chunk_size

        async def body() -> AsyncIterator[bytes]:
            for piece in chunked(meta, data, chunk):
                yield bytes(piece)

        return StreamingResponse(body(), media_type="application/x-hydra-kv",
                                 headers={"X-Hydra-State-Bytes": str(meta["bytes"]), "X-Hydra-Tokens": str(meta["n_tokens"])})

    async def state_meta(request: Request) -> Response:
        meta, _ = await read_state(request)
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
        stream = request.stream()
        try:
            return await receive_state(request, stream)
        except ApiError:
            limit = max(_DISCARD_MIN, settings.rpc.max_state_bytes + (1 << 20))
            await discard_body(stream, limit)
            raise

    async def receive_state(request: Request, stream: AsyncIterator[bytes]) -> Response:
        trusted = guard_control(request)
        sid = slot_id(request)
        decoder = P.FrameDecoder(P.RESPONSE_CODES)
        rx: StateReceiver | None = None
        meta: dict[str, Any] | None = None
        end: dict[str, Any] | None = None
        try:
            async for piece in stream:
                for frame in decoder.feed(piece):
                    if end is not None:
                        raise P.ProtocolError("frames after STATE_END", P.Status.BAD_REQUEST)
                    if meta is None:
                        if frame.code != P.Status.STATE_META:
                            raise P.ProtocolError("a state stream starts with STATE_META", P.Status.BAD_REQUEST)
                        meta = frame.json()
                        refused = core.check_put(sid, meta, settings.rpc.max_state_bytes)
                        if refused is not None:
                            raise ApiError(state_http_status(refused.kind), str(refused), refused.kind)
                        rx = StateReceiver(meta["bytes"], core.state_buffers.take)
                    elif frame.code == P.Status.STATE_DATA:
                        assert rx is not None
                        rx.add(frame.payload)
                    elif frame.code == P.Status.STATE_END:
                        end = frame.json()
                    else:
                        raise P.ProtocolError(f"unexpected frame 0x{frame.code:02x} in a state stream", P.Status.BAD_REQUEST)
            decoder.eof()
        except P.ProtocolError as exc:
            raise ApiError(413 if exc.status == P.Status.TOO_LARGE else 400, f"bad state stream: {exc}; the slot is unchanged",
                           "bad_state_stream") from None
        if meta is None or rx is None or end is None:
            raise ApiError(400, "incomplete state stream (needs STATE_META, data, STATE_END); the slot is unchanged",
                           "bad_state_stream")
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

    async def version(_: Request) -> Response:
        return JSONResponse({"version": __version__, "engine": settings.name})

    async def on_api_error(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, ApiError)
        return _err(exc)

    async def on_crash(request: Request, exc: Exception) -> Response:
        log_event(log, logging.ERROR, "request failed", path=request.url.path, error=repr(exc), exc_info=True)
        return _err(ApiError(500, "internal error (see the engine log)", "internal_error"))

    async def not_found(request: Request, exc: Exception) -> Response:
        code = getattr(exc, "status_code", 404)
        return _err(ApiError(code, f"{request.method} {request.url.path}: {getattr(exc, 'detail', 'not found')}",
                             "not_found" if code == 404 else "method_not_allowed"))

    routes = [
        Route("/health", health), Route("/livez", livez), Route("/metrics", prom), Route("/version", version),
        Route("/v1/models", models), Route("/models", models),
        Route("/v1/chat/completions", chat, methods=["POST"]), Route("/chat/completions", chat, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]), Route("/completions", completions, methods=["POST"]),
        Route("/control/config", get_config), Route("/control/configure", configure, methods=["POST"]),
        Route("/control/loads/{load_id}", load_status), Route("/control/reloads/{load_id}", load_status),
        Route("/control/swap_quant", swap_quant, methods=["POST"]),
        Route("/slots", slots), Route("/slots/{slot}/state", state_get),
        Route("/slots/{slot}/state", state_put, methods=["PUT"]), Route("/slots/{slot}/state/meta", state_meta),
    ]
    return Starlette(routes=routes, exception_handlers={ApiError: on_api_error, Exception: on_crash,
                                                        404: not_found, 405: not_found})


def _timings(ev: Done) -> dict[str, Any]:
    u = ev.usage
    evaluated = u.prompt_tokens - u.cached_tokens
    return {"prompt_n": evaluated, "prompt_ms": u.prompt_ms, "queue_ms": u.queue_ms, "predicted_n": u.completion_tokens,
            "predicted_ms": u.predicted_ms, "cache_n": u.cached_tokens,
            "predicted_per_second": round(u.completion_tokens / (u.predicted_ms / 1000), 2) if u.predicted_ms else None}
