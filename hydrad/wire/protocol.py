"""Sans-IO codec of Hydra's binary operations on the merged RPC port.

Every frame is ``code:u8 | len:u64 little-endian | payload``. Requests carry an ``Op``, responses
a ``Status``; control payloads are UTF-8 JSON objects, ``STATE_DATA`` payloads are raw KV bytes.
The spec is ``docs/rpc-protocol.md``.

The codec does no I/O so the same rules serve the asyncio listener, blocking clients and the HTTP
twins of the state endpoints, and so it can be tested exhaustively without sockets. The decoder
is the trust boundary against a peer: it turns any byte stream into frames or a
``ProtocolError`` and never buffers more than one frame's declared (and bounded) size.
"""

from __future__ import annotations

import enum
import json
import struct
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from hydrad.common import jsonbody

PROTOCOL_VERSION = 1


class Op(enum.IntEnum):
    """Request codes (client → engine)."""

    HELLO = 0x30
    ENGINE_CONFIGURE = 0x40
    INFO = 0x41
    STATE_GET = 0x42
    STATE_PUT = 0x43
    SET_EXPERT_MODE = 0x44
    SWAP_QUANT = 0x45
    PIPELINE_ATTACH = 0x46
    # Continuation frames of STATE_PUT only; outside 0x30..0x46 so they can never open a connection.
    STATE_DATA = 0x4A
    STATE_END = 0x4B


class Status(enum.IntEnum):
    """Response codes (engine → client); below 0x10 is progress or success, from 0x10 on an error."""

    OK = 0x00
    STATE_META = 0x01
    STATE_DATA = 0x02
    STATE_END = 0x03
    CONTINUE = 0x04
    ERROR = 0x10
    BAD_REQUEST = 0x11
    UNKNOWN_OP = 0x12
    TOO_LARGE = 0x13
    UNAUTHORIZED = 0x14
    BUSY = 0x15
    NOT_SUPPORTED = 0x16
    NOT_FOUND = 0x17
    INCOMPATIBLE = 0x18
    CONFLICT = 0x19
    PROTOCOL_ERROR = 0x1A


GGML_RPC_HELLO = 0x0E
"""First byte of a ggml-RPC connection (its RPC_CMD_HELLO); such connections are relayed, not decoded."""

FIRST_OPS: frozenset[int] = frozenset(int(op) for op in Op if 0x30 <= op <= 0x46)
REQUEST_CODES: frozenset[int] = frozenset(int(op) for op in Op)
RESPONSE_CODES: frozenset[int] = frozenset(int(s) for s in Status)

HEADER = struct.Struct("<BQ")
MAX_CONTROL_PAYLOAD = 1 << 20
MAX_DATA_PAYLOAD = 64 << 20

# A pending payload piece at least this large (and not much smaller than the caller's buffer) is
# kept as a view of the caller's immutable bytes instead of being copied; smaller pieces are
# gathered in a bytearray so a trickle of tiny reads costs no per-piece object overhead.
_SHARE_MIN = 64 << 10


class ProtocolError(Exception):
    """The byte stream or a payload breaks the protocol; ``status`` is the response code to send.

    ``frames`` holds the frames that the failing ``feed()`` call completed before the error, so a
    caller may still answer them; the result is then the same however the stream was split.
    """

    def __init__(self, message: str, status: Status = Status.PROTOCOL_ERROR) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.frames: tuple[Frame, ...] = ()


def _code_name(code: int) -> str:
    for enum_type in (Op, Status):
        try:
            return f"{enum_type(code).name} (0x{code:02x})"
        except ValueError:
            pass
    return f"0x{code:02x}"


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


