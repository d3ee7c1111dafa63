"""A request made ready for a generation: its prompt tokens (a chat rendered by its template, an
/infill prompt built of the model's FIM tokens), its tools' grammar, the longest prefix the pool's
Store holds. :meth:`PromptPrep.prepare` does it on worker threads before the engine thread sees the
request (heavy requests only: a short prompt costs less than the hop), so none of it stalls the
streams being decoded; the engine thread redoes it only for a request whose generation changed
meanwhile. What the work finds wrong with the request is raised as :class:`RequestRefused`.
"""

from __future__ import annotations

import asyncio
from typing import Any

from hydrad.engine import adapters, chatprompt, fim, llama, vision
from hydrad.engine.generation import Generation
from hydrad.engine.requests import Failed
from hydrad.wire.grammar import GrammarError
from hydrad.wire.requests import GenRequest


PRETOKENIZE_CHARS = 32 << 10
"""Prompts longer than this are tokenized on a worker thread before they reach the engine
thread: tokenizing 50 MB on the engine thread stalled every stream for about 22 s."""

MAX_CHARS_PER_TOKEN = 64
"""A prompt with more characters than this times the context cannot fit (no tokenizer of the
supported families averages more than a few characters a token): refused before tokenizing."""
STEP_GAP_S = 0.05  # a step starting sooner than this after the last one counts its gap as between steps

PRETOKENIZE_MESSAGES = 64
"""Chats with more messages than this are prepared on a worker thread too, whatever their length:
40,000 empty messages held the engine thread for 77 s in the template and tokenizer."""


