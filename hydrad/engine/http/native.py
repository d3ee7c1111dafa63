"""llama-server's native endpoints, with its request and answer shapes: ``POST /tokenize``,
``POST /detokenize``, ``POST /apply-template`` and ``GET /props``.

Clients of llama-server count tokens and build prompts with these. The vocabulary work runs on a worker thread
(tokenizing a 1 MiB body takes a while and must not stall the event loop or the engine thread):
the model's vocabulary is read-only and :class:`hydrad.engine.llama.Model` guards it against a
reload freeing it meanwhile (then a 503, as for any request that meets a reload).
"""

from __future__ import annotations

import asyncio
from typing import Any, Iterator

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from hydrad.common import jsonbody
from hydrad.engine import chatprompt
from hydrad.engine.http.context import ctx_of
from hydrad.engine.llama import ModelFreed
from hydrad import __version__
from hydrad.wire import openai
from hydrad.wire.openai import ApiError
from hydrad.wire.requests import GenRequest

_FIELDS_TOKENIZE = {"content", "add_special", "parse_special", "with_pieces"}
_FIELDS_DETOKENIZE = {"tokens"}
_FIELDS_APPLY_TEMPLATE = {"messages", "tools", "tool_choice", "parallel_tool_calls", "chat_template_kwargs",
                          "add_generation_prompt", *openai.BUDGET_FIELDS}


def _flag(body: dict[str, Any], name: str, default: bool) -> bool:
    value = body.get(name, default)
    if not isinstance(value, bool):
        raise ApiError(400, f"{name} must be true or false", "invalid_field", name)
    return value


def _unknown(body: dict[str, Any], known: set[str]) -> None:
    extra = sorted(set(body) - known)
    if extra:
        raise ApiError(400, f"unknown field(s): {', '.join(extra)} ({', '.join(sorted(known))})",
                       "unsupported_field", extra[0])


async def _model(request: Request) -> Any:
    """The model loaded, loaded again first if the idle sleep freed it (llama-server wakes for these
    requests too); 503 when the engine has none."""
    ctx = ctx_of(request)
    await ctx.woken()
    gen = ctx.core.gen
    if gen is None:
        raise ApiError(503, "no model is loaded; configure one with POST /control/configure", "no_model")
    return gen.model


def _piece(b: bytes) -> str | list[int]:
    """llama-server's shape: the piece as text when it is valid UTF-8, else its bytes."""
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError:
        return list(b)


async def tokenize(request: Request) -> Response:
    """llama-server's ``/tokenize``. The tokens (and, ``with_pieces``, each one's text) are made on
    a worker thread and a long answer is written in steps (:func:`_with_pieces`): 8 MiB of text is
    millions of pieces, and building their JSON on the event loop held it for seconds."""
    ctx = ctx_of(request)
    body = await ctx.json_object(request, "tokenize body")
    _unknown(body, _FIELDS_TOKENIZE)
    content = body.get("content")
    if not isinstance(content, str):
        raise ApiError(400, "content must be a string", "invalid_field", "content")
    add_special = _flag(body, "add_special", False)
    parse_special = _flag(body, "parse_special", True)
    with_pieces = _flag(body, "with_pieces", False)
    model = await _model(request)

    def tokens() -> list[int]:
        if parse_special:
            return model.tokenize_prompt(content, add_special)
        return model.tokenize(content, add_special, False)

    try:
        ids = await asyncio.to_thread(tokens)
        if not with_pieces:
            return Response(await asyncio.to_thread(jsonbody.dumps, {"tokens": ids}), media_type="application/json")
        pieces = await asyncio.to_thread(model.detokenize, ids, True)
    except ModelFreed:
        raise ApiError(503, "the model was replaced while tokenizing; retry", "reloading",
                       headers={"Retry-After": "1"}) from None
    return StreamingResponse(_with_pieces(ids, pieces), media_type="application/json")  # type: ignore[arg-type]


_PIECES_PER_CHUNK = 4096


def _with_pieces(ids: list[int], pieces: list[bytes]) -> Iterator[bytes]:
    """``{"tokens": [{"id", "piece"}, ...]}`` a few thousand tokens at a time. Written whole, 8 MiB
    of text made one 100 MB ``json.dumps`` call, which holds the interpreter lock throughout: the
    engine's event loop missed its heartbeats for 1.6 s. Starlette runs each step of this
    generator on a worker thread, and the lock is free between steps."""
    yield b'{"tokens":['
    for start in range(0, len(ids), _PIECES_PER_CHUNK):
        part = jsonbody.dumps([{"id": t, "piece": _piece(b)} for t, b in
                         zip(ids[start:start + _PIECES_PER_CHUNK], pieces[start:start + _PIECES_PER_CHUNK])])
        yield (b"," if start else b"") + part[1:-1]
    yield b"]}"


