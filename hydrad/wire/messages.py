"""Typed bus messages and their multipart frames: ``[PROTOCOL, KIND, JSON body]``, or, for a
request's stream messages (TOKENS, DONE, ERROR) queued in one pass of the engine's event loop,
several of them behind one protocol frame: ``[PROTOCOL, KIND, BODY, KIND, BODY, ...]`` (a batch:
one send and one receive a step instead of one per request).

Both ends import this module and nothing else of each other. Decoding is the one place
bytes from the network become objects, so it follows the sans-IO rule: either it returns a
message or it raises ``BusDecodeError`` — never anything else, whatever the frames hold
(the unit tests feed it arbitrary frames to hold it to that). The ROUTER's identity frame is
not part of a message: the coordinator strips it before decoding and checks it against the
name the message claims.

The protocol frame lets either end tell a peer of another version (or a stray client) from a
broken message and log it as such; a change of wire shape bumps it.
"""

from __future__ import annotations

import asyncio
import math
import re
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator

from hydrad.common import templatekwargs
from hydrad.common.netaccess import split_endpoint
from hydrad.wire import events
from hydrad.wire import logprobs as lp
from hydrad.wire.busparts import Alternative as Alternative, FetchStatus as FetchStatus, Image, TokenLogprob, ToolCall  # re-exported: M.Alternative
from hydrad.wire.busparts import EngineStatus as EngineStatus, UsageInfo as UsageInfo  # re-exported: M.EngineStatus
from hydrad.wire.images import MAX_IMAGES
from hydrad.wire.gpuinfo import GpuInfo
from hydrad.wire.requests import MAX_LORA_ENTRIES, GenRequest, InfillParts, LoraScale, SamplingOverrides
from hydrad.wire.tools import ToolSpec

PROTOCOL = b"hydra-bus/2"  # 2: stream messages may travel in batches
NAME_PATTERN = r"^[A-Za-z0-9_.-]{1,64}$"  # an engine name is its DEALER identity and its systemd instance
REQ_PATTERN = r"^[A-Za-z0-9_.:-]{1,80}$"
MAX_BODY = 16 << 20  # the largest body either end accepts; a sender checks it before sending (see fits)


