"""What every engine HTTP handler needs, kept on ``app.state.ctx``: the settings, the control
layer (and through it the core), and the checks several handlers share (the control gate, body
reading, "is this model served here").

Handlers are module-level functions that take only the request and find this through
``ctx_of(request)``, so a test can import one and call it on an app of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable, TypeVar

from starlette.requests import Request

from hydrad.common import jsonbody
from hydrad.common.prepare import Preparer
from hydrad.common.serving import BodyTooLarge, read_body
from hydrad.engine.control import EngineControl
from hydrad.engine.core import EngineCore
from hydrad.engine.settings import EngineSettings
from hydrad.wire import openai
from hydrad.wire.openai import ApiError


T = TypeVar("T")


@dataclass
class HttpContext:
    settings: EngineSettings
    control: EngineControl
    prep: Preparer = field(default_factory=lambda: Preparer(openai.too_many_pending, name="hydrad-prep"))

    @property
    def core(self) -> EngineCore:
        return self.control.core

    def guard_control(self, request: Request) -> bool:
        """The one gate of /control/* and /slots/*/state*: the peer address must be inside
        ``control_allow_from`` and, when the engine has a token, the request must carry it as
        ``Authorization: Bearer <token>`` (the merged port asks the same of its HELLO). Returns whether
        the caller proved the token, which is what makes a restored state trusted."""
        settings = self.settings
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

    def check_serving(self, req: openai._Common) -> str:
        core = self.core
        if not core.admitting:
            raise ApiError(503, "engine is shutting down", "shutting_down", headers={"Retry-After": "5"})
        gen = core.gen
        load = core.current_load
        asleep = core.asleep
        if gen is None and load is None and asleep is None:
            raise ApiError(503, "no model is loaded; configure one with POST /control/configure", "no_model")
        serving = gen.resolved.id if gen is not None else load.model if load is not None else asleep
        assert serving is not None
        self.check_model(req.model, serving)
        if asleep is not None:  # the idle sleep freed the model: load it now, while the request is prepared
            self.control.wake()
        # with no generation yet, the request waits in the engine's queue for the loading model
        return serving

    async def woken(self) -> None:
        """After the idle sleep (hydrad.engine.sleep) a request that needs the model (an embedding, a
        tokenization, a token count, a template's prompt) loads it again and waits for it, bounded by
        reload_queue_timeout_s, as a generation request waits in the engine's queue."""
        core = self.core
        if core.asleep is None or not core.admitting:
            return
        self.control.wake()
        rec = core.current_load
        if rec is not None:
            limit = core.params.reload_queue_timeout_s if core.params is not None else 30.0
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(rec.wait(), limit)

    def check_model(self, name: str | None, serving: str) -> None:
        """A request's ``model`` against the one this engine serves. As llama-server, any name is
        served by the loaded model (a client written for another server sends its own model's
        name); with ``http.strict_model_names`` only the loaded model's names are, others get 404."""
        if self.settings.http.strict_model_names and not self.control.serves(name):
            raise ApiError(404, f"model '{name}' is not served by this engine (it serves '{serving}'; "
                           "http.strict_model_names is on)", "model_not_found", "model")

    async def body_of(self, request: Request) -> bytes:
        try:
            return await read_body(request, self.settings.http.max_body_bytes)
        except BodyTooLarge as exc:
            raise ApiError(413, str(exc), "request_too_large") from None

    async def json_object(self, request: Request, what: str) -> dict[str, Any]:
        return await self.parsed(request, lambda raw: self.parse_object(raw, what))

    async def parsed(self, request: Request, parse: Callable[[bytes], T]) -> T:
        """``parse(body)``, off the event loop unless the body is small (:mod:`hydrad.common.prepare`);
        429 when this client already has its share of bodies being parsed."""
        return await self.prep.parse(request, await self.body_of(request), parse)

    @staticmethod
    def parse_object(raw: bytes, what: str) -> dict[str, Any]:
        """A body that must be a JSON object (the body can be read once: a handler that needs the raw
        bytes too reads them with body_of and parses here)."""
        try:
            return jsonbody.loads_object(raw, what)
        except jsonbody.BodyError as exc:
            raise ApiError(400, str(exc), exc.code, exc.param) from None


def ctx_of(request: Request) -> HttpContext:
    return request.app.state.ctx  # type: ignore[no-any-return]