async def detokenize(request: Request) -> Response:
    ctx = ctx_of(request)
    model = await _model(request)

    def parse(raw: bytes) -> list[int]:
        body = ctx.parse_object(raw, "detokenize body")
        _unknown(body, _FIELDS_DETOKENIZE)
        tokens = body.get("tokens")
        if not isinstance(tokens, list) or not all(type(t) is int for t in tokens):
            raise ApiError(400, "tokens must be a list of token ids (integers)", "invalid_field", "tokens")
        bad = next((t for t in tokens if not 0 <= t < model.n_vocab), None)
        if bad is not None:
            raise ApiError(400, f"token {bad} is not in this model's vocabulary (0..{model.n_vocab - 1})",
                           "invalid_field", "tokens")
        return tokens

    tokens = await ctx.parsed(request, parse)
    try:
        text = await asyncio.to_thread(model.detokenize, tokens)
    except ModelFreed:
        raise ApiError(503, "the model was replaced while detokenizing; retry", "reloading",
                       headers={"Retry-After": "1"}) from None
    assert isinstance(text, bytes)
    return Response(await asyncio.to_thread(lambda: jsonbody.dumps({"content": text.decode("utf-8", "replace")})),
                    media_type="application/json")


async def apply_template(request: Request) -> Response:
    """The prompt the engine would make of a chat (``messages``, ``tools``, ``tool_choice``,
    ``parallel_tool_calls``, ``chat_template_kwargs`` and a reasoning budget as in chat completions),
    without generating: the model's template (or ``chat_template``) with the assistant's turn opened
    (``add_generation_prompt``, true unless set false), rendered by the chat path's own code."""
    ctx = ctx_of(request)

    def parse(raw: bytes) -> tuple[GenRequest, bool]:
        body = ctx.parse_object(raw, "apply-template body")
        _unknown(body, _FIELDS_APPLY_TEMPLATE)
        opened = _flag(body, "add_generation_prompt", True)
        body.pop("add_generation_prompt", None)
        return openai.parse_object("chat", body)[1], opened

    req, opened = await ctx.parsed(request, parse)
    model = await _model(request)
    params = ctx.core.snapshot().params
    kwargs = chatprompt.template_kwargs(req, params) if params else req.chat_template_kwargs
    try:
        prompt = await asyncio.to_thread(chatprompt.chat_text, model, params.chat_template if params else None, req,
                                         kwargs, opened)
    except ValueError as exc:
        raise ApiError(400, str(exc), "template_error", getattr(exc, "param", None)) from None
    return Response(await asyncio.to_thread(jsonbody.dumps, {"prompt": prompt}), media_type="application/json")


async def props(request: Request) -> Response:
    """llama-server's ``GET /props``: the generation defaults in force, the slots, the model, and
    ``is_sleeping`` (the idle sleep has freed the model; the next request loads it again)."""
    ctx = ctx_of(request)
    snap = ctx.core.snapshot()
    p, m = snap.params, snap.model
    settings: dict[str, Any] = {}
    if p is not None:
        # llama-server's shape: the context one slot may fill, and the sampling defaults under ``params``
        sampling = {"temperature": p.temperature, "top_k": p.top_k, "top_p": p.top_p, "min_p": p.min_p,
                    "repeat_penalty": p.repeat_penalty, "repeat_last_n": p.repeat_last_n, "seed": p.seed,
                    "n_predict": p.n_predict, "cache_prompt": p.cache_prompt}
        settings = {"n_ctx": m.n_ctx_slot if m else p.n_ctx, **sampling, "params": sampling}
    gen = ctx.core.gen
    template = gen.model.chat_template.decode("utf-8", "replace") if gen is not None and gen.model.chat_template else ""
    return JSONResponse({"default_generation_settings": settings, "total_slots": snap.slots_total,
                         "model_path": m.path if m else None, "model_alias": m.id if m else None,
                         "chat_template": template, "modalities": {"vision": False, "audio": False},
                         "build_info": f"hydra {__version__}", "is_sleeping": ctx.core.asleep is not None})
