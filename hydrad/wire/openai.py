"""OpenAI wire format: request validation, response and SSE chunk shapes, error JSON.

Fields OpenAI defines but this engine cannot honour (n>1, audio, ...) are refused with a 400
naming them, so a client never silently gets something other than it asked for. Tool calls
(``tools``, ``tool_choice``, ``parallel_tool_calls``; chat only) are read by
:mod:`hydrad.wire.tools` and answered as ``message.tool_calls`` / ``delta.tool_calls``. ``logprobs``
(chat: ``logprobs`` and ``top_logprobs``; legacy completions: an integer ``logprobs``) is
honoured: the shapes are in :mod:`hydrad.wire.logprobs`. A chat's thinking is read as llama-server
reads it (``reasoning_format``, a reasoning budget, ``chat_template_kwargs``: :mod:`hydrad.wire.reasoning`)
and answered as ``reasoning_content``.
llama-server's extensions (top_k, min_p, repeat_penalty, n_predict, cache_prompt) are accepted,
and so is constrained output: ``grammar`` (GBNF), ``json_schema`` and OpenAI's JSON
``response_format`` become one checked GBNF grammar (``hydrad.wire.grammar``).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, ClassVar, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, ValidationError, field_validator

from hydrad.common import jsonbody, templatekwargs
from hydrad.common.paramcontract import request_reason
from hydrad.wire import logitbias
from hydrad.wire import logprobs as lp
from hydrad.wire import tools as tl
from hydrad.wire.grammar import GrammarError, check_gbnf, json_object_grammar, schema_grammar
from hydrad.wire.requests import GenRequest, SamplingOverrides
from hydrad.wire import images as img
from hydrad.wire.requests import MAX_LORA_ENTRIES, MAX_STOP_CHARS, MAX_STOPS, LoraScale
from hydrad.common.params import validation_message

INT32_MAX = 2**31 - 1
_T = TypeVar("_T")
MAX_MODEL_NAME = 256

# JSON schemas of what the parsers below check by hand, for /openapi.json (hydrad.common.openapi):
# each says what the parser requires and never more, so no accepted body falls outside it.
_STOP_SCHEMA = {"anyOf": [{"type": "string", "maxLength": MAX_STOP_CHARS},
                          {"type": "array", "items": {"type": "string", "maxLength": MAX_STOP_CHARS}},
                          {"type": "null"}]}
TEXT_PARTS_SCHEMA = {"type": "array", "items": {"anyOf": [
    {"type": "object", "required": ["type", "text"],
     "properties": {"type": {"const": "text"}, "text": {"type": "string"}}},
    {"type": "object", "required": ["type", "image_url"],
     "properties": {"type": {"const": "image_url"}, "image_url": {"anyOf": [
         {"type": "string"}, {"type": "object", "required": ["url"], "properties": {"url": {"type": "string"}}}]}}}]}}
CHAT_MESSAGES_SCHEMA = {"minItems": 1, "items": {
    "type": "object", "required": ["role"],
    "properties": {"role": {"enum": ["system", "user", "assistant", "developer", "tool"]},
                   "content": {"anyOf": [{"type": "string"}, {"type": "null"}, TEXT_PARTS_SCHEMA]}}}}
_CONSTRAINT_PROPERTIES = {
    "grammar": {"type": ["string", "null"]},
    "response_format": {"anyOf": [{"type": "null"}, {
        "type": "object", "required": ["type"],
        "properties": {"type": {"enum": ["text", "json_object", "json_schema"]}}}]},
}


class ApiError(Exception):
    """Rendered as ``{"error": {"message", "type", "code", "param"}}`` with an HTTP status.
    ``details`` are further members of ``error`` (llama-server's ``n_prompt_tokens`` and ``n_ctx``
    when a prompt does not fit the context)."""

    def __init__(self, status: int, message: str, code: str = "invalid_request_error",
                 param: str | None = None, headers: dict[str, str] | None = None,
                 details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.headers = headers or {}
        self.details = details or {}

    def body(self) -> dict[str, Any]:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        if self.status == 503:
            kind = "unavailable_error"
        elif self.code == "context_length_exceeded":  # llama-server's type, beside its n_prompt_tokens and n_ctx
            kind = "exceed_context_size_error"
        error = {"message": self.message, "type": kind, "code": self.code, "param": self.param}
        return {"error": {**error, **{k: v for k, v in self.details.items() if k not in error}}}


def too_many_pending(message: str) -> ApiError:
    """A client past its share of the preparation workers (:mod:`hydrad.common.prepare`)."""
    return ApiError(429, message, "too_many_requests", headers={"Retry-After": "1"})


def overflow_details(n_prompt_tokens: int | None, n_ctx: int | None) -> dict[str, int]:
    """llama-server's numbers for a prompt longer than the context, as far as they are known."""
    return {k: v for k, v in (("n_prompt_tokens", n_prompt_tokens), ("n_ctx", n_ctx)) if v is not None}


