"""llama-server's ``/tokenize``, ``/detokenize`` and ``/apply-template`` at the front door.

They generate nothing, so they do not go over the bus as GENERATE does: the body is forwarded
over HTTP to an engine that serves the model, and its answer (or its 4xx) comes back as is. A
``model`` field picks the model (as in chat; llama-server has none, since it serves one model):
without it the pool must serve exactly one model. The engine answers a field it does not know by
name, so ``model`` is taken out before forwarding.
"""

from __future__ import annotations

import json
from typing import Any, Callable

import httpx
from starlette.requests import Request
from starlette.responses import Response

from hydrad.common import jsonbody
from hydrad.wire.openai import ApiError

PATHS = ("/tokenize", "/detokenize", "/apply-template")
TIMEOUT_S = 60.0


class NativeDoor:
    """``engines``: the bus's engine records by name; ``served``: model → engines serving it now;
    ``model_of``: a request's ``model`` as the pool names it (ApiError 404 when unknown)."""

    def __init__(self, engines: dict[str, Any], served: Callable[[], dict[str, list[str]]],
                 model_of: Callable[[str | None], str | None]) -> None:
        self.engines = engines
        self.served = served
        self.model_of = model_of
        self._client: httpx.AsyncClient | None = None

    def _engine_url(self, model_field: object) -> str:
        if model_field is not None and not isinstance(model_field, str):
            raise ApiError(400, "model must be a string", "invalid_field", "model")
        model = self.model_of(model_field)
        served = self.served()
        if model is None:
            if len(served) > 1:
                raise ApiError(400, f"this pool serves several models ({', '.join(sorted(served))}); name one in "
                               "'model'", "invalid_field", "model")
            model = next(iter(served), None)
        engines = served.get(model or "", [])
        if not engines:
            raise ApiError(503, f"no engine serves {model or 'a model'} now", "no_engine", headers={"Retry-After": "1"})
        rec = min((self.engines[n] for n in engines), key=lambda r: (r.status.slots_busy + r.status.queued, r.name))
        if not rec.info.http:
            raise ApiError(503, f"engine {rec.name} has no HTTP address", "no_engine")
        return f"http://{rec.info.http}"

    async def forward(self, request: Request) -> Response:
        raw = await request.body()
        try:
            body = jsonbody.loads_object(raw, f"{request.url.path} body")
        except jsonbody.BodyError as exc:
            raise ApiError(400, str(exc), exc.code, exc.param) from None
        base = self._engine_url(body.pop("model", None))
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=TIMEOUT_S)
        try:
            headers = {"Content-Type": "application/json"}
            if "authorization" in request.headers:  # a pool with one API key: the engine asks for it too
                headers["Authorization"] = request.headers["authorization"]
            r = await self._client.post(base + request.url.path, content=json.dumps(body).encode(), headers=headers)
        except httpx.HTTPError as exc:
            raise ApiError(502, f"the engine did not answer ({type(exc).__name__})", "engine_unreachable",
                           headers={"Retry-After": "1"}) from None
        return Response(r.content, status_code=r.status_code, media_type="application/json")

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
