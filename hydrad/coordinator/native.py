"""llama-server's native endpoints that generate nothing, at the front door: ``/tokenize``,
``/detokenize``, ``/apply-template``, the token counts (Anthropic's ``/v1/messages/count_tokens``,
llama-server's ``/v1/chat/completions/input_tokens``), and the embeddings (OpenAI's ``/v1/embeddings``,
llama-server's ``/embedding``). ``/completion`` and ``/infill`` generate: they take the one
request path with chat (``frontdoor``: routed, kept as sessions, retried, answered by their
renderer).

These are forwarded over HTTP to an engine that serves the model, and its answer (or its 4xx)
comes back as is, streamed through (a ``with_pieces`` answer is a hundred megabytes for 8 MiB of
text: never held whole here). A ``model`` field picks the model as in chat (the front door's
``_pick``: without it the pool's one model or its ``default_model``, whose answer then says so in
X-Hydra-Default-Model; llama-server has no such field, since it serves one model). The engine
answers a field it does not know by name, so ``model`` is taken out before forwarding. The body
is parsed, checked and written again on the preparation workers, never on the event loop.

Embeddings are checked here first (:mod:`hydrad.wire.embeddings`); an engine whose model is
loaded without embeddings passes them on to the next engine serving the model. So is reranking
(llama-server's ``/rerank``, :mod:`hydrad.wire.rerank`), passed on by an engine whose model is not
loaded as a reranker. (The bus carries
events of generations, not vectors: these stay on HTTP, without session affinity, which they
have no use for.)
"""

from __future__ import annotations

from typing import Any, AsyncIterator, Callable

import httpx
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from hydrad.common import jsonbody
from hydrad.common.prepare import Preparer
from hydrad.wire import embeddings, rerank
from hydrad.wire.openai import ApiError

PATHS = ("/tokenize", "/detokenize", "/apply-template", "/v1/messages/count_tokens", "/v1/chat/completions/input_tokens",
         "/chat/completions/input_tokens", "/v1/responses/input_tokens", "/responses/input_tokens")
EMBEDDING_PATHS = ("/v1/embeddings", "/embeddings", "/embedding", *rerank.PATHS)
TIMEOUT_S = 60.0
"""Longest a forwarded request may wait for its engine's answer to begin."""


class NativeDoor:
    """``engines``: the bus's engine records by name; ``served``: model → engines serving it now;
    ``model_of``: a request's ``model`` as the pool names it, and whether the pool's default model
    stands in for it (ApiError 404 when unknown);
    ``settings``: the coordinator's."""

    def __init__(self, engines: dict[str, Any], served: Callable[[], dict[str, list[str]]],
                 model_of: Callable[[str | None], tuple[str | None, bool]], settings: Any, prep: Preparer) -> None:
        self.prep = prep  # bodies are checked and re-encoded off the event loop
        self.engines = engines
        self.served = served
        self.model_of = model_of
        self.settings = settings
        self._client: httpx.AsyncClient | None = None

    def _engine_urls(self, model_field: object) -> tuple[list[str], dict[str, str]]:
        """The HTTP addresses of the engines serving the request's model, least busy first, and the
        headers the answer gets (X-Hydra-Default-Model when the pool's default model stands in)."""
        if model_field is not None and not isinstance(model_field, str):
            raise ApiError(400, "model must be a string", "invalid_field", "model")
        model, defaulted = self.model_of(model_field)
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
        return urls, ({"X-Hydra-Default-Model": model or ""} if defaulted else {})

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
        """``/tokenize``, ``/detokenize``, ``/apply-template`` and the token counts: the engine's answer passed through as it
        arrives (a ``with_pieces`` answer is a hundred megabytes for 8 MiB of text: never held whole here)."""
        _, model, content = await self._forwarded(request)
        urls, headers = self._engine_urls(model)
        _, r = await self._send(urls, request, content, stream=True)
        return StreamingResponse(self._passed(r), status_code=r.status_code, headers=headers,
                                 media_type=r.headers.get("content-type", "application/json"))

    async def _send(self, urls: list[str], request: Request, content: bytes,
                    stream: bool = False) -> tuple[int, httpx.Response]:
        """The request to the first engine that takes the connection (its index in ``urls``, its answer). These requests change nothing
        and generate nothing, so one an engine never received (it went away, its port is closed) is
        sent to the next engine serving the model, as a chat is retried before its first token; an
        error once the engine has it is the answer."""
        last: httpx.HTTPError | None = None
        for i, url in enumerate(urls):
            sent = self.client.build_request("POST", url + request.url.path, content=content,
                                             headers=self._headers(request))
            try:
                return i, await self.client.send(sent, stream=stream)
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                last = exc
            except httpx.HTTPError as exc:
                raise _unreachable(exc) from None
        assert last is not None
        raise _unreachable(last)

    @staticmethod
    async def _passed(r: httpx.Response) -> AsyncIterator[bytes]:
        try:
            async for piece in r.aiter_raw():
                yield piece
        finally:
            await r.aclose()

    async def embeddings(self, request: Request) -> Response:
        """``POST /v1/embeddings``, llama-server's ``/embedding`` and ``/rerank``: checked here as the engine
        will check them, then computed by an engine serving the model. Whether an engine has embeddings
        (or a reranker's rank pooling) turned on is its own parameter, which the front door does not see:
        one that answers 501 (off) passes the request to the next engine serving the model."""
        path = request.url.path
        check = rerank.parse if path in rerank.PATHS else \
            embeddings.parse_openai if path == "/v1/embeddings" else embeddings.parse_native
        _, model, content = await self._forwarded(request, check)
        urls, headers = self._engine_urls(model)
        answer: Response | None = None
        while urls:
            taken, r = await self._send(urls, request, content)
            answer = Response(r.content, status_code=r.status_code, media_type="application/json", headers=headers)
            if not (r.status_code == 501 and (embeddings.DISABLED.encode() in r.content
                                              or rerank.DISABLED.encode() in r.content)):
                break
            urls = urls[taken + 1:]
        assert answer is not None
        return answer

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()


def _unreachable(exc: httpx.HTTPError) -> ApiError:
    return ApiError(502, f"the engine did not answer ({type(exc).__name__})", "engine_unreachable",
                    headers={"Retry-After": "1"})