def _constraint_properties(schema: dict[str, Any]) -> None:
    schema.setdefault("properties", {}).update(_CONSTRAINT_PROPERTIES)


MAX_CHOICES = 16
"""Most choices one request may ask for (``n``); an engine also refuses more than its slots."""


class _Common(BaseModel):
    # NaN and infinities are valid in Python's JSON but no sampling parameter means anything with them;
    # the constraint fields are read from the extras (_constraint) and described here for /openapi.json
    model_config = ConfigDict(extra="allow", allow_inf_nan=False, json_schema_extra=_constraint_properties)

    model: str | None = Field(None, min_length=1, max_length=MAX_MODEL_NAME, pattern=r"^[^\x00-\x1f\x7f]+$")
    max_tokens: int | None = Field(None, ge=0, le=INT32_MAX)
    n_predict: int | None = Field(None, ge=-1, le=INT32_MAX)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, ge=0, le=1)
    top_k: int | None = Field(None, ge=0, le=INT32_MAX)
    min_p: float | None = Field(None, ge=0, le=1)
    repeat_penalty: float | None = Field(None, gt=0, le=100)
    frequency_penalty: float = Field(0.0, ge=-2, le=2)
    presence_penalty: float = Field(0.0, ge=-2, le=2)
    seed: int | None = Field(None, ge=-(2**63), le=2**64 - 1)
    stop: str | list[str] | None = Field(None, json_schema_extra=_STOP_SCHEMA)
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    return_progress: StrictBool = Field(False, description="A stream's prompt_progress chunks {total, cache, processed, "
                                  "time_ms} while the prompt is prefilled (llama-server's); ignored without stream.")
    n: int = Field(1, ge=1, le=MAX_CHOICES, description=(
        "Choices to generate for the one prompt, each in a slot of its own (at most the engine's slots); "
        "the front door serves 1."))
    CHOICES: ClassVar[bool] = False
    """Whether this endpoint answers several choices (OpenAI's chat and completions do)."""
    user: str | None = Field(None, max_length=256)
    max_completion_tokens: int | None = Field(None, ge=0, le=INT32_MAX)
    id_slot: int | None = Field(None, ge=-1, le=INT32_MAX,
                                description="Pin the request to a slot (llama-server's id_slot); -1 = any.")
    ignore_eos: bool = False
    cache_prompt: bool | None = Field(None, description="Reuse the slot's matching prompt prefix (llama-server's "
                                                        "cache_prompt); unset: the engine's default.")
    cache_salt: str | None = Field(None, min_length=1, max_length=256, description=(
        "Requests share cached prompt prefixes only with requests of the same API key and the same salt "
        "(vLLM's cache_salt)."))
    lora: list[LoraScale] | None = Field(None, max_length=MAX_LORA_ENTRIES, description=(
        "LoRA adapters for this request, as llama-server takes them: [{\"id\": 0, \"scale\": 0.5}], by the "
        "ids GET /lora-adapters lists; the adapters not named run at 0. Unset or empty: the engine's scales."))
    timings_per_token: StrictBool = Field(False, description=(
        "llama-server's: every streamed chunk carries the timings so far, not only the last one."))
    logit_bias: Any = Field(None, description=(
        "Biases added to tokens' logits: OpenAI's object of token ids, llama-server's object whose "
        "non-integer keys are texts, or its list of [token id or text, bias] pairs; false bans a token. "
        "A text biases every token it is split into."))

    @field_validator("logit_bias")
    @classmethod
    def _logit_bias(cls, v: Any) -> list[tuple[int | str, float | None]] | None:
        try:
            entries = logitbias.parse(v)
        except logitbias.LogitBiasError as exc:
            raise ValueError(str(exc)) from None
        return None if entries is None else [tuple(e) for e in entries]  # type: ignore[misc]

    @field_validator("stop")
    @classmethod
    def _stop(cls, v: str | list[str] | None) -> str | list[str] | None:
        check_stops([v] if isinstance(v, str) else [s for s in v or [] if s])
        return v

    def stops(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else [s for s in self.stop if s]

    def sampling(self) -> SamplingOverrides:
        return SamplingOverrides(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p, min_p=self.min_p,
                                 repeat_penalty=self.repeat_penalty, frequency_penalty=self.frequency_penalty,
                                 presence_penalty=self.presence_penalty, seed=self.seed,
                                 logit_bias=self.logit_bias)

    def limit(self) -> int | None:
        if self.max_tokens is not None:
            return self.max_tokens
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens
        if self.n_predict is not None and self.n_predict >= 0:
            return self.n_predict
        return None

    def slot(self) -> int | None:
        return None if self.id_slot is None or self.id_slot < 0 else self.id_slot

    def include_usage(self) -> bool:
        return bool((self.stream_options or {}).get("include_usage"))

    OTHER_DOORS_FIELDS: ClassVar[dict[str, tuple[Any, ...]]] = {}
    """Fields another endpoint honours and this one does not (each endpoint reads its own
    log-probability fields): refused by name unless neutral."""

    def wants_logprobs(self) -> int | None:
        """How many most likely tokens to report per generated token; None when the request asks
        for no log-probabilities at all (each endpoint reads its own fields)."""
        return None


# Defined by OpenAI, not served here: refused when set to anything but their neutral value.
_UNSUPPORTED: dict[str, Any] = {
    "functions": (None, []), "function_call": (None, "none"), "best_of": (None, 1),
    "echo": (None, False), "suffix": (None, ""), "audio": (None,),
    "modalities": (None, ["text"]), "prediction": (None,),
    # llama-server's own, not honoured here (yet): lazy grammars and samplers beyond the engine's
    # chain. Each is refused by name when set to anything but its llama-server default, so a client
    # asking for, say, a lazy grammar never gets unconstrained text with a 200.
    "grammar_lazy": (None, False), "grammar_triggers": (None, []),
    "preserved_tokens": (None, []),
    "mirostat": (None, 0), "typical_p": (None, 1, 1.0), "top_n_sigma": (None, -1, -1.0),
    "xtc_probability": (None, 0, 0.0), "dry_multiplier": (None, 0, 0.0), "dynatemp_range": (None, 0, 0.0),
    "repeat_last_n": (None, 64), "penalty_last_n": (None, 64), "samplers": (None,),
    "reasoning_budget_message": (None, ""), "reasoning_control": (None, False),
    # the chat's end as the template renders it: always with the generation prompt, never continuing
    # the last assistant message (no prefill)
    "add_generation_prompt": (None, True), "continue_final_message": (None, False),
}


def _refuse_unsupported(req: _Common) -> None:
    extra = req.model_extra or {}
    refused = {**_UNSUPPORTED, **req.OTHER_DOORS_FIELDS}
    bad = [k for k, neutral in refused.items() if k in extra and extra[k] not in neutral]
    if req.n != 1 and not req.CHOICES:
        bad.insert(0, "n")
    if bad:
        raise unsupported(bad)


def unsupported(bad: list[str]) -> ApiError:
    """The 400 for request fields this engine does not honour: each named, with the parameter
    contract's reason where it has one (hydrad.common.paramcontract); ``param`` is the first."""
    parts = [f"{k} ({why})" if (why := request_reason(k)) else k for k in bad]
    return ApiError(400, f"unsupported field(s) for this engine: {', '.join(parts)}", "unsupported_field", bad[0])


# The fields that ask for constrained output, with the values that ask for nothing.
_CONSTRAINTS: dict[str, tuple[Any, ...]] = {
    "grammar": (None, ""), "json_schema": (None, {}), "response_format": (None, {"type": "text"}),
}


def _checked(field: str, make: Callable[[], _T]) -> _T:
    """Runs a grammar step, answering its GrammarError as a 400 naming the request's field."""
    try:
        return make()
    except GrammarError as exc:
        raise ApiError(400, f"{field}: {exc}", "invalid_field", field) from None


def _gbnf(value: Any) -> str:
    if not isinstance(value, str):
        raise ApiError(400, "grammar must be a string of GBNF", "invalid_field", "grammar")
    _checked("grammar", lambda: check_gbnf(value))
    return value


def _response_format_grammar(rf: Any) -> str | None:
    """OpenAI's ``response_format`` as llama-server reads it: ``json_object`` (optionally with
    llama-server's ``schema``) or ``json_schema`` with its ``json_schema.schema`` (absent: any JSON)."""
    kind = rf.get("type") if isinstance(rf, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        schema = rf.get("schema")
        return _checked("response_format", json_object_grammar if schema is None else lambda: schema_grammar(schema))
    if kind == "json_schema":
        wrapper = rf.get("json_schema")
        if not isinstance(wrapper, dict):
            raise ApiError(400, "response_format.json_schema must be an object holding a schema", "invalid_field",
                           "response_format")
        schema = wrapper.get("schema", {})
        return _checked("response_format", lambda: schema_grammar(schema))
    raise ApiError(400, 'response_format must be an object whose type is "text", "json_object" or "json_schema"',
                   "invalid_field", "response_format")


def _constraint(req: _Common) -> str | None:
    """The one GBNF grammar a request asks for, or None for free text. llama-server refuses a
    grammar and a schema together; so does this, for any two of the three fields."""
    extra = req.model_extra or {}
    asked = [k for k, neutral in _CONSTRAINTS.items() if k in extra and extra[k] not in neutral]
    if len(asked) > 1:
        raise ApiError(400, f"set only one of grammar, json_schema and response_format (got {', '.join(asked)})",
                       "invalid_field", asked[1])
    if not asked:
        return None
    if asked[0] == "grammar":
        return _gbnf(extra["grammar"])
    if asked[0] == "json_schema":
        return _checked("json_schema", lambda: schema_grammar(extra["json_schema"]))
    return _response_format_grammar(extra["response_format"])


def checked_sampling(req: _Common) -> SamplingOverrides:
    """A validated request's sampling, once every field it cannot honour is refused by name and its
    constraint fields are one checked grammar (shared with llama-server's native /completion)."""
    _refuse_unsupported(req)
    return dataclasses.replace(req.sampling(), grammar=_constraint(req))


POST_SAMPLING_DESCRIPTION = (
    "llama-server's: the log-probability fields report each token's probability after the sampler chain "
    "(top-k, top-p, min-p, temperature), as prob and top_probs.")

BUDGET_FIELDS = ("reasoning_budget_tokens", "thinking_budget_tokens", "reasoning_budget")
"""The names a chat's reasoning budget is given by: llama-server's two (read in this order) and the
engine parameter's own."""


class ChatRequest(_Common):
    CHOICES = True
    OTHER_DOORS_FIELDS = {"n_probs": (None, 0)}
    TOOL_FIELDS: ClassVar[dict[str, tuple[Any, ...]]] = {
        "tools": (None, []), "tool_choice": (None, "none", "auto"), "parallel_tool_calls": (None, False, True)}
    """Read by :func:`tool_spec`; on the other doors they are refused like any field not served."""
    REASONING_FIELDS: ClassVar[dict[str, tuple[Any, ...]]] = {
        "reasoning_format": (None, "none", "auto"), "chat_template_kwargs": (None, {}),
        **{name: (None, -1) for name in BUDGET_FIELDS}}
    """Chat only (a template and a think block are a chat's); refused elsewhere unless neutral."""
    messages: list[dict[str, Any]] = Field(json_schema_extra=CHAT_MESSAGES_SCHEMA)
    logprobs: StrictBool | None = None
    top_logprobs: StrictInt | None = Field(None, ge=0, le=lp.MAX_TOP_LOGPROBS)
    post_sampling_probs: StrictBool = Field(False, description=POST_SAMPLING_DESCRIPTION)
    reasoning_format: Literal["none", "deepseek", "deepseek-legacy", "auto"] | None = Field(None, description=(
        "Where the model's thinking goes (llama-server's): deepseek = reasoning_content, deepseek-legacy = "
        "reasoning_content and the tags kept in content, none = content; auto or unset: the engine's default."))
    chat_template_kwargs: dict[str, Any] | None = Field(None, description=(
        "Extra variables for the jinja chat template, e.g. {\"enable_thinking\": false}, over the engine's "
        "default_template_kwargs."))
    reasoning_budget_tokens: StrictInt | None = Field(None, ge=-1, le=INT32_MAX, description=(
        "Tokens the answer may think for: 0 = no thinking, -1 or unset = the engine's reasoning_budget."))
    thinking_budget_tokens: StrictInt | None = Field(None, ge=-1, le=INT32_MAX, description=(
        "The same as reasoning_budget_tokens (llama-server reads both)."))
    reasoning_budget: StrictInt | None = Field(None, ge=-1, le=INT32_MAX, description=(
        "The same as reasoning_budget_tokens, by the engine parameter's name."))

    @field_validator("chat_template_kwargs")
    @classmethod
    def _kwargs(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        return None if v is None else templatekwargs.check(v) or None

    def budget(self, grammar: str | None) -> int | None:
        """The reasoning budget asked for (None: the engine's); a 400 naming the field for two names
        given different values, or a positive budget under a grammar, which decides the whole answer
        (the end of the think block cannot be written into it)."""
        given = [(name, getattr(self, name)) for name in BUDGET_FIELDS if getattr(self, name) is not None]
        if any(v != given[0][1] for _, v in given):
            name = next(n for n, v in given if v != given[0][1])
            raise ApiError(400, f"{name} differs from {given[0][0]}: give the budget once", "invalid_field", name)
        if not given or given[0][1] == -1:
            return None
        name, budget = given[0]
        if budget > 0 and grammar is not None:
            raise ApiError(400, f"{name}: a positive reasoning budget cannot be combined with grammar, json_schema "
                           "or response_format (the grammar decides the whole answer, so the end of the think block "
                           "cannot be forced into it)", "invalid_field", name)
        return budget

    def wants_logprobs(self) -> int | None:
        """OpenAI's rule, as llama-server applies it: ``top_logprobs`` needs ``logprobs: true``."""
        if not self.logprobs:
            if self.top_logprobs:
                raise ApiError(400, "top_logprobs requires logprobs to be true", "invalid_field", "top_logprobs")
            return None
        return self.top_logprobs or 0


class CompletionRequest(_Common):
    CHOICES = True
    OTHER_DOORS_FIELDS = {"top_logprobs": (None, 0), "n_probs": (None, 0), "post_sampling_probs": (None, False),
                          **ChatRequest.TOOL_FIELDS, **ChatRequest.REASONING_FIELDS}
    prompt: str | list[str] = Field(json_schema_extra={"anyOf": [
        {"type": "string"}, {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 1}]})
    logprobs: StrictInt | None = Field(None, ge=0, le=lp.MAX_LEGACY_LOGPROBS)

    def wants_logprobs(self) -> int | None:
        return self.logprobs


def _text_of(content: Any, where: str, images: list[bytes] | None = None) -> str:
    """A message's content as text; each ``image_url`` part becomes the image marker and its bytes are
    appended to ``images`` (hydrad.wire.images bounds them); without ``images`` only text is taken."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for i, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind == "image_url" and images is not None:
                assert isinstance(part, dict)
                images.append(_image(part, f"{where}.content[{i}]", len(images)))
                parts.append(img.MARKER)
                continue
            if kind != "text" or not isinstance(part.get("text"), str):  # type: ignore[union-attr]
                raise ApiError(400, f"{where}.content[{i}]: only text and image_url parts are supported",
                               "unsupported_content", where)
            parts.append(part["text"])  # type: ignore[index]
        return "".join(parts)
    raise ApiError(400, f"{where}.content must be a string or a list of text and image_url parts", "invalid_content",
                   where)


def _image(part: dict[str, Any], where: str, before: int) -> bytes:
    """An image part's bytes (``before``: the request's images so far, bounded before this one is decoded)."""
    try:
        img.count_ok(before + 1, where)
        return img.openai_part(part, where)
    except img.ImageRefused as exc:
        raise ApiError(exc.status, str(exc), exc.code, exc.param) from None


def images_bounded(images: list[bytes], contents: list[str], param: str) -> list[bytes] | None:
    """A request's images, at most MAX_IMAGES, and each of its texts holding no marker besides its
    images' (``contents``: the texts with the images' markers in them); None for a request without."""
    if not images:
        return None
    try:
        img.count_ok(len(images), param)
    except img.ImageRefused as exc:
        raise ApiError(exc.status, str(exc), exc.code, exc.param) from None
    if sum(c.count(img.MARKER) for c in contents) != len(images):
        raise ApiError(400, f"{param}: text may not contain {img.MARKER}, which marks where an image goes",
                       "invalid_image", param)
    return images


def json_object(raw: bytes | dict[str, Any]) -> dict[str, Any]:
    """A request body as a JSON object (the doors' own JSON checks), else a 400 saying what is wrong.
    A body already read so (``jsonbody.loads_object``) is taken as it is: the front door reads a
    forwarded body once, to check it and to write it again."""
    if isinstance(raw, dict):
        return raw
    try:
        data = jsonbody.loads(raw)
    except jsonbody.BodyError as exc:
        raise ApiError(400, str(exc), exc.code, exc.param) from None
    if not isinstance(data, dict):
        raise ApiError(400, "request body must be a JSON object", "invalid_json")
    return data


def check_stops(stops: list[str]) -> None:
    """The bounds every door puts on stop strings (the engine matches each one as text arrives)."""
    if len(stops) > MAX_STOPS:
        raise ValueError(f"at most {MAX_STOPS} stop sequences")
    longest = max((len(s) for s in stops), default=0)
    if longest > MAX_STOP_CHARS:
        raise ValueError(f"a stop sequence may have at most {MAX_STOP_CHARS} characters (got {longest})")


def tool_spec(fields: dict[str, Any], grammar: str | None) -> tl.ToolSpec | None:
    """A chat request's tools (None: it offers none, or forbids calls); a 400 naming the field for
    a bad one. As llama-server, tools take no grammar, schema or JSON response format besides."""
    try:
        spec = tl.parse(fields)
    except tl.ToolError as exc:
        raise ApiError(400, str(exc), "invalid_field", exc.param) from None
    if spec is not None and grammar is not None:
        asked = next(k for k, neutral in _CONSTRAINTS.items() if fields.get(k) not in neutral)
        raise ApiError(400, f"{asked} cannot be combined with tools", "invalid_field", asked)
    return spec


def chat_messages(messages: list[Any], images: list[bytes] | None = None) -> list[dict[str, str]]:
    """A chat request's messages as they travel: role, text content, and the tool fields. With
    ``images``, image parts are taken (their bytes appended to it, a marker in the content)."""
    if not messages:
        raise ApiError(400, "messages must not be empty", "invalid_field", "messages")
    msgs = []
    for i, m in enumerate(messages):
        role = m.get("role") if isinstance(m, dict) else None
        if role not in ("system", "user", "assistant", "developer", "tool"):
            raise ApiError(400, f"messages[{i}].role must be system, user, assistant, developer or tool", "invalid_field",
                           f"messages[{i}].role")
        assert isinstance(m, dict)
        try:
            extra = tl.message_fields(m, role, f"messages[{i}]")
        except tl.ToolError as exc:
            raise ApiError(400, str(exc), "invalid_field", exc.param) from None
        msgs.append({"role": "system" if role == "developer" else role,
                     "content": _text_of(m.get("content"), f"messages[{i}]", images), **extra})
    if images:
        images_bounded(images, [m["content"] for m in msgs], "messages")
    return msgs


def parse(kind: Literal["chat", "completion"], raw: bytes) -> tuple[_Common, GenRequest]:
    return parse_object(kind, json_object(raw))


def parse_object(kind: Literal["chat", "completion"], data: dict[str, Any]) -> tuple[_Common, GenRequest]:
    """:func:`parse` of a body already read as JSON (another dialect's body translated into this one's)."""
    try:
        req: _Common = ChatRequest(**data) if kind == "chat" else CompletionRequest(**data)
    except ValidationError as exc:
        msg, names = validation_message(exc)
        raise ApiError(400, msg, "invalid_field", names[0] if names else None) from None
    sampling = checked_sampling(req)
    if isinstance(req, ChatRequest):
        tools = tool_spec(req.model_extra or {}, sampling.grammar)
        images: list[bytes] = []
        gen = GenRequest(messages=chat_messages(req.messages, images), images=images or None, tools=tools, max_tokens=req.limit(), stop=req.stops(),
                         sampling=sampling, ignore_eos=req.ignore_eos, slot=req.slot(), logprobs=req.wants_logprobs(),
                         cache_prompt=req.cache_prompt, cache_salt=req.cache_salt,
                         reasoning_format=None if req.reasoning_format in (None, "auto") else req.reasoning_format,
                         reasoning_budget=req.budget(sampling.grammar), chat_template_kwargs=req.chat_template_kwargs,
                         lora=req.lora, return_progress=req.stream and req.return_progress,
                         post_sampling_probs=req.post_sampling_probs,
                         timings_per_token=req.stream and req.timings_per_token)
    else:
        assert isinstance(req, CompletionRequest)
        prompt = req.prompt
        if isinstance(prompt, list):
            if len(prompt) != 1:
                raise ApiError(400, "prompt: one prompt per request (a list of several is not supported)", "unsupported_field", "prompt")
            prompt = prompt[0]
        gen = GenRequest(prompt=prompt, max_tokens=req.limit(), stop=req.stops(), sampling=sampling,
                         ignore_eos=req.ignore_eos, slot=req.slot(), logprobs=req.wants_logprobs(),
                         cache_prompt=req.cache_prompt, cache_salt=req.cache_salt, lora=req.lora,
                         return_progress=req.stream and req.return_progress,
                         timings_per_token=req.stream and req.timings_per_token)
    return req, gen
