"""The engine's HTTP plane: OpenAI API, health, metrics and /control/*.

Handlers only translate; configure semantics live in EngineControl and generation in the
engine core. Every failure a client can see is OpenAI error JSON (Anthropic's on /v1/messages), never a
traceback.

Each handler is a module-level function of the request alone; what it needs (settings, control,
core) is the ``HttpContext`` on ``app.state.ctx``. Generation is in ``generation.py`` (llama-server's
``/completion`` and ``/infill`` in ``completion.py``, Anthropic's ``/v1/messages`` in ``anthropic.py``), slot state in
``slotstate.py``, llama-server's slot files in ``slotfiles.py``, embeddings in ``embeddings.py``, the Prometheus
collector in ``metrics.py``.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from hydrad import __version__
from hydrad.common.params import param_named
from hydrad.common.logs import log_event
from hydrad.common.openapi import openapi_route
from hydrad.common import webui
from hydrad.engine.control import EngineControl
from hydrad.engine.refusals import refusal
from hydrad.engine.http import counttokens, lora, metrics, native
from hydrad.engine.http.anthropic import messages
from hydrad.engine.http.completion import completion, infill
from hydrad.engine.http.context import HttpContext, ctx_of
from hydrad.engine.http.embeddings import embedding, embeddings
from hydrad.engine.http.rerank import rerank
from hydrad.engine.http.generation import chat, completions, responses_
from hydrad.engine.http.slotfiles import slot_action
from hydrad.engine.http.slotstate import state_get, state_meta, state_put
from hydrad.engine.settings import EngineSettings
from hydrad.wire.bodies import BINARY_BODIES, ENGINE_BODIES
from hydrad.wire.openai import ApiError
from hydrad.wire.rerank import PATHS as RERANK_PATHS
from hydrad.wire.stages import HEALTH_STATUS, fetch_text

log = logging.getLogger("hydrad.http")


def _err(e: ApiError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status, headers=e.headers)


async def health(request: Request) -> Response:
    ctx = ctx_of(request)
    snap = ctx.core.snapshot()
    stage = snap.stage
    body: dict[str, Any] = {"stage": stage, "engine": ctx.settings.name, "slots": snap.slots}
    if snap.device is not None:
        body["device"] = snap.device
    if snap.model is not None:
        body["model"] = snap.model.id
        body["generation"] = snap.model.generation
    elif snap.asleep is not None:
        body["model"] = snap.asleep
    if snap.loading_progress is not None:
        body["progress"] = round(snap.loading_progress, 4)
    if snap.load_id is not None:
        body["load_id"] = snap.load_id
    if snap.fetch is not None and snap.loading_progress is not None:
        body["fetch"] = {**snap.fetch, "text": fetch_text(snap.fetch)}
    if snap.last_error:
        body["last_error"] = snap.last_error
    pair = ctx.core.pairing.view(snap)
    body["mode"], body["role"] = pair["mode"], pair["role"]
    if pair["peers"]:
        body["peers"] = pair["peers"]
    if pair["serving"]:
        body["serving"] = pair["serving"]
    if not snap.alive:
        body["status"] = "error"
        return JSONResponse(body, status_code=503)
    if snap.model is not None and snap.admitting:
        body["status"] = "ok"
        return JSONResponse(body)
    if snap.asleep is not None and snap.admitting:  # healthy: the next request loads the model and is served
        body["status"] = "sleeping"
        return JSONResponse(body)
    body["status"] = HEALTH_STATUS.get(stage, stage)
    return JSONResponse(body, status_code=503, headers={"Retry-After": "1"} if stage != "idle" else {})


async def livez(request: Request) -> Response:
    core = ctx_of(request).core
    beat = time.monotonic() - core.heartbeat
    alive = core.alive
    return JSONResponse({"status": "alive" if alive else "dead", "engine_heartbeat_age_s": round(beat, 3)},
                        status_code=200 if alive else 503)


async def prom(request: Request) -> Response:
    """``GET /metrics``, unless ``http.metrics_endpoint`` is off (501, as llama-server without --metrics)."""
    ctx = ctx_of(request)
    if not ctx.settings.http.metrics_endpoint:
        raise ApiError(501, "GET /metrics is turned off on this engine (http.metrics_endpoint: false; llama-server's "
                       "command line serves it with --metrics)", "not_supported")
    response = Response(metrics.exposition(request.app.state.metrics, ctx.core), media_type=metrics.CONTENT_TYPE)
    # written as llama-server spells it: a client that looks the name up case-sensitively finds it
    response.raw_headers.append((b"Process-Start-Time-Unix", str(metrics.PROCESS_START).encode()))
    return response


async def models(request: Request) -> Response:
    """The model served; while the idle sleep has freed it, the model a request would wake (listed
    with ``status: sleeping``, as llama-server lists an unloaded model: listing it wakes nothing)."""
    data: list[dict[str, Any]] = []
    snap = ctx_of(request).core.snapshot()
    m = snap.model
    if m is None and snap.asleep is not None:
        data.append({"id": snap.asleep, "object": "model", "created": 0, "owned_by": "hydra",
                     "aliases": [snap.asleep], "status": {"value": "sleeping"}})
    if m is not None:
        # llama-server's ``aliases``: every name a request's ``model`` may use (never the file's directory)
        file = Path(m.path)
        data.append({"id": m.id, "object": "model", "created": int(m.loaded_at), "owned_by": "hydra",
                     "aliases": sorted({m.id, file.name, file.stem, *m.aliases}),
                     "meta": {"path": m.path, "arch": m.arch, "desc": m.desc, "size": m.size_bytes,
                              "n_params": m.n_params, "n_ctx_train": m.n_ctx_train, "n_vocab": m.n_vocab,
                              "n_ctx": m.n_ctx, "n_parallel": m.n_parallel, "weights": m.weights}})
    return JSONResponse({"object": "list", "data": data})


async def version(request: Request) -> Response:
    return JSONResponse({"version": __version__, "engine": ctx_of(request).settings.name})


# ---- /control/* ------------------------------------------------------------------------------

async def get_config(request: Request) -> Response:
    ctx = ctx_of(request)
    ctx.guard_control(request)
    control = ctx.control
    return JSONResponse({"engine": ctx.settings.name, "params": control.layers.sources(),
                         "model": control.resolved.id if control.resolved else None})


async def configure(request: Request) -> Response:
    ctx = ctx_of(request)
    ctx.guard_control(request)
    payload = await ctx.json_object(request, "configure body")
    try:
        result = await ctx.control.configure(payload)
    except Exception as exc:
        raise _refused(exc) from None
    return await finish_load(ctx, request, result.public(), result.load_id)


async def swap_quant(request: Request) -> Response:
    ctx = ctx_of(request)
    ctx.guard_control(request)
    body = await ctx.json_object(request, "swap_quant body")
    model = body.get("model")
    if not isinstance(model, str):
        raise ApiError(400, "swap_quant needs {\"model\": <alias or GGUF path>}", "invalid_field", "model")
    try:
        result = await ctx.control.swap_quant(model)
    except Exception as exc:
        raise _refused(exc, field="model") from None
    return await finish_load(ctx, request, result.public(), result.load_id)


async def set_expert_mode(request: Request) -> Response:
    ctx = ctx_of(request)
    ctx.guard_control(request)
    body = await ctx.json_object(request, "set_expert_mode body")
    unknown = sorted(set(body) - {"mode", "peer", "override_tensors"})
    if unknown:
        raise ApiError(400, f"unknown field(s): {', '.join(unknown)} (mode, peer, override_tensors)",
                       "unsupported_field", unknown[0])
    try:
        result = await ctx.control.set_expert_mode(body.get("mode"), body.get("peer"), body.get("override_tensors"))
    except Exception as exc:
        raise _refused(exc) from None
    return await finish_load(ctx, request, result, result.get("load_id"))


def _refused(exc: Exception, field: str | None = None) -> Exception:
    """The ApiError for a refused control operation; anything else is re-raised as the bug it is."""
    r = refusal(exc)
    if r is None:
        return exc
    return ApiError(r.http, r.message, r.code, field or r.field, headers=r.headers)


async def finish_load(ctx: HttpContext, request: Request, body: dict[str, Any], load_id: int | None) -> Response:
    if load_id is None:
        return JSONResponse(body)
    if request.query_params.get("wait") in ("1", "true", "yes"):
        rec = await ctx.core.loads[load_id].wait()
        body["load"] = rec.public()
        if rec.phase != "done":
            raise ApiError(422, f"model load {rec.phase}: {rec.error}", "load_failed", param_named(rec.error or ""))
        return JSONResponse(body)
    return JSONResponse(body, status_code=202, headers={"Location": f"/control/loads/{load_id}"})


async def load_status(request: Request) -> Response:
    ctx = ctx_of(request)
    ctx.guard_control(request)
    try:
        rec = ctx.core.loads[int(request.path_params["load_id"])]  # type: ignore[assignment]
    except (KeyError, ValueError):
        raise ApiError(404, "no such load", "not_found") from None
    return JSONResponse(rec.public())


async def slots(request: Request) -> Response:
    ctx = ctx_of(request)
    if not ctx.settings.http.slots_endpoint:
        raise ApiError(501, "GET /slots is turned off on this engine (http.slots_endpoint: false, llama-server's "
                       "--no-slots)", "not_supported")
    out: list[dict[str, Any]] = []
    for row in ctx.core.slot_rows():
        item: dict[str, Any] = {"id": row["id"], "n_ctx": row["n_ctx"], "is_processing": row["busy"],
                                "n_tokens": row["n_tokens"],
                                "speculative": row.get("speculative", False)}
        item.update((k, row[k]) for k in ("n_prompt", "n_decoded", "decode_tps", "draft_n", "draft_n_accepted")
                    if k in row)
        out.append(item)
    return JSONResponse(out)


# ---- errors ----------------------------------------------------------------------------------

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


ROUTES = [
    Route("/health", health), Route("/v1/health", health), Route("/livez", livez), Route("/metrics", prom), Route("/version", version),
    Route("/v1/models", models), Route("/models", models),
    Route("/v1/chat/completions", chat, methods=["POST"]), Route("/chat/completions", chat, methods=["POST"]),
    Route("/v1/completions", completions, methods=["POST"]),
    Route("/completions", completion, methods=["POST"]),  # llama-server's: its native completion, as /completion
    Route("/v1/messages", messages, methods=["POST"]),
    Route("/v1/responses", responses_, methods=["POST"]), Route("/responses", responses_, methods=["POST"]),
    Route("/v1/responses/input_tokens", counttokens.responses_count, methods=["POST"]),
    Route("/responses/input_tokens", counttokens.responses_count, methods=["POST"]),
    Route("/v1/messages/count_tokens", counttokens.messages_count, methods=["POST"]),
    Route("/v1/chat/completions/input_tokens", counttokens.chat_count, methods=["POST"]),
    Route("/chat/completions/input_tokens", counttokens.chat_count, methods=["POST"]),
    Route("/completion", completion, methods=["POST"]), Route("/infill", infill, methods=["POST"]),
    Route("/tokenize", native.tokenize, methods=["POST"]), Route("/detokenize", native.detokenize, methods=["POST"]),
    Route("/apply-template", native.apply_template, methods=["POST"]), Route("/props", native.props),
    Route("/v1/embeddings", embeddings, methods=["POST"]), Route("/embeddings", embedding, methods=["POST"]),
    Route("/embedding", embedding, methods=["POST"]),
    *(Route(path, rerank, methods=["POST"]) for path in RERANK_PATHS),
    Route("/control/config", get_config), Route("/control/configure", configure, methods=["POST"]),
    Route("/control/loads/{load_id}", load_status),
    Route("/control/swap_quant", swap_quant, methods=["POST"]),
    Route("/control/set_expert_mode", set_expert_mode, methods=["POST"]),
    Route("/lora-adapters", lora.get_adapters), Route("/lora-adapters", lora.set_adapters, methods=["POST"]),
    Route("/slots", slots), Route("/slots/{slot}", slot_action, methods=["POST"]),
    Route("/slots/{slot}/state", state_get),
    Route("/slots/{slot}/state", state_put, methods=["PUT"]), Route("/slots/{slot}/state/meta", state_meta),
]


def build_app(settings: EngineSettings, control: EngineControl) -> Starlette:
    routes = [*ROUTES, *webui.routes(settings.http.webui)]
    described = openapi_route(routes, "hydrad", __version__, bodies=ENGINE_BODIES, binary_bodies=BINARY_BODIES)
    app = Starlette(routes=[*routes, described], exception_handlers={ApiError: on_api_error, Exception: on_crash,
                                                       404: not_found, 405: not_found})
    app.state.ctx = HttpContext(settings, control)
    app.state.metrics = metrics.registry(control.core, settings.name)
    return app
