"""llama-server's native endpoints at the front door: ``/tokenize``, ``/detokenize``,
``/apply-template``, ``/completion`` and ``/infill`` (and ``/v1/messages`` while the bus cannot carry its stop word),
and the embeddings (OpenAI's ``/v1/embeddings``, llama-server's ``/embedding``).

The first three generate nothing, so they do not go over the bus as GENERATE does: the body is
forwarded over HTTP to an engine that serves the model, and its answer (or its 4xx) comes back as
is. A ``model`` field picks the model (as in chat; llama-server has none, since it serves one
model): without it the pool must serve exactly one model. The engine answers a field it does not
know by name, so ``model`` is taken out before forwarding.

``/completion`` is forwarded the same way (its stream passed through as the engine writes it),
after the front door has parsed it as the engine will (:mod:`hydrad.wire.native_completion`), so
a bad field is refused here without touching an engine. Not over the bus: GENERATE, TOKENS and
DONE carry text only, and this endpoint needs what they do not carry (a prompt of token ids, the
generated ids of ``return_tokens``, the stopping word, a per-request ``cache_prompt``). The cost,
until the bus carries them: the engine is the least busy one serving the model, without session
affinity, on-demand loading or a retry elsewhere; a client that goes away still cancels the
request on its engine (the forwarded connection closes). What the engine streams passes as is,
so the ``prompt_progress`` events a ``return_progress`` request asks for come through too.
``/infill`` goes the same way: its prompt is made of the model's FIM tokens, on the engine.

Embeddings are forwarded the same way (the bus carries text, not vectors), checked here first
(:mod:`hydrad.wire.embeddings`); an engine whose model is loaded without embeddings passes them on
to the next engine serving the model.

An Anthropic ``/v1/messages`` request normally goes over the bus like a chat completion
(``frontdoor``); one with stop sequences comes this way while DONE does not say which stop string
ended the generation, since Anthropic's answer names it. The engine's answer, in Anthropic's
shapes, comes back as it is.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, AsyncIterator, Callable

import httpx
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from hydrad.common import jsonbody
from hydrad.common.eventstream import EventStream
from hydrad.common.prepare import Preparer
from hydrad.common.serving import until_disconnected
from hydrad.wire import embeddings, infill, native_completion
from hydrad.wire.openai import ApiError

PATHS = ("/tokenize", "/detokenize", "/apply-template")
EMBEDDING_PATHS = ("/v1/embeddings", "/embeddings", "/embedding")
TIMEOUT_S = 60.0
GENERATION_S = 600.0
"""Longest a whole non-streamed /completion may take past its first token (its engine sends
nothing before the end, so no per-token bound applies)."""


def _data_event(exc: ApiError) -> bytes:
    return b"data: " + json.dumps(exc.body()).encode() + b"\n\n"


class NativeDoor:
    """``engines``: the bus's engine records by name; ``served``: model → engines serving it now;
    ``model_of``: a request's ``model`` as the pool names it (ApiError 404 when unknown);
    ``settings``: the coordinator's, whose first-token and token timeouts bound a /completion."""

    def __init__(self, engines: dict[str, Any], served: Callable[[], dict[str, list[str]]],
                 model_of: Callable[[str | None], str | None], settings: Any, prep: Preparer) -> None:
        self.prep = prep  # bodies are checked and re-encoded off the event loop
        self.engines = engines
        self.served = served
        self.model_of = model_of
        self.settings = settings
        self._client: httpx.AsyncClient | None = None

    def _engine_url(self, model_field: object) -> str:
        return self._engine_urls(model_field)[0]

    def _engine_urls(self, model_field: object) -> list[str]:
        """The HTTP addresses of the engines serving the request's model, least busy first."""
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
        recs = sorted((self.engines[n] for n in engines), key=lambda r: (r.status.slots_busy + r.status.queued, r.name))
        urls = [f"http://{r.info.http}" for r in recs if r.info.http]
        if not urls:
            raise ApiError(503, f"engine {recs[0].name} has no HTTP address", "no_engine")
        return urls

    async def _forwarded(self, request: Request,
                         check: Callable[[dict[str, Any]], Any] | None = None) -> tuple[Any, Any, bytes]:
        """(what ``check`` made of the body, the body's ``model``, the body to forward without it),
        all made on the preparation workers unless the body is small: a body of megabytes is read
        once, checked, and written again there, compact and as UTF-8, so it never grows on the way
        (an 8 MB body written with escapes was 12 MB and over the engine's limit)."""
        path = request.url.path

        def prepare(raw: bytes) -> tuple[Any, Any, bytes]:
            try:
                body = jsonbody.loads_object(raw, f"{path} body")
            except jsonbody.BodyError as exc:
                raise ApiError(400, str(exc), exc.code, exc.param) from None
            checked = check(body) if check is not None else None
            rest = {k: v for k, v in body.items() if k != "model"}
            return checked, body.get("model"), jsonbody.dumps(rest)

        return await self.prep.parse(request, await request.body(), prepare)

    @staticmethod
    def _headers(request: Request) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        for name in ("authorization", "x-api-key"):  # a pool with one API key: the engine asks for it too
            if name in request.headers:
                headers[name] = request.headers[name]
        return headers

    @property
    def client(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=TIMEOUT_S)
        return self._client

    async def forward(self, request: Request) -> Response:
        """``/tokenize``, ``/detokenize``, ``/apply-template``: the engine's answer passed through as it
        arrives (a ``with_pieces`` answer is a hundred megabytes for 8 MiB of text: never held whole here)."""
        _, model, content = await self._forwarded(request)
        base = self._engine_url(model)
        sent = self.client.build_request("POST", base + request.url.path, content=content,
                                         headers=self._headers(request))
        try:
            r = await self.client.send(sent, stream=True)
        except httpx.HTTPError as exc:
            raise _unreachable(exc) from None
        return StreamingResponse(self._passed(r), status_code=r.status_code,
                                 media_type=r.headers.get("content-type", "application/json"))

    @staticmethod
    async def _passed(r: httpx.Response) -> AsyncIterator[bytes]:
        try:
            async for piece in r.aiter_raw():
                yield piece
        finally:
            await r.aclose()

    async def embeddings(self, request: Request) -> Response:
        """``POST /v1/embeddings`` and llama-server's ``/embedding``: checked here as the engine will
        check them, then computed by an engine serving the model. Whether an engine has embeddings
        turned on is its own parameter, which the front door does not see: one that answers 501
        (embeddings off) passes the request to the next engine serving the model."""
        path = request.url.path
        _, model, content = await self._forwarded(
            request, embeddings.parse_openai if path == "/v1/embeddings" else embeddings.parse_native)
        urls = self._engine_urls(model)
        answer: Response | None = None
        for url in urls:
            try:
                r = await self.client.post(url + path, content=content, headers=self._headers(request))
            except httpx.HTTPError as exc:
                raise _unreachable(exc) from None
            answer = Response(r.content, status_code=r.status_code, media_type="application/json")
            if not (r.status_code == 501 and embeddings.DISABLED.encode() in r.content):
                break
        assert answer is not None
        return answer

    async def completion(self, request: Request) -> Response:
        """``POST /completion`` and ``POST /infill``: checked here, generated on an engine serving
        the model (whose vocabulary decides whether it can fill in the middle: its 501 comes back)."""
        path = request.url.path
        (req, _), model, content = await self._forwarded(
            request, infill.parse if path == "/infill" else native_completion.parse)
        base = self._engine_url(model)
        return await self._generation(request, base + path, content, req.stream)

    async def _generation(self, request: Request, url: str, content: bytes, stream: bool,
                          broken: Callable[[ApiError], bytes] = _data_event) -> Response:
        """A generating request forwarded to ``url``, its answer or stream passed back as the engine writes
        it; the client going away closes the forwarded connection, which cancels it on the engine. A
        stream the engine breaks off ends with ``broken`` of the error, in the endpoint's own shape."""
        first, between = self.settings.first_token_timeout_s, self.settings.token_timeout_s
        timeout = httpx.Timeout(TIMEOUT_S, read=max(first, between) if stream else first + GENERATION_S)
        sent = self.client.build_request("POST", url, content=content, headers=self._headers(request), timeout=timeout)
        answer = asyncio.ensure_future(self._answer(sent, stream, broken))
        gone = asyncio.ensure_future(until_disconnected(request))
        try:
            await asyncio.wait({answer, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
        if not answer.done():  # the client went away: closing the connection cancels it on the engine
            answer.cancel()
            return Response(status_code=499)
        return answer.result()

    async def _answer(self, sent: httpx.Request, stream: bool, broken: Callable[[ApiError], bytes]) -> Response:
        try:
            r = await self.client.send(sent, stream=True)
        except httpx.HTTPError as exc:
            raise _unreachable(exc) from None
        ctype = r.headers.get("content-type", "application/json")
        passed = {k: v for k, v in r.headers.items() if k.lower().startswith("x-hydra-")}
        if stream and r.status_code == 200 and ctype.startswith("text/event-stream"):
            passed.update({"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
            return EventStream(self._relay(r, broken), headers=passed)
        try:
            content = await r.aread()
        except httpx.HTTPError as exc:
            raise _unreachable(exc) from None
        finally:
            await r.aclose()
        return Response(content, status_code=r.status_code, media_type=ctype, headers=passed)

    async def _relay(self, r: httpx.Response, broken: Callable[[ApiError], bytes]) -> AsyncIterator[bytes]:
        """The engine's events as they come; a stream the engine breaks off ends with an error event."""
        try:
            async for piece in r.aiter_raw():
                yield piece
        except httpx.HTTPError as exc:
            yield broken(_unreachable(exc))
        finally:
            await r.aclose()

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()


def _unreachable(exc: httpx.HTTPError) -> ApiError:
    return ApiError(502, f"the engine did not answer ({type(exc).__name__})", "engine_unreachable",
                    headers={"Retry-After": "1"})
