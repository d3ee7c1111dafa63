"""Parts of the bus's stream messages (hydrad.wire.messages): a token's log-probability with its
alternatives, and a tool call, as TOKENS carries them; each converts to and from the engine's own
type. Re-exported by hydrad.wire.messages, where the messages that carry them are; and a GENERATE's
images (:data:`Image`), as base64 text; a heartbeat's model file transfer (:class:`FetchStatus`);
what an engine reports of itself in every heartbeat (:class:`EngineStatus`) and a request's usage
(:class:`UsageInfo`)."""

from __future__ import annotations

import base64
import binascii
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PlainSerializer, StringConstraints

from hydrad.wire import events
from hydrad.wire import images as img
from hydrad.wire import logprobs as lp
from hydrad.wire import toolcalls
from hydrad.wire.tools import MAX_CALL_ID, NAME_RE


class Alternative(BaseModel):
    """A token and its log-probability (or, for a GENERATE that asked for post-sampling
    probabilities, its probability: from 0 to 1); its bytes in hex (a token can end inside a UTF-8
    character, which a JSON string cannot carry)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    id: int = Field(ge=0, le=2**31 - 1)
    piece: str = Field("", max_length=2048, pattern=r"^(?:[0-9a-f]{2})*$")
    logprob: float = Field(ge=lp.FLOOR, le=1)

    def alternative(self) -> lp.Alternative:
        return lp.Alternative(self.id, bytes.fromhex(self.piece), self.logprob)


class TokenLogprob(Alternative):
    """A generated token's log-probability and the most likely tokens at its position."""

    top: list[Alternative] = Field(default_factory=list, max_length=lp.MAX_N_PROBS)  # llama-server's n_probs reaches further than OpenAI's 20

    @classmethod
    def of(cls, tok: lp.TokenLogprob) -> TokenLogprob:
        return cls(id=tok.id, piece=tok.piece.hex(), logprob=tok.logprob,
                   top=[Alternative(id=a.id, piece=a.piece.hex(), logprob=a.logprob) for a in tok.top])

    def token(self) -> lp.TokenLogprob:
        return lp.TokenLogprob(self.id, bytes.fromhex(self.piece), self.logprob,
                               tuple(a.alternative() for a in self.top))


class ToolCall(BaseModel):
    """A tool call the engine read from the model's answer (:class:`hydrad.wire.toolcalls.ToolCall`)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    id: str = Field(min_length=1, max_length=MAX_CALL_ID)
    name: str = Field(pattern=NAME_RE.pattern.join("^$"))
    arguments: str

    @classmethod
    def of(cls, call: toolcalls.ToolCall) -> ToolCall:
        return cls(id=call.id, name=call.name, arguments=call.arguments)

    def call(self) -> toolcalls.ToolCall:
        return toolcalls.ToolCall(self.id, self.name, self.arguments)


def _image_of(value: Any) -> bytes:
    """A GENERATE's image: base64 text of at most the doors' length, decoded (bytes pass as they are)."""
    if isinstance(value, bytes):
        return value
    if not isinstance(value, str) or not value or len(value) > img.MAX_IMAGE_B64:
        raise ValueError(f"an image is base64 text of 1 to {img.MAX_IMAGE_B64} characters")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("an image must be valid base64") from None


Image = Annotated[bytes, BeforeValidator(_image_of),
                  PlainSerializer(lambda b: base64.b64encode(b).decode("ascii"), return_type=str)]
"""One image of a GENERATE: bytes in the message, base64 on the wire (JSON carries no bytes)."""


class FetchStatus(BaseModel):
    """A model file transfer under way before a load (``hydrad.engine.fetch``); ``text`` is what to show."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    bytes: int = Field(0, ge=0, description="Bytes of the file on disk so far (a resumed fetch starts above 0).")
    total: int = Field(0, ge=0, description="The file's size.")
    bps: float | None = Field(None, ge=0, description="Bytes a second over the last seconds.")
    eta_s: float | None = Field(None, ge=0, description="Seconds left at that rate.")
    text: str = Field("", max_length=128, description="'fetching 37%, 120 MB/s, ETA 12 s'.")


class EngineStatus(BaseModel):
    """What an engine reports in every heartbeat (and in REGISTER)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    stage: str = Field("starting", max_length=32)
    model: str | None = Field(None, max_length=512, description="Alias (or file stem) of the model being served.")
    generation: str | None = Field(None, max_length=128, description="Fingerprint of the serving generation.")
    kv_family: str | None = Field(None, max_length=64, description="The served model's KV family: engines serving "
                                                                   "sibling quants of one model share it, and KV "
                                                                   "state moves between them.")
    mode: str = Field("solo", max_length=16, description="solo | combine (as the engine itself reports it).")
    role: str = Field("solo", max_length=16, description="solo | head | peer | head+peer.")
    peers: list[Annotated[str, StringConstraints(max_length=300)]] = Field(
        default_factory=list, max_length=8, description="A head's peers: their merged RPC ports (host:port).")
    serving: list[Annotated[str, StringConstraints(max_length=300)]] = Field(
        default_factory=list, max_length=8, description="A peer's heads: the addresses holding buffers on its devices.")
    progress: float | None = Field(None, ge=0, le=1, description="Load progress while loading or reloading.")
    load_id: int | None = Field(None, ge=0)
    loading_model: str | None = Field(None, max_length=512, description="The model a load under way will serve.")
    slots_busy: int = Field(0, ge=0)
    slots_total: int = Field(0, ge=0)
    queued: int = Field(0, ge=0)
    max_queue: int = Field(64, ge=0)
    n_ctx: int = Field(0, ge=0)
    prefill_tps: float = Field(0.0, ge=0, description="Measured prompt tokens per second (0 = not measured yet).")
    decode_tps: float = Field(0.0, ge=0, description="Measured generated tokens per second (0 = not measured yet).")
    load_seconds: float | None = Field(None, ge=0, description="How long the last model load took.")
    vram_free: int | None = Field(None, ge=0)
    last_error: str | None = Field(None, max_length=4096)
    fetch: FetchStatus | None = Field(None, description="The running load's model file transfer, while the engine "
                                      "fetches the file from the pool; absent otherwise (so a coordinator of an "
                                      "earlier release hears it only while a fetch runs).")


class UsageInfo(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    prompt_tokens: int = Field(0, ge=0)
    completion_tokens: int = Field(0, ge=0)
    cached_tokens: int = Field(0, ge=0)
    prompt_ms: float = 0.0
    predicted_ms: float = 0.0
    draft_n: int = Field(0, ge=0, description="Tokens drafted by speculative decoding (llama-server's timings.draft_n).")
    draft_n_accepted: int = Field(0, ge=0, description="Of them, the ones the model accepted.")

    @classmethod
    def of(cls, u: events.Usage) -> UsageInfo:
        return cls(**{name: getattr(u, name) for name in cls.model_fields})  # (events.Usage has each of them)

    def usage(self) -> events.Usage:
        return events.Usage(**self.model_dump())

    def openai(self) -> dict[str, Any]:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens,
                "prompt_tokens_details": {"cached_tokens": self.cached_tokens}}