class BusDecodeError(Exception):
    """Frames that are not a message of this protocol; ``reason`` says what was wrong."""

    def __init__(self, reason: str, kind: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.kind = kind


class _Msg(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    KIND: ClassVar[bytes]


# ----- shared parts ----------------------------------------------------------------------


# A GENERATE's sampling fields are the request's own dataclass (pydantic validates a dataclass
# field by its annotations), so the bus and the engine never keep two copies of the field list.
Sampling = SamplingOverrides


# ----- engine → coordinator --------------------------------------------------------------


class Register(_Msg):
    """First message of a connection (and after the coordinator asks again): who and what I am."""

    KIND = b"REGISTER"
    engine: str = Field(pattern=NAME_PATTERN)
    instance: str = Field(max_length=64, description="'<process>.<connection>': random per process start, then the "
                                                      "connection count, so a restart, a reconnect and a repeat differ.")
    version: str = Field(max_length=64)
    pid: int = Field(0, ge=0)
    gpu: GpuInfo = Field(default_factory=GpuInfo)
    http: str | None = Field(None, max_length=300, description="host:port of the engine's own OpenAI/control API.")
    rpc: str | None = Field(None, max_length=300, description="host:port of the merged RPC port, when open.")
    models_on_disk: list[str] = Field(default_factory=list, max_length=4096)
    models_fetchable: list[str] = Field(default_factory=list, max_length=4096, description=(
        "Registry models whose file is not on this engine's disk but that it would fetch from the pool "
        "before loading (fetch.enabled, an entry with size_bytes and sha256); empty when it fetches nothing."))
    host_weights: dict[Annotated[str, StringConstraints(max_length=512)], Annotated[int, Field(ge=0)]] = Field(
        default_factory=dict, max_length=4096,
        description="Per model on disk: bytes of its weights a load on this engine keeps in host memory instead of "
                    "VRAM, by the engine's parameters for that model (llama.cpp keeps the token embeddings on the "
                    "CPU; n_cpu_moe and override_tensors to CPU keep experts there). Routing counts only the rest "
                    "against the GPU. A model left out: nothing known. An engine without a GPU sends none; an older "
                    "engine's REGISTER without it decodes.")
    heartbeat_interval_s: float = Field(1.0, gt=0, le=3600)
    status: EngineStatus = Field(default_factory=EngineStatus)
    device: str | None = Field(None, max_length=128, description="The GPU(s) the engine is bound to (its start-only "
                                                                 "`device` setting, or the visibility variable in its "
                                                                 "environment): \"0\", \"0,1\", a GPU UUID; absent = "
                                                                 "every GPU of its host. Optional, so either end may be "
                                                                 "older (an unset field is not sent).")
    token: str | None = Field(None, max_length=256, description="The pool's shared bus token (from the engine's "
                                                                 "bus.token_file); a coordinator with a token refuses "
                                                                 "a REGISTER without the same one.")


class Heartbeat(_Msg):
    KIND = b"HEARTBEAT"
    status: EngineStatus


class Goodbye(_Msg):
    """An engine leaving on purpose (SIGTERM): mark it down now instead of after 3 intervals."""

    KIND = b"GOODBYE"
    reason: str = Field("", max_length=512)


class Tokens(_Msg):
    """Text generated since the last TOKENS of a request: one message per engine step, not per token."""

    KIND = b"TOKENS"
    req: str = Field(pattern=REQ_PATTERN)
    texts: list[str] = Field(min_length=1)
    logprobs: list[TokenLogprob] | None = Field(None, max_length=65536, description=(
        "The log-probabilities of the tokens these texts were made of, when the GENERATE asked for them; "
        "absent otherwise."))
    tool_calls: list[ToolCall] | None = Field(None, max_length=4096, description=(
        "Tool calls completed in this step, when the GENERATE offered tools (the texts are then content "
        "only); absent otherwise."))
    ids: list[Annotated[int, Field(ge=0, le=2**31 - 1)]] | None = Field(None, max_length=65536, description=(
        "The token ids these texts were made of, when the GENERATE asked (return_tokens); absent otherwise."))
    reasoning: list[str] | None = Field(None, description=(
        "The model's thinking made in this step (a chat whose reasoning format splits it off), before the "
        "texts; absent when there is none."))
    usage: UsageInfo | None = Field(None, description="The request's timings so far (timings_per_token).")

    def event(self) -> events.Token:
        """This step as the one event stream's Token (its texts joined)."""
        return events.Token("".join(self.texts), tuple(self.ids or ()),
                            tuple(p.token() for p in self.logprobs or ()), tuple(c.call() for c in self.tool_calls or ()),
                            "".join(self.reasoning or ()), None if self.usage is None else self.usage.usage())


class Progress(_Msg):
    """How far a request's prompt prefill has got (when its GENERATE asked: return_progress)."""

    KIND = b"PROGRESS"
    req: str = Field(pattern=REQ_PATTERN)
    total: int = Field(ge=0)
    cache: int = Field(ge=0)
    processed: int = Field(ge=0)
    time_ms: int = Field(ge=0)
    slot: int = Field(ge=0)

    def event(self) -> events.Progress:
        return events.Progress(self.total, self.cache, self.processed, self.time_ms, self.slot)


class Done(_Msg):
    KIND = b"DONE"
    req: str = Field(pattern=REQ_PATTERN)
    finish_reason: str = Field(max_length=32)
    usage: UsageInfo
    fingerprint: str = Field("", max_length=128)
    model: str = Field("", max_length=512)
    slot: int | None = Field(None, ge=0, description="The slot whose KV now holds this turn (for the session "
                                                     "keeper's STATE_GET); absent from older engines.")
    kv_tokens: int = Field(0, ge=0, description="How many tokens that slot's KV holds after the turn.")
    kv_hash: str = Field("", max_length=32, description="hydrad.wire.kvdigest of those tokens.")
    stop_word: str | None = Field(None, max_length=8192, description="The stop string that ended the generation, "
                                                                      "if one did (Anthropic's stop_sequence).")
    ids: list[Annotated[int, Field(ge=0, le=2**31 - 1)]] | None = Field(None, max_length=65536, description=(
        "Generated token ids no TOKENS carried yet (return_tokens); absent otherwise."))
    settings: dict[str, Any] | None = Field(None, description=(
        "The engine's values the request ran with, when the GENERATE asked (report_settings)."))
    truncated: bool = Field(False, description="The context filled, as llama-server's truncated: it was shifted to "
                                                "go on (ctx_shift), or the generation ended there.")

    _finite = field_validator("settings")(classmethod(lambda cls, v: v if v is None else only_finite(v)))

    @classmethod
    def of(cls, req: str, done: events.Done) -> Done:
        return cls(req=req, finish_reason=done.finish_reason, model=done.model, fingerprint=done.fingerprint,
                   slot=done.slot, kv_tokens=done.kv_tokens, kv_hash=done.kv_hash, stop_word=done.stop_word,
                   ids=list(done.ids) or None, settings=dict(done.settings) if done.settings is not None else None,
                   truncated=done.truncated, usage=UsageInfo.of(done.usage))

    def event(self) -> events.Done:
        return events.Done(self.finish_reason, self.usage.usage(), self.fingerprint, self.model, self.slot,
                           self.kv_tokens, self.kv_hash, self.stop_word, tuple(self.ids or ()), self.settings, self.truncated)


class Error(_Msg):
    """A request that ended without DONE. ``engine_failed``: the engine, not the request, is at fault."""

    KIND = b"ERROR"
    req: str = Field(pattern=REQ_PATTERN)
    message: str = Field(max_length=8192)
    status: int = Field(500, ge=100, le=599)
    code: str = Field("engine_error", max_length=64)
    engine_failed: bool = False
    n_prompt_tokens: int | None = Field(None, ge=0, description="A prompt longer than the context: its tokens "
                                                                "(llama-server's error field).")
    n_ctx: int | None = Field(None, ge=0, description="... and the context it did not fit.")
    param: str | None = Field(None, max_length=64, description="The request field at fault, when one is.")

    @classmethod
    def of(cls, req: str, failed: events.Failed) -> Error:
        return cls(req=req, message=failed.message[:8192], status=min(599, max(100, failed.status)),
                   code=failed.code[:64], engine_failed=failed.engine_failed,
                   n_prompt_tokens=failed.n_prompt_tokens, n_ctx=failed.n_ctx,
                   param=failed.param[:64] if failed.param else None)

    def event(self) -> events.Failed:
        return events.Failed(self.message, self.engine_failed, self.status, self.code, self.n_prompt_tokens, self.n_ctx,
                             self.param)


def only_finite(v: dict[str, Any]) -> dict[str, Any]:
    """Free-form values too: JSON has no Infinity or NaN (1e999 and NaN parse as such), and a message
    that cannot be encoded again must not be taken in."""
    stack: list[Any] = [v]
    while stack:
        item = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            raise ValueError("a number that is not finite")
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return v


class ConfigureReply(_Msg):
    """The answer to CONFIGURE, sent once the engine accepted or refused it (a T3 load is still running)."""

    KIND = b"CONFIGURED"
    req: str = Field(pattern=REQ_PATTERN)
    ok: bool
    result: dict[str, Any] = Field(default_factory=dict, description="ConfigureResult.public() when ok.")
    status: int = Field(200, ge=100, le=599)
    code: str | None = Field(None, max_length=64)
    message: str | None = Field(None, max_length=8192)

    _finite = field_validator("result")(classmethod(lambda cls, v: only_finite(v)))


class LoadDone(_Msg):
    """A model load that a CONFIGURE started has ended (done, failed, or aborted by a later configure)."""

    KIND = b"LOADED"
    req: str = Field(pattern=REQ_PATTERN)
    load_id: int = Field(ge=0)
    phase: Literal["done", "failed", "aborted"]
    model: str = Field("", max_length=512)
    seconds: float | None = None
    error: str | None = Field(None, max_length=8192)


# ----- coordinator → engine --------------------------------------------------------------


class Welcome(_Msg):
    """The coordinator admitted a REGISTER; until then an engine keeps registering instead of beating."""

    KIND = b"WELCOME"
    coordinator: str = Field(max_length=64)
    version: str = Field(max_length=64)


class StreamOffer(_Msg):
    """The coordinator's request stream (hydrad/coordinator/reqstream.py), offered right after WELCOME
    when it has one. A kind of its own rather than a member of WELCOME: an engine of an earlier release
    drops a kind it does not know (one warning) and stays on the bus, while a WELCOME with a member it
    does not know would fail its decoding, and such an engine would never count itself admitted."""

    KIND = b"STREAM"
    endpoint: str = Field(max_length=300, description="host:port of the request stream")

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, v: str) -> str:
        split_endpoint(v)  # an offer the engine could not connect to is dropped as malformed, here
        return v


class FilesOffer(_Msg):
    """Sent after WELCOME when the coordinator serves the registry's model files (``GET /models/files/<name>``
    on ``port``): an engine fetches a model it lacks from ``http://<bus host>:<port>`` unless ``fetch.url``
    says otherwise. A kind of its own for the reason StreamOffer is one."""

    KIND = b"FILES"
    port: int = Field(ge=1, le=65535, description="The coordinator's HTTP port.")


class Refused(_Msg):
    """The coordinator does not admit this REGISTER (no token, or the wrong one). The engine gets
    no traffic; it logs ``reason`` and keeps trying at its reconnect backoff, so fixing the token
    file on either side heals the pool without a restart of the other."""

    KIND = b"REFUSED"
    reason: str = Field("", max_length=512)


class Ping(_Msg):
    """The coordinator's side of the heartbeat: an engine hearing nothing for 3 intervals reconnects."""

    KIND = b"PING"


class Reregister(_Msg):
    """The coordinator does not know (or no longer admits) this engine: send REGISTER again."""

    KIND = b"REREGISTER"
    reason: str = Field("", max_length=512)


class Generate(_Msg):
    KIND = b"GENERATE"
    req: str = Field(pattern=REQ_PATTERN)
    model: str | None = Field(None, max_length=512, description="What the router chose this engine for; checked by the engine.")
    prompt: str | None = None
    messages: list[dict[str, str]] | None = None
    images: list[Image] | None = Field(None, min_length=1, max_length=MAX_IMAGES, description=(
        "Image files (base64), one for each media marker of the prompt or messages, in order; absent: none. "
        "An engine of an earlier release refuses a GENERATE that carries it."))
    tools: ToolSpec | None = Field(None, description="Functions the model may call (chat only); absent: none.")
    max_tokens: int | None = Field(None, ge=0)
    stop: list[str] = Field(default_factory=list, max_length=16)
    sampling: Sampling = Field(default_factory=Sampling)
    ignore_eos: bool = False
    slot: int | None = Field(None, ge=0)
    logprobs: int | None = Field(None, ge=0, le=lp.MAX_N_PROBS, description=(
        "Report each token's log-probability and this many most likely tokens in TOKENS; absent: none."))
    post_sampling_probs: bool = Field(False, description="Those as probabilities after the sampler chain.")
    timings_per_token: bool = Field(False, description="Each TOKENS carries the request's timings so far.")
    cache_prompt: bool | None = Field(None, description=(
        "Reuse a slot's matching prompt prefix (llama-server's cache_prompt); absent: the engine's default. "
        "Sent only when set, so an engine of an earlier release still takes the message."))
    n_keep: int | None = Field(None, ge=-1, le=2**31 - 1, description=(
        "Prompt tokens a context shift keeps (-1: all); absent: the engine's default."))
    n_cache_reuse: int | None = Field(None, ge=0, le=2**31 - 1, description=(
        "Smallest chunk of a slot's cached prompt reused by shifting its KV; absent: the engine's default."))
    client: str | None = Field(None, max_length=64, description=(
        "Who sent the request to the front door (its address): the engine lets "
        "clients take turns for free slots. Absent: one client. An engine of an earlier release refuses a "
        "GENERATE that carries it: upgrade the engines before the coordinator."))
    prompt_ids: list[Annotated[int, Field(ge=0, le=2**31 - 1)]] | None = Field(None, min_length=1, description=(
        "The prompt as token ids, used as given (llama-server's /completion); absent: prompt or messages."))
    infill: InfillParts | None = Field(None, description=(
        "An /infill request's parts: the engine builds the prompt with its model's fill-in-the-middle tokens."))
    cache_ns: str = Field("", max_length=64, pattern=r"^[0-9a-f]*$", description=(
        "The namespace of the request's prompt cache (its tenant and cache_salt, hashed): KV computed "
        "in another namespace is never reused for it. Empty: the shared one."))
    store_quota: int = Field(0, ge=0, le=1 << 44, description=(
        "Bytes of the KV Store the request's tenant may hold (its keys-file store_quota_mib): what the "
        "request puts in the Store evicts the tenant's own oldest objects beyond it. 0: no quota."))
    return_tokens: bool = Field(False, description="TOKENS and DONE carry the generated token ids.")
    return_progress: bool = Field(False, description="PROGRESS messages while the prompt is prefilled.")
    report_settings: bool = Field(False, description="DONE carries the engine's values the request ran with.")
    reasoning_format: Literal["none", "deepseek", "deepseek-legacy"] | None = Field(None, description=(
        "Where a chat's thinking goes (hydrad.wire.reasoning); absent: the engine's default."))
    reasoning_budget: int | None = Field(None, ge=0, le=2**31 - 1, description=(
        "Tokens a chat may think for (0: none); absent: the engine's default."))
    chat_template_kwargs: dict[str, Any] | None = Field(None, description=(
        "Extra variables for the jinja chat template (hydrad.common.templatekwargs); absent: none."))
    lora: list[LoraScale] | None = Field(None, max_length=MAX_LORA_ENTRIES, description=(
        "LoRA scales by adapter id (the adapters not named at 0); absent: the engine's scales. An engine of "
        "an earlier release refuses a GENERATE that carries it."))

    _kwargs = field_validator("chat_template_kwargs")(
        classmethod(lambda cls, v: v if v is None else templatekwargs.check(v)))

    @classmethod
    def from_request(cls, req: str, gen: GenRequest, model: str | None) -> Generate:
        return cls(req=req, model=model, prompt=gen.prompt, messages=gen.messages, images=gen.images, tools=gen.tools,
                   max_tokens=gen.max_tokens,
                   stop=list(gen.stop), ignore_eos=gen.ignore_eos, slot=gen.slot,
                   sampling=gen.sampling, logprobs=gen.logprobs, cache_prompt=gen.cache_prompt,
                   post_sampling_probs=gen.post_sampling_probs, timings_per_token=gen.timings_per_token,
                   n_keep=gen.n_keep, n_cache_reuse=gen.n_cache_reuse,
                   client=gen.client[:64] or None, prompt_ids=gen.prompt_ids, infill=gen.infill,
                   return_tokens=gen.return_tokens, return_progress=gen.return_progress,
                   report_settings=gen.report_settings, cache_ns=gen.cache_ns, store_quota=gen.store_quota,
                   reasoning_format=gen.reasoning_format, reasoning_budget=gen.reasoning_budget,  # type: ignore[arg-type]
                   chat_template_kwargs=gen.chat_template_kwargs, lora=gen.lora or None)

    def to_request(self) -> GenRequest:
        return GenRequest(prompt=self.prompt, messages=self.messages, images=self.images, tools=self.tools,
                          max_tokens=self.max_tokens,
                          stop=list(self.stop),
                          sampling=self.sampling, ignore_eos=self.ignore_eos,
                          slot=self.slot, logprobs=self.logprobs, cache_prompt=self.cache_prompt,
                          post_sampling_probs=self.post_sampling_probs, timings_per_token=self.timings_per_token,
                          n_keep=self.n_keep, n_cache_reuse=self.n_cache_reuse,
                          client="bus:" + self.client if self.client else "", prompt_ids=self.prompt_ids,
                          infill=self.infill, return_tokens=self.return_tokens, return_progress=self.return_progress,
                          report_settings=self.report_settings, cache_ns=self.cache_ns,
                          store_quota=self.store_quota, pool_pin=self.slot is not None, reasoning_format=self.reasoning_format,
                          reasoning_budget=self.reasoning_budget, chat_template_kwargs=self.chat_template_kwargs,
                          lora=self.lora)


class Cancel(_Msg):
    KIND = b"CANCEL"
    req: str = Field(pattern=REQ_PATTERN)


class Configure(_Msg):
    """Runtime parameters for the engine (the same payload as POST /control/configure)."""

    KIND = b"CONFIGURE"
    req: str = Field(pattern=REQ_PATTERN)
    payload: dict[str, Any]

    _finite = field_validator("payload")(classmethod(lambda cls, v: only_finite(v)))


Message = (Register | Heartbeat | Goodbye | Tokens | Progress | Done | Error | ConfigureReply | LoadDone
           | Welcome | StreamOffer | FilesOffer | Refused | Ping | Reregister | Generate | Cancel | Configure)

KINDS: dict[bytes, type[_Msg]] = {cls.KIND: cls for cls in (
    Register, Heartbeat, Goodbye, Tokens, Progress, Done, Error, ConfigureReply, LoadDone,
    Welcome, StreamOffer, FilesOffer, Refused, Ping, Reregister, Generate, Cancel, Configure)}

FROM_ENGINE = frozenset({Register, Heartbeat, Goodbye, Tokens, Progress, Done, Error, ConfigureReply, LoadDone})
BATCHABLE = frozenset({Tokens, Progress, Done, Error})  # the only kinds a batch may carry (see encode_batch)
MAX_BATCH = 4096  # messages in one batch: a receiver refuses more before decoding any
TO_ENGINE = frozenset({Welcome, StreamOffer, FilesOffer, Refused, Ping, Reregister, Generate, Cancel, Configure})


class BusEncodeError(ValueError):
    """A message that cannot be put on the wire: text JSON cannot carry (a lone surrogate), or a
    body larger than the other end accepts. Raised before anything is sent."""

    def __init__(self, reason: str, *, too_large: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.too_large = too_large


def encode(msg: _Msg) -> list[bytes]:
    """Frames of ``msg``; ``BusEncodeError`` when it cannot be encoded or its body exceeds MAX_BODY.

    Checking here, at the one place bytes are made, means a sender never puts a message on the
    wire that the receiver would refuse (or whose size would make ZeroMQ drop the connection).
    """
    try:
        body = msg.model_dump_json(exclude_defaults=True).encode()
    except Exception as exc:  # pydantic refuses strings JSON cannot carry, e.g. a lone surrogate
        raise BusEncodeError(f"{msg.KIND.decode()}: cannot encode the message: {str(exc)[:200]}") from None
    if len(body) > MAX_BODY:
        raise BusEncodeError(f"{msg.KIND.decode()}: body of {len(body)} bytes exceeds the bus limit of {MAX_BODY}",
                             too_large=True)
    return [PROTOCOL, msg.KIND, body]


def encode_batch(encoded: list[list[bytes]]) -> list[bytes]:
    """One batch of already encoded messages (each ``encode``'s frames), all of kinds in BATCHABLE;
    a single message stays as it is."""
    if len(encoded) == 1:
        return encoded[0]
    out = [PROTOCOL]
    for frames in encoded:
        out += frames[1:]
    return out


_GENERATE_HEAD = re.compile(rb'^\{"req":"([A-Za-z0-9_.:-]{1,80})"')


def generate_request_of(frames: list[bytes]) -> str | None:
    """The request id of a GENERATE that did not decode, when its body starts as the encoder writes one
    (``{"req":"...``), so the engine can fail that request at once instead of leaving the coordinator
    to wait for its first token; None for anything else."""
    if not isinstance(frames, (list, tuple)) or len(frames) != 3 or bytes(frames[1]) != Generate.KIND:
        return None
    m = _GENERATE_HEAD.match(bytes(frames[2][:128]))
    return m.group(1).decode() if m else None


def decode(frames: list[bytes]) -> Message:
    """Frames (without the ROUTER identity) → a message, or ``BusDecodeError``; nothing else escapes."""
    try:
        if not isinstance(frames, (list, tuple)) or len(frames) != 3:
            n = len(frames) if isinstance(frames, (list, tuple)) else "?"
            raise BusDecodeError(f"expected 3 frames (protocol, kind, body), got {n}")
        proto, kind, body = (bytes(f) for f in frames)
        _check_protocol(proto)
        return _decode_one(kind, body)
    except BusDecodeError:
        raise
    except Exception as exc:  # RecursionError, MemoryError on absurd input...: still a typed error
        raise BusDecodeError(f"undecodable message: {type(exc).__name__}") from None


DECODE_INLINE_BYTES = 64 << 10
"""Messages up to this size are decoded where they arrive; a larger one (a GENERATE of a long chat,
whose grammar is checked again as it is read) is decoded on a worker thread, so the loop that
carries heartbeats and other streams never waits for it."""


async def decode_aside(frames: list[bytes]) -> Message:
    """:func:`decode`, off the caller's event loop when the message is large. The caller awaits it,
    so messages still reach it in order."""
    if sum(len(f) for f in frames) <= DECODE_INLINE_BYTES:
        return decode(frames)
    return await asyncio.to_thread(decode, frames)


def decode_all(frames: list[bytes]) -> list[Message]:
    """Frames of a message or of a batch (see the module doc) → its messages, or ``BusDecodeError``
    for the whole: a batch holds only BATCHABLE kinds, at most MAX_BATCH of them."""
    try:
        if not isinstance(frames, (list, tuple)) or len(frames) < 3 or len(frames) % 2 == 0:
            n = len(frames) if isinstance(frames, (list, tuple)) else "?"
            raise BusDecodeError(f"expected the protocol frame and (kind, body) pairs, got {n} frames")
        if len(frames) == 3:
            return [decode(frames)]
        if (len(frames) - 1) // 2 > MAX_BATCH:
            raise BusDecodeError(f"a batch of {(len(frames) - 1) // 2} messages; at most {MAX_BATCH}")
        _check_protocol(bytes(frames[0]))
        out: list[Message] = []
        for i in range(1, len(frames), 2):
            kind = bytes(frames[i])
            cls = KINDS.get(kind)
            if cls is not None and cls not in BATCHABLE:
                raise BusDecodeError(f"a {kind.decode()} cannot travel in a batch", kind.decode())
            out.append(_decode_one(kind, bytes(frames[i + 1])))
        return out
    except BusDecodeError:
        raise
    except Exception as exc:
        raise BusDecodeError(f"undecodable message: {type(exc).__name__}") from None


def _check_protocol(proto: bytes) -> None:
    if proto != PROTOCOL:
        raise BusDecodeError(f"unknown protocol {proto[:32]!r} (this end speaks {PROTOCOL.decode()})")


def _decode_one(kind: bytes, body: bytes) -> Message:
    cls = KINDS.get(kind)
    if cls is None:
        raise BusDecodeError(f"unknown message kind {kind[:32]!r}")
    if len(body) > MAX_BODY:
        raise BusDecodeError(f"{kind.decode()}: body of {len(body)} bytes exceeds {MAX_BODY}", kind.decode())
    try:
        return cls.model_validate_json(body)  # type: ignore[return-value]
    except ValueError as exc:  # pydantic's ValidationError is a ValueError
        raise BusDecodeError(f"{kind.decode()}: {_first_error(exc)}", kind.decode()) from None


def _first_error(exc: Exception) -> str:
    errors = getattr(exc, "errors", None)
    if callable(errors):
        try:
            err = errors()[0]
            loc = ".".join(str(p) for p in err.get("loc", ())) or "(body)"
            return f"{loc}: {err.get('msg')}"[:300]
        except Exception:
            pass
    return str(exc)[:300]
