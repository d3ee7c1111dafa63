"""Bus frames over a plain stream socket: the request stream between the front door and an engine.

A ZeroMQ message passes through an I/O thread on each side, so every hop wakes three sleeping
threads where a socket wakes one; with the processes idle between messages, as a request's hops find
them, that made a hop 4.5× a plain socket's on the 2-core machine (scripts/bench_bus_hop.py). The
request stream carries the same frames as the bus (``messages.encode``: protocol, kind, body; a
batch's too), so both ends decode and check them with the bus's own code.

A message on the stream: ``u32`` length of what follows, ``u16`` frame count, then each frame as
``u32`` length and bytes (little-endian). A reader refuses a length over its limit before reading
it, and any inconsistency, with :class:`FrameError`; the connection is then closed.
"""

from __future__ import annotations

import asyncio
import struct

from hydrad.wire import messages as M
from hydrad.wire.messages import MAX_BATCH, MAX_BODY

ANSWER_KINDS = frozenset({M.Tokens.KIND, M.Progress.KIND, M.Done.KIND, M.Error.KIND})  # what an engine sends on it (a batch's first kind)
U32 = struct.Struct("<I")
U16 = struct.Struct("<H")
MAX_FRAMES = 1 + 2 * MAX_BATCH  # a full batch: the protocol frame, then kind and body per message
LIMIT = MAX_BODY + 8 * MAX_FRAMES + 64 * 1024  # the largest body, every frame's header, kinds


class FrameError(Exception):
    """What arrived is not a well-formed message of the request stream."""


def pack(frames: list[bytes]) -> bytes:
    parts = [U16.pack(len(frames))]
    for f in frames:
        parts.append(U32.pack(len(f)))
        parts.append(bytes(f))
    body = b"".join(parts)
    return U32.pack(len(body)) + body


def unpack(body: bytes) -> list[bytes]:
    """One message's frames (``body`` without its length prefix); FrameError when it is malformed."""
    if len(body) < 2:
        raise FrameError("a message shorter than its frame count")
    (count,) = U16.unpack_from(body, 0)
    if count == 0 or count > MAX_FRAMES:
        raise FrameError(f"{count} frames (1 to {MAX_FRAMES} allowed)")
    frames, i = [], 2
    for _ in range(count):
        if i + 4 > len(body):
            raise FrameError("a frame's length runs past the message")
        (n,) = U32.unpack_from(body, i)
        i += 4
        if i + n > len(body):
            raise FrameError("a frame runs past the message")
        frames.append(body[i:i + n])
        i += n
    if i != len(body):
        raise FrameError(f"{len(body) - i} bytes after the last frame")
    return frames


async def read(reader: asyncio.StreamReader, limit: int = LIMIT) -> list[bytes]:
    """The next message's frames; ``asyncio.IncompleteReadError`` at the end of the stream,
    FrameError for a length over ``limit`` (refused unread) or a malformed message."""
    (n,) = U32.unpack(await reader.readexactly(4))
    if n > limit:
        raise FrameError(f"a message of {n} bytes (at most {limit})")
    return unpack(await reader.readexactly(n))