@dataclass(frozen=True, slots=True, repr=False)
class Frame:
    """One decoded frame: a request or response code and its raw payload."""

    code: int
    payload: bytes

    def json(self) -> dict[str, Any]:
        """The payload as a JSON object; an empty payload reads as ``{}`` (e.g. a bare INFO)."""
        if not self.payload:
            return {}
        try:
            obj = json.loads(self.payload.decode("utf-8"), parse_constant=_reject_constant)
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            raise ProtocolError(f"payload of {_code_name(self.code)} is not valid UTF-8 JSON: {exc}",
                                Status.BAD_REQUEST) from None
        if not isinstance(obj, dict):
            raise ProtocolError(f"payload of {_code_name(self.code)} must be a JSON object, "
                                f"not {type(obj).__name__}", Status.BAD_REQUEST)
        try:  # a lone surrogate would pass here and break the first answer that echoes it
            jsonbody.check(obj, f"payload of {_code_name(self.code)}")
        except jsonbody.BodyError as exc:
            raise ProtocolError(str(exc), Status.BAD_REQUEST) from None
        return obj

    def __repr__(self) -> str:
        # Payloads reach 64 MiB; a full repr in a log line or a failed assertion would be useless.
        head = self.payload[:32]
        more = "..." if len(self.payload) > len(head) else ""
        return f"Frame({_code_name(self.code)}, {len(self.payload)} bytes: {head!r}{more})"


def encode(code: int, payload: bytes | bytearray | memoryview = b"") -> bytes:
    """One frame as bytes. For big payloads, writing ``HEADER.pack(...)`` and the payload separately saves a copy."""
    if not 0 <= code <= 0xFF:
        raise ValueError(f"frame code {code} is outside 0..255")
    return HEADER.pack(code, len(payload)) + payload


