"""llama-server's ``GET /lora-adapters`` and ``POST /lora-adapters``: the serving model's LoRA adapters
(id, path, scale) and the scales a request that names none runs with.

The adapters themselves are loaded with the model (``lora_adapters``, T3); these only read them and
replace the default scales, which takes effect for the requests admitted from then on (a running
request keeps the scales it started with, so its KV stays consistent). A later model load starts again
from ``lora_adapters``' scales.
"""

from __future__ import annotations

from typing import Any

from pydantic import TypeAdapter, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from hydrad.common import jsonbody
from hydrad.common.params import validation_message
from hydrad.engine.adapters import AdapterRefused
from hydrad.engine.http.context import ctx_of
from hydrad.wire.openai import ApiError
from hydrad.wire.requests import MAX_LORA_ENTRIES, LoraScale

_ENTRIES = TypeAdapter(list[LoraScale])


def _adapters(request: Request) -> Any:
    gen = ctx_of(request).core.gen
    if gen is None:
        raise ApiError(503, "no model is loaded; configure one with POST /control/configure", "no_model")
    return gen.adapters


async def get_adapters(request: Request) -> Response:
    adapters = _adapters(request)
    return JSONResponse(adapters.public() if adapters is not None else [])


def _array(raw: bytes) -> Any:
    try:
        return jsonbody.loads(raw, "lora-adapters body")
    except jsonbody.BodyError as exc:
        raise ApiError(400, str(exc), exc.code, exc.param) from None


async def set_adapters(request: Request) -> Response:
    """The body is llama-server's: ``[{"id": 0, "scale": 0.5}, ...]``; adapters it does not name go to 0."""
    ctx = ctx_of(request)
    body = await ctx.parsed(request, _array)
    if not isinstance(body, list):
        raise ApiError(400, "the body must be an array of {\"id\", \"scale\"}", "invalid_field", "lora")
    if len(body) > MAX_LORA_ENTRIES:
        raise ApiError(400, f"at most {MAX_LORA_ENTRIES} entries", "invalid_field", "lora")
    try:
        entries = _ENTRIES.validate_python(body)
    except ValidationError as exc:
        raise ApiError(400, "lora: " + validation_message(exc)[0], "invalid_field", "lora") from None
    adapters = _adapters(request)
    if adapters is None or not adapters.loras:
        raise ApiError(400, "this model has no LoRA adapters (the engine's lora_adapters)", "invalid_field", "lora")
    try:
        adapters.set_defaults(entries)
    except AdapterRefused as exc:
        raise ApiError(400, str(exc), "invalid_field", "lora") from None
    return JSONResponse({"success": True})