class RequestRefused(ValueError):
    """A request refused while it was prepared, before the engine thread saw it: its own fault
    (a template that will not render it, tools no grammar can hold, a prompt too long), answered
    by both planes as this status and code (and the field at fault, ``param``, when one is)."""

    def __init__(self, message: str, status: int = 400, code: str = "invalid_request",
                 n_prompt_tokens: int | None = None, n_ctx: int | None = None, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.n_prompt_tokens = n_prompt_tokens
        self.n_ctx = n_ctx
        self.param = param

    def failed(self) -> Failed:
        """The request's end event, when the engine thread finds the fault."""
        return Failed(str(self), status=self.status, code=self.code, n_prompt_tokens=self.n_prompt_tokens,
                      n_ctx=self.n_ctx, param=self.param)


class PromptTooLong(RequestRefused):
    """A prompt refused by its length before tokenizing (400 ``context_length_exceeded``).
    ``n_prompt_tokens`` is a lower bound (its characters / MAX_CHARS_PER_TOKEN, rounded up, so above
    the context), not a count."""

    def __init__(self, message: str, n_prompt_tokens: int, n_ctx: int) -> None:
        super().__init__(message, 400, "context_length_exceeded", n_prompt_tokens, n_ctx)


def _infill_tokens(gen: Generation, request: GenRequest, n_predict: int) -> list[int]:
    """An /infill request's prompt for ``gen``'s model: 501 for a model without FIM tokens (as
    llama-server), 400 for a token id outside its vocabulary."""
    parts = request.infill
    assert parts is not None
    lacks = fim.missing(gen.model)
    if lacks:
        raise RequestRefused("Infill is not supported by this model: it has no FIM " + ", ".join(lacks)
                           + " token (its vocabulary must define fill-in-the-middle tokens)", 501, "not_supported")
    n_vocab = gen.model.n_vocab
    for name, mixed in (("input_prefix", parts.prefix), ("input_suffix", parts.suffix)):
        bad = next((t for t in mixed if isinstance(t, int) and t >= n_vocab), None)
        if bad is not None:
            raise RequestRefused(f"{name}: token {bad} is not in this model's vocabulary (0..{n_vocab - 1})",
                               400, "invalid_field", param=name)
    return fim.prompt(gen.model, parts.prefix, parts.suffix, parts.extra, parts.middle, n_batch=gen.ctx.n_batch,
                      n_predict=n_predict, n_ctx=gen.ctx.n_ctx_seq)


class PromptPrep:
    """Prepares requests for ``core``'s serving generation (reads it; owns nothing)."""

    def __init__(self, core: Any) -> None:  # the EngineCore this is part of (it imports us)
        self.core = core

    async def prepare(self, request: GenRequest) -> None:
        """Work a request needs before the engine thread sees it, done off that thread: a prompt
        too long for the context by its length alone is refused (:class:`PromptTooLong`), and a
        large one, a chat of many messages or one offering tools is rendered, tokenized and given
        its tools' grammar on a worker thread, so it cannot stall the streams being decoded. What
        that work finds wrong with the request is raised as :class:`RequestRefused`."""
        gen = self.core.gen
        if gen is None or (request.tokens is not None and request.tokens_for == gen.id):
            return  # nothing to prepare for, or prepared for this generation already (a choice of several)
        try:  # a lora naming no adapter is refused here; the Store is looked up in the namespace of its scales
            _, owner = adapters.for_request(gen.adapters, request.lora, request.cache_ns)
        except adapters.AdapterRefused as exc:
            raise RequestRefused(str(exc), 400, "invalid_field", param="lora") from None
        # (an /infill request's parts are cut to fit the context as llama-server cuts them: not counted)
        chars = len(request.prompt or "") + sum(len(m.get("content") or "") for m in request.messages or ())
        limit = gen.ctx.n_ctx_seq
        if chars > limit * MAX_CHARS_PER_TOKEN:
            raise PromptTooLong(f"the prompt has {chars} characters, more than this engine's context of {limit} "
                                "tokens can hold", -(-chars // MAX_CHARS_PER_TOKEN), limit)
        ids = len(request.prompt_ids or ())
        if ids >= limit:
            raise PromptTooLong(f"the prompt has {ids} tokens; this engine's context holds {limit}", ids, limit)
        if request.images and gen.vision is None:
            raise RequestRefused("this model has no vision projector (mmproj): images are not accepted",
                                 400, "invalid_field", param=_image_field(request))
        # a prompt with images is never looked up in the Store: its image tokens name images, not KV it can trust
        from_store = self.core.prefix.wants_lookup(chars) and request.slot is None and not request.images
        params = self.core.params or gen.params
        heavy = (bool(request.images) or chars >= PRETOKENIZE_CHARS or len(request.messages or ()) > PRETOKENIZE_MESSAGES
                 or chatprompt.off_thread(gen.model, params.chat_template, request,
                                          chatprompt.template_kwargs(request, params))
                 or ids * 8 >= PRETOKENIZE_CHARS or request.infill is not None)
        if not heavy and not from_store:
            return
        try:
            if request.tools is None:
                tokens, grammar = await asyncio.to_thread(self.tokenize, gen, request), None
            else:  # both at once: the tokenizer runs without the interpreter lock while the grammar is made
                tokens, grammar = await asyncio.gather(asyncio.to_thread(self.tokenize, gen, request),
                                                       asyncio.to_thread(self.tool_grammar, gen, request))
        except RequestRefused:
            raise
        except Exception:  # noqa: BLE001 - not the request's fault (a retired model, ...): the engine
            # thread meets the same failure under its per-request guard and answers it
            return
        request.tokens, request.tokens_for = tokens, gen.id
        request.tool_grammar, request.grammar_for = grammar, gen.id
        if from_store:  # the longest prefix the pool's Store holds, read and verified here, not on the engine thread
            request.stored_prefix = await asyncio.to_thread(self.core.prefix.lookup, gen, tokens, owner)

    def tool_grammar(self, gen: Generation, request: GenRequest) -> str | None:
        if request.tools is None:
            return None
        if request.grammar_for == gen.id:
            return request.tool_grammar
        try:
            return chatprompt.grammar(gen.model, (self.core.params or gen.params).chat_template, request.tools)
        except GrammarError as exc:
            raise RequestRefused(f"tools: {exc}", 400, "invalid_field", param="tools") from None

    def tokenize(self, gen: Generation, request: GenRequest) -> list[int]:
        """A request's prompt tokens for ``gen`` (any thread: tokenizing only reads the vocabulary)."""
        params = self.core.params or gen.params
        if request.prompt_ids is not None:
            n_vocab = gen.model.n_vocab
            bad = next((t for t in request.prompt_ids if not 0 <= t < n_vocab), None)
            if bad is not None:
                raise RequestRefused(f"prompt: token {bad} is not in this model's vocabulary (0..{n_vocab - 1})",
                               400, "invalid_field", param="prompt")
            return list(request.prompt_ids)
        limit = gen.ctx.n_ctx_seq
        if request.images:
            return self.media(gen, request).tokens
        if request.infill is not None:
            return _infill_tokens(gen, request, params.n_predict)
        if request.messages is not None:
            try:
                tokens = chatprompt.chat_tokens(gen.model, params.chat_template, request,
                                                max_chars=limit * MAX_CHARS_PER_TOKEN,
                                                kwargs=chatprompt.template_kwargs(request, params))
            except llama.PromptTextTooLong as exc:
                raise RequestRefused(f"the chat's prompt has {exc.chars} characters, more than this engine's context "
                                   f"of {limit} tokens can hold", 400, "context_length_exceeded",
                                   -(-exc.chars // MAX_CHARS_PER_TOKEN), limit) from None
            except ValueError as exc:
                raise RequestRefused(str(exc), 400, "template_error", param=getattr(exc, "param", None)) from None
        else:
            tokens = gen.model.tokenize_prompt(request.prompt or "")
        bos = gen.bos
        if len(tokens) >= 2 and tokens[0] == tokens[1] == bos:
            tokens = tokens[1:]
        return tokens

    def media(self, gen: Generation, request: GenRequest) -> vision.MediaPrompt:
        """A prompt with images made into chunks by ``gen``'s projector (decoding and preprocessing each image):
        kept on the request as ``media`` for the engine thread, which evaluates its image chunks."""
        field = _image_field(request)
        if gen.vision is None:
            raise RequestRefused("this model has no vision projector (mmproj): images are not accepted",
                                 400, "invalid_field", param=field)
        params = self.core.params or gen.params
        limit = gen.ctx.n_ctx_seq
        if request.messages is not None:
            if any(gen.model.has_special_text(m.get("content") or "") for m in request.messages):
                raise RequestRefused("messages: a chat with images may not contain the model's special-token text",
                                     400, "invalid_field", param="messages")
            try:
                text = chatprompt.chat_text(gen.model, params.chat_template, request,
                                            chatprompt.template_kwargs(request, params))
            except ValueError as exc:
                raise RequestRefused(str(exc), 400, "template_error", param=getattr(exc, "param", None)) from None
        else:
            text = request.prompt or ""
        if len(text) > limit * MAX_CHARS_PER_TOKEN:
            raise PromptTooLong(f"the prompt has {len(text)} characters, more than this engine's context of {limit} "
                                "tokens can hold", -(-len(text) // MAX_CHARS_PER_TOKEN), limit)
        try:
            made = gen.vision.prompt(text, list(request.images or ()), field, gen.id)
        except vision.VisionRefused as exc:
            raise RequestRefused(f"{exc.param}: {exc}", 400, "invalid_image", param=exc.param) from None
        if len(made.tokens) >= 2 and made.tokens[0] == made.tokens[1] == gen.bos:
            made.drop_first()
        if len(made.tokens) >= limit:
            raise RequestRefused(f"the prompt has {len(made.tokens)} tokens with its images' "
                                 f"{made.n_image_tokens}; this engine's context holds {limit}", 400,
                                 "context_length_exceeded", n_prompt_tokens=len(made.tokens), n_ctx=limit)
        request.media = made
        return made


def _image_field(request: GenRequest) -> str:
    """The request field its images came in: a chat's messages, /completion's prompt.multimodal_data."""
    return "messages" if request.messages is not None else "prompt.multimodal_data"