def encode_json(code: int, obj: Mapping[str, Any]) -> bytes:
    """One frame carrying ``obj`` as compact UTF-8 JSON; NaN and infinities are refused (not JSON)."""
    text = json.dumps(obj, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return encode(code, text.encode("utf-8"))


def error_frame(status: Status, code: str, message: str) -> bytes:
    """An error response: ``status`` for machines that switch on it, ``code``/``message`` for people and logs."""
    return encode_json(status, {"code": code, "message": message})


def limit_for(code: int) -> int:
    """Largest payload accepted for ``code``: bulk KV data gets a large bound, everything else a JSON-sized one."""
    if code in (Op.STATE_DATA, Status.STATE_DATA, Op.STATE_PUT, Status.STATE_META):
        return MAX_DATA_PAYLOAD  # bulk data, and metas whose token list grows with the context
    return MAX_CONTROL_PAYLOAD


class FrameDecoder:
    """Bytes in, frames out. Either parses or raises ProtocolError — never another exception.

    Errors are raised at the earliest byte that proves them: an unknown code on the first byte
    of a header, an oversized length as soon as the 9-byte header is complete, so a peer cannot
    make us buffer a payload we would refuse. After an error the decoder is dead: every later
    ``feed()`` or ``eof()`` raises a ``ProtocolError`` with the same status, quoting the first message.

    Cost: a payload contained in one ``feed()`` is copied once; a payload spread over several
    feeds of ``bytes`` is kept as views and joined once; pieces from mutable buffers (which the
    caller may reuse) are copied on arrival.
    """

    __slots__ = ("_valid", "_limit", "_head", "_code", "_size", "_need", "_parts", "_staging", "_held", "_dead")

    def __init__(self, valid_codes: Iterable[int], limit: Callable[[int], int] = limit_for) -> None:
        self._valid = frozenset(int(c) for c in valid_codes)
        self._limit = limit
        self._head = bytearray()  # a header still missing bytes (never 9 long between calls)
        self._code = -1  # code of the frame whose payload is being read; -1 while reading a header
        self._size = 0  # that frame's declared payload length
        self._need = 0  # payload bytes still missing
        self._parts: list[bytes | bytearray | memoryview] = []
        self._staging = bytearray()  # the newest small pieces, gathered in one buffer
        self._held = 0  # payload bytes received for the current frame
        self._dead: ProtocolError | None = None

    @property
    def buffered(self) -> int:
        """Bytes of an incomplete frame received so far (header included); 0 between frames."""
        if self._code < 0:
            return len(self._head)
        return HEADER.size + self._held

    def feed(self, data: bytes | bytearray | memoryview) -> list[Frame]:
        """Take the next bytes of the stream; return the frames they complete, in order."""
        if self._dead is not None:
            raise self._again()
        view = memoryview(data)
        if view.ndim != 1 or view.itemsize != 1:
            view = view.cast("B")
        source_len = len(view.obj) if view.readonly and isinstance(view.obj, bytes) else 0
        frames: list[Frame] = []
        try:
            self._consume(view, source_len, frames)
        except ProtocolError as exc:
            self._die(exc)
            exc.frames = tuple(frames)
            raise
        return frames

    def eof(self) -> None:
        """The stream ended; a frame cut short is a protocol error, a clean boundary is fine."""
        if self._dead is not None:
            raise self._again()
        if self.buffered:
            what = "header" if self._code < 0 else f"{_code_name(self._code)} frame"
            total = HEADER.size if self._code < 0 else HEADER.size + self._size
            exc = ProtocolError(f"truncated frame: stream ended inside a {what} "
                                f"({self.buffered} of {total} bytes received)")
            self._die(exc)
            raise exc

    def _consume(self, view: memoryview, source_len: int, frames: list[Frame]) -> None:
        pos, end = 0, len(view)
        while pos < end:
            if self._code < 0:
                if not self._head and end - pos >= HEADER.size:
                    code, size = HEADER.unpack_from(view, pos)
                    pos += HEADER.size
                else:
                    if not self._head:
                        self._check_code(view[pos])
                    take = min(HEADER.size - len(self._head), end - pos)
                    self._head += view[pos:pos + take]
                    pos += take
                    if len(self._head) < HEADER.size:
                        return
                    code, size = HEADER.unpack(self._head)
                    self._head.clear()
                self._begin(code, size)
                if size == 0:
                    frames.append(Frame(code, b""))
                    self._code = -1
                    continue
            avail = end - pos
            if avail >= self._need:
                stop = pos + self._need
                if self._held == 0:
                    payload = bytes(view[pos:stop])
                else:
                    payload = self._finish(view[pos:stop])
                frames.append(Frame(self._code, payload))
                self._code = -1
                pos = stop
            else:
                # Keep a view only when it pins little beyond itself: the caller's object stays alive
                # until this frame completes.
                self._hold(view[pos:end], avail * 4 >= source_len > 0)
                return

    def _check_code(self, code: int) -> None:
        if code not in self._valid:
            raise ProtocolError(f"unknown frame code {_code_name(code)}", Status.UNKNOWN_OP)

    def _begin(self, code: int, size: int) -> None:
        self._check_code(code)
        limit = self._limit(code)
        if size > limit:
            raise ProtocolError(f"{_code_name(code)} frame declares {size} payload bytes; the limit is {limit}",
                                Status.TOO_LARGE)
        self._code, self._size, self._need, self._held = code, size, size, 0

    def _hold(self, piece: memoryview, share: bool) -> None:
        if share and len(piece) >= _SHARE_MIN:
            if self._staging:
                self._parts.append(self._staging)
                self._staging = bytearray()
            self._parts.append(piece)
        else:
            self._staging += piece
        self._held += len(piece)
        self._need -= len(piece)

    def _finish(self, last: memoryview) -> bytes:
        parts = self._parts
        if self._staging:
            parts.append(self._staging)
        parts.append(last)
        payload = b"".join(parts)
        self._parts, self._staging, self._held, self._need = [], bytearray(), 0, 0
        return payload

    def _die(self, exc: ProtocolError) -> None:
        self._dead = exc
        self._head = bytearray()
        self._parts, self._staging, self._held, self._need, self._code = [], bytearray(), 0, 0, -1

    def _again(self) -> ProtocolError:
        assert self._dead is not None
        return ProtocolError(f"decoder is dead after an earlier error: {self._dead.message}", self._dead.status)
