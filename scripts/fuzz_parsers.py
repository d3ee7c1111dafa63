#!/usr/bin/env python3
"""In-process fuzzer of Hydra's pure parsers: no engine, no sockets.

Each target takes bytes and either returns a value or raises its documented error type(s); it must
never raise another exception, take longer than a bound per input, or allocate without bound (the
whole run is under RLIMIT_AS). Inputs are a seed corpus of valid inputs built with the project's
own encoders, mutations of them (bit flips, byte insert/delete, splices, boundary integers in length
fields, truncation, huge lengths) and pure random bytes. Deterministic given ``--seed``.

Targets:
  frame    hydrad.wire.protocol: FrameDecoder.feed (whole, split at random points, byte at a time),
           eof(), Frame.json(), encode_json round trips. Splits must not change the result.
  kvstream hydrad.wire.kvstream: a STATE_META / STATE_DATA... / STATE_END stream consumed as the
           engine's HTTP twin does (engine/http/slotstate.py), with StateReceiver and verify().
  ggml     hydrad.engine.rpc.ggml_codec: TensorCheck.tensor / .region / .graph (only Refused).
  bus      hydrad.wire.messages.decode (only BusDecodeError); an accepted message must re-encode
           and decode to itself. Input frames are separated by b"\\n\\x1e".
  openai   hydrad.wire.openai.parse for chat and completion (only ApiError); an accepted request
           must become a bus GENERATE (as the front door sends it) without error.
  layout   hydrad.store.layout.parse never raises (a blob is its fallback), and cut() pieces put
           back in order give the input bytes again.

    .venv/bin/python scripts/fuzz_parsers.py                 # 20,000 inputs per target
    .venv/bin/python scripts/fuzz_parsers.py --long          # 1,000,000 inputs per target
    .venv/bin/python scripts/fuzz_parsers.py --targets frame,bus --inputs 5000 --seed 7

Exit status 1 on any violation; violations are written to ``--out`` (one JSON file each).
"""

from __future__ import annotations

if __name__ == "__main__":  # run as scripts/NAME: under the checkout's .venv when there is one
    import _venv
    _venv.reexec()

import argparse
import hashlib
import json
import random
import re
import resource
import signal
import struct
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hydrad.engine.rpc import ggml_codec as G  # noqa: E402
from hydrad.store import layout as L  # noqa: E402
from hydrad.wire import kvstream as K  # noqa: E402
from hydrad.wire import messages as M  # noqa: E402
from hydrad.wire import openai as O  # noqa: E402
from hydrad.wire import protocol as P  # noqa: E402

MAX_INPUT = 1 << 16  # mutations grow inputs up to this; "huge" inputs are made on purpose, rarely
SEP = b"\n\x1e"  # bus target: frame separator inside one input


class Violation(Exception):
    """A broken contract: not a documented error, a wrong result, or a split-dependent result."""


class _Hang(BaseException):
    pass


# ---------------------------------------------------------------- targets -------------------------------------


@dataclass
class Target:
    name: str
    seeds: list[bytes]
    run: Callable[[bytes], str]  # returns an outcome label; raises Violation (or anything else) on a bug
    length_fields: Callable[[bytes], list[tuple[int, str]]] = lambda b: []  # (offset, struct fmt) to poke
    huge: Callable[[random.Random], bytes] | None = None


# ---- frame -----------------------------------------------------------------------------------------------------

def _split_points(data: bytes) -> list[int]:
    r = random.Random(hashlib.blake2b(data, digest_size=8).digest())
    n = len(data)
    if n <= 1:
        return []
    return sorted(set(r.randrange(1, n) for _ in range(r.randint(1, 6))))


def _decode_stream(data: bytes, codes: frozenset[int], pieces: list[bytes]) -> tuple[list[tuple[int, bytes]], str]:
    """Feed ``pieces``; the frames and the ending ("ok" or "ProtocolError:<status>"), checking the dead decoder."""
    dec = P.FrameDecoder(codes)
    out: list[tuple[int, bytes]] = []
    try:
        for piece in pieces:
            out += [(f.code, f.payload) for f in dec.feed(piece)]
        dec.eof()
        if dec.buffered:
            raise Violation("eof() accepted a decoder that still holds bytes")
        return out, "ok"
    except P.ProtocolError as exc:
        out += [(f.code, f.payload) for f in exc.frames]
        status = exc.status
        end = f"ProtocolError:{P.Status(status).name}"
    for again in (lambda: dec.feed(b"\x00"), dec.eof):
        try:
            again()
        except P.ProtocolError as exc2:
            if exc2.status != status:
                raise Violation(f"a dead decoder changed status {status!r} -> {exc2.status!r}") from exc2
        else:
            raise Violation("a dead decoder accepted more input")
    return out, end


def _json_check(code: int, payload: bytes) -> str:
    try:
        obj = P.Frame(code, payload).json()
    except P.ProtocolError as exc:
        return f"json:ProtocolError:{P.Status(exc.status).name}"
    if not isinstance(obj, dict):
        raise Violation(f"Frame.json() returned {type(obj).__name__}")
    try:
        again = P.encode_json(code, obj)
    except Exception as exc:
        raise Violation(f"Frame.json() accepted a payload encode_json cannot send back: "
                        f"{type(exc).__name__}: {str(exc)[:120]}") from exc
    frames, end = _decode_stream(again, frozenset([code]), [again])
    if end != "ok" or len(frames) != 1 or P.Frame(code, frames[0][1]).json() != obj:
        raise Violation("encode_json round trip changed the object")
    return "json:ok"


def frame_run(data: bytes) -> str:
    """Decoded with the request codes when the input's length is even, the response codes when odd."""
    codes = P.REQUEST_CODES if len(data) % 2 == 0 else P.RESPONSE_CODES
    whole, end = _decode_stream(data, codes, [data])
    cuts = [0, *_split_points(data), len(data)]
    split, end2 = _decode_stream(data, codes, [data[a:b] for a, b in zip(cuts, cuts[1:])])
    if (split, end2) != (whole, end):
        raise Violation(f"splitting the stream at {cuts[1:-1]} changed the result: {end} -> {end2}")
    if len(data) <= 96:
        single, end3 = _decode_stream(data, codes, [data[i:i + 1] for i in range(len(data))])
        if (single, end3) != (whole, end):
            raise Violation(f"feeding byte at a time changed the result: {end} -> {end3}")
        mutable, end4 = _decode_stream(data, codes, [bytearray(data)])
        if (mutable, end4) != (whole, end):
            raise Violation("feeding a bytearray changed the result")
    labels = [_json_check(c, p) for c, p in whole if p[:1] in (b"{", b"[", b'"') or c not in (0x02, 0x4A)]
    # error_frame round trip with the payload's text as the message
    msg = data[:64].decode("utf-8", "replace")
    ef = P.error_frame(P.Status.BAD_REQUEST, "x", msg)
    if P.Frame(P.Status.BAD_REQUEST, ef[P.HEADER.size:]).json() != {"code": "x", "message": msg}:
        raise Violation("error_frame round trip changed the message")
    return end if not labels or end != "ok" else f"ok/{sorted(set(labels))[0]}"


def frame_seeds() -> list[bytes]:
    s = [P.encode_json(P.Op.HELLO, {"version": P.PROTOCOL_VERSION, "token": "abc"}),
         P.encode_json(P.Op.INFO, {}), P.encode(P.Op.INFO),
         P.encode_json(P.Op.STATE_GET, {"slot": 0}),
         P.encode_json(P.Op.STATE_PUT, {"slot": 1, "meta": {"bytes": 8, "tokens": [1, 2, 3]}}),
         P.encode(P.Op.STATE_DATA, bytes(range(40))), P.encode_json(P.Op.STATE_END, {"bytes": 40}),
         P.encode_json(P.Status.OK, {"a": [1, 2.5, None, True, "é"]}),
         P.error_frame(P.Status.TOO_LARGE, "too_large", "no"),
         P.encode_json(P.Status.STATE_META, {"bytes": 4, "n_tokens": 2}),
         P.encode(P.Status.STATE_DATA, b"\x00\x01\x02\x03"),
         P.encode(P.Status.CONTINUE, b'{"slot": 3}'),
         P.encode(P.Op.INFO, b'[1,2]'), P.encode(P.Op.INFO, b'NaN'), P.encode(P.Op.INFO, b'{"a":"\\ud800"}'),
         P.encode(P.Op.INFO, b"[" * 5000), P.encode(P.Op.INFO, b"1" * 5000)]
    s.append(b"".join(s[:7]))
    s.append(b"".join(s[7:12]))
    return s


def frame_fields(data: bytes) -> list[tuple[int, str]]:
    out, off = [], 0
    while off + 9 <= len(data) and len(out) < 8:
        out += [(off, "<B"), (off + 1, "<Q")]
        (n,) = struct.unpack_from("<Q", data, off + 1)
        off += 9 + n
    return out


def frame_huge(r: random.Random) -> bytes:
    code = r.choice([P.Op.INFO, P.Op.STATE_DATA, P.Status.OK])
    n = P.limit_for(code) + r.choice([0, 1])
    if n > P.MAX_CONTROL_PAYLOAD + 1:
        return P.HEADER.pack(code, n) + b"\x00" * r.randrange(0, 1 << 16)  # declared, never sent
    return P.HEADER.pack(code, n) + b"{" + b" " * (n - 2) + b"}"


# ---- kvstream -------------------------------------------------------------------------------------------------

class _StateRefused(Exception):
    """Stand-in for the engine's check_put refusal (an ApiError in slotstate.py)."""


KV_MAX_BYTES = 1 << 20


def kv_run(data: bytes) -> str:
    """The HTTP twin's consumer (engine/http/slotstate.py): the same StreamAssembler, the engine's
    check_put replaced by its meta.bytes check."""
    cuts = [0, *_split_points(data), len(data)]
    dec = P.FrameDecoder(P.RESPONSE_CODES)

    def open_receiver(meta: dict[str, Any]) -> K.StateReceiver:
        size = meta.get("bytes")
        if isinstance(size, bool) or not isinstance(size, int) or not 0 < size <= KV_MAX_BYTES:
            raise _StateRefused()
        return K.StateReceiver(size)

    stream_in = K.StreamAssembler(open_receiver)
    try:
        for a, b in zip(cuts, cuts[1:]):
            for frame in dec.feed(data[a:b]):
                stream_in.add(frame)
        dec.eof()
    except P.ProtocolError as exc:
        return f"ProtocolError:{P.Status(exc.status).name}"
    except _StateRefused:
        return "refused(meta.bytes)"
    if not stream_in.complete:
        return "incomplete"
    rx, end = stream_in.rx, stream_in.end
    assert rx is not None and end is not None
    problem = rx.verify(end)
    if problem is not None:
        if not isinstance(problem, str):
            raise Violation(f"verify() returned {type(problem).__name__}")
        return "mismatch"
    if rx.received != rx.total:
        raise Violation("verify() accepted a stream shorter than its meta")
    return "accepted"


def kv_seeds() -> list[bytes]:
    out = []
    for n, chunk in ((1, 64), (40, 16), (100, 64), (257, 100), (9, 9)):
        body = bytes((i * 7 + n) & 0xFF for i in range(n))
        out.append(b"".join(bytes(p) for p in K.chunked({"bytes": n, "n_tokens": 3, "tokens": [1, 2, 3]}, body, chunk)))
    return out


# ---- ggml -----------------------------------------------------------------------------------------------------

# tests/unit/engine/test_ggml_relay.py's table and helpers: F32 (block 1, 4 bytes), F16, Q4_0 (block 32, 18 bytes)
SIZES = [(1, 4), (1, 2), (32, 18)] + [(1, 1)] * (G.GGML_TYPE_COUNT - 3)
BASE, SIZE, PTR = 0x7000_0000, 4096, 0xABC0
BUFFERS = {PTR: (BASE, SIZE), 0xDEF0: (0xFFFF_FFFF_FFFF_0000, 0xFFFF)}
CHECK = G.TensorCheck(SIZES)


def _tensor(data: int = BASE, n: int = 16, typ: int = 0, buffer: int = PTR, op: int = 0, tid: int = 1,
            src: tuple[int, ...] = ()) -> bytes:
    tsize = 4 if typ == 0 else 18
    nb1 = tsize * n // (32 if typ == 2 else 1)
    srcs = list(src) + [0] * (10 - len(src))
    return G.TENSOR.pack(tid, typ, buffer, n, 1, 1, 1, tsize, nb1, nb1, nb1, op, *([0] * 16), 0, *srcs, 0, 0,
                         data, b"t", 0)


def _graph(nodes: list[int], tensors: list[bytes], device: int = 0) -> bytes:
    return struct.pack(f"<II{len(nodes)}QI", device, len(nodes), *nodes, len(tensors)) + b"".join(tensors)


def ggml_run(data: bytes) -> str:
    """Byte 0 picks the check: 0 tensor (296 bytes, zero-padded), 1 region (4 x u64), else graph."""
    if not data:
        return "empty"
    sel, body = data[0] % 3, data[1:]
    try:
        if sel == 0:
            raw = (body + bytes(G.T))[:G.T]
            need = bool(data[0] & 0x80)
            region, ptr, n = CHECK.tensor(raw, 0, BUFFERS, need_buffer=need)
            if region is not None and not (region[0] <= ptr and ptr + n <= region[0] + region[1]):
                raise Violation("tensor() accepted an extent outside its buffer")
            if region is None and need:
                raise Violation("tensor() accepted a tensor without a buffer when one is needed")
            return "tensor:accepted"
        if sel == 1:
            raw = (body + bytes(32))[:32]
            data_, off, size, which = struct.unpack("<4Q", raw)
            region = list(BUFFERS.values())[which & 1]
            G.TensorCheck.region(region, data_, off, size)
            if not (region[0] <= data_ + off and data_ + off + size <= region[0] + region[1]):
                raise Violation("region() accepted a region outside the buffer")
            return "region:accepted"
        device = CHECK.graph(bytes(body), 1 + (data[0] >> 7), BUFFERS)
        if device > data[0] >> 7:
            raise Violation(f"graph() returned device {device}")
        return "graph:accepted"
    except G.Refused:
        return ("tensor", "region", "graph")[sel] + ":Refused"


def ggml_seeds() -> list[bytes]:
    t1, t2 = _tensor(tid=1), _tensor(tid=2, data=BASE + 64, src=(1,))
    return [b"\x00" + _tensor(), b"\x80" + _tensor(typ=2, n=64), b"\x00" + _tensor(buffer=0, data=0),
            b"\x00" + _tensor(data=BASE + SIZE - 64),
            b"\x01" + struct.pack("<4Q", BASE, 0, SIZE, 0), b"\x01" + struct.pack("<4Q", BASE, 8, 16, 0),
            b"\x02" + _graph([2], [t1, t2]), b"\x02" + _graph([1, 2, 0], [t1, t2]),
            b"\x02" + _graph([3], [t1, t2, _tensor(tid=3, buffer=0, data=0, src=(1, 2))]),
            b"\x82" + _graph([2], [t1, t2], device=1), b"\x02" + _graph([], [])]


def ggml_fields(data: bytes) -> list[tuple[int, str]]:
    if not data:
        return []
    if data[0] % 3 == 0:  # type, buffer, ne0, nb0, op, data
        return [(9, "<I"), (13, "<Q"), (21, "<I"), (37, "<I"), (53, "<I"), (1 + 8 + 4 + 8 + 32 + 4 + 64 + 4 + 80 + 16, "<Q")]
    if data[0] % 3 == 1:
        return [(1, "<Q"), (9, "<Q"), (17, "<Q")]
    out = [(1, "<I"), (5, "<I")]
    if len(data) >= 9:
        (n,) = struct.unpack_from("<I", data, 5)
        if n <= 64:
            out.append((9 + 8 * n, "<I"))
            out += [(9 + 8 * i, "<Q") for i in range(n)]
    return out


# ---- bus ------------------------------------------------------------------------------------------------------

def bus_run(data: bytes) -> str:
    frames = data.split(SEP)
    try:
        msg = M.decode(frames)
    except M.BusDecodeError as exc:
        if not isinstance(exc.reason, str):
            raise Violation("BusDecodeError without a reason") from exc
        return "BusDecodeError"
    if type(msg) not in M.KINDS.values():
        raise Violation(f"decode() returned {type(msg).__name__}")
    try:
        again = M.encode(msg)
    except M.BusEncodeError as exc:
        raise Violation(f"decode() accepted a {msg.KIND.decode()} that encode() refuses: {exc.reason[:160]}") from exc
    try:
        back = M.decode(again)
    except M.BusDecodeError as exc:
        raise Violation(f"a decoded {msg.KIND.decode()} does not survive encode/decode: {exc.reason[:200]}") from exc
    if back != msg:
        raise Violation(f"a decoded {msg.KIND.decode()} changed through encode/decode")
    return f"accepted:{msg.KIND.decode()}"


def bus_examples() -> list[M._Msg]:
    st = M.EngineStatus(stage="ready", model="m", slots_total=2, prefill_tps=10.5, decode_tps=3.0, progress=0.5,
                        peers=["h:1"], last_error="x")
    return [M.Register(engine="e1", instance="a.1", version="1.0", pid=3, gpu=M.GpuInfo(name="CUDA0", vram_total=8),
                       http="127.0.0.1:1", models_on_disk=["a", "b"], status=st, token="t"),
            M.Heartbeat(status=st), M.Goodbye(reason="bye"), M.Tokens(req="r:1", texts=["a", "é"]),
            M.Done(req="r1", finish_reason="stop", usage=M.UsageInfo(prompt_tokens=3, prompt_ms=1.5)),
            M.Error(req="r1", message="m", status=503, engine_failed=True),
            M.ConfigureReply(req="r1", ok=True, result={"a": 1}), M.LoadDone(req="r1", load_id=1, phase="done", seconds=2.0),
            M.Welcome(coordinator="c", version="1"), M.Refused(reason="no"), M.Ping(), M.Reregister(reason="x"),
            M.Generate(req="r1", model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=4, stop=["x"],
                       sampling=M.Sampling(temperature=0.5, seed=3), slot=1),
            M.Generate(req="r2", prompt="p"), M.Cancel(req="r1"), M.Configure(req="r1", payload={"model": "m"}),
            M.Generate(req="r3", messages=[{"role": "user", "content": "hi"}, {"role": "tool", "content": "1",
                                                                               "tool_call_id": "c1"}],
                       tools=O.tool_spec({"tools": [_TOOL], "tool_choice": "required"}, None)),
            M.Tokens(req="r3", texts=[""], tool_calls=[M.ToolCall(id="call_1", name="f", arguments='{"a": 1}')])]


def bus_seeds() -> list[bytes]:
    return [SEP.join(M.encode(m)) for m in bus_examples()]


# ---- openai ---------------------------------------------------------------------------------------------------

def openai_run(data: bytes) -> str:
    labels = []
    for kind in ("chat", "completion"):
        try:
            req, gen = O.parse(kind, data)  # type: ignore[arg-type]
        except O.ApiError as exc:
            if not 400 <= exc.status < 600:
                raise Violation(f"ApiError with status {exc.status}") from exc
            json.dumps(exc.body(), ensure_ascii=False, allow_nan=False).encode()  # the error must be renderable
            labels.append(f"{kind}:ApiError:{exc.code}")
            continue
        gen.slot = None  # as the front door does
        try:
            frames = M.encode(M.Generate.from_request("r1", gen, req.model))
        except M.BusEncodeError as exc:
            if not exc.too_large:
                raise Violation(f"an accepted {kind} request cannot be sent on the bus: {exc.reason[:200]}") from exc
        else:
            try:
                M.decode(frames)
            except M.BusDecodeError as exc:
                raise Violation(f"the engine would refuse an accepted {kind} request: {exc.reason[:200]}") from exc
        labels.append(f"{kind}:accepted")
    return labels[0] if data[:1] == b"{" and b"messages" in data else labels[1]


def openai_seeds() -> list[bytes]:
    bodies = [{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1},
              {"model": "smollm2-135m", "messages": [{"role": "system", "content": "s"},
                                                     {"role": "user", "content": [{"type": "text", "text": "a"}]}],
               "temperature": 0.7, "top_p": 0.9, "top_k": 40, "min_p": 0.05, "seed": 42, "stop": ["\n", "x"],
               "stream": True, "stream_options": {"include_usage": True}, "id_slot": 0, "ignore_eos": False},
              {"messages": [{"role": "developer", "content": None}, {"role": "tool", "content": "é"}],
               "max_completion_tokens": 5, "n_predict": -1, "response_format": {"type": "text"}, "logprobs": False,
               "tools": [], "n": 1, "user": "u", "repeat_penalty": 1.1, "frequency_penalty": -2, "presence_penalty": 2},
              {"prompt": "Once upon", "max_tokens": 8, "stop": "x"},
              {"prompt": ["one"], "seed": 2**64 - 1, "temperature": 0},
              {"messages": [{"role": "user", "content": "x"}], "max_tokens": 2**31 - 1, "top_k": 0},
              {"messages": [{"role": "user", "content": "x"},
                            {"role": "assistant", "content": None, "tool_calls": [
                                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}]},
                            {"role": "tool", "tool_call_id": "c1", "name": "f", "content": "2"}],
               "tools": [_TOOL, {"type": "function", "function": {"name": "g"}}],
               "tool_choice": {"type": "function", "function": {"name": "g"}}, "parallel_tool_calls": True}]
    return [json.dumps(b, ensure_ascii=False).encode() for b in bodies] + [b"", b"{}", b"[]", b"null"]


_TOOL = {"type": "function", "function": {"name": "f", "description": "d",
                                          "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}}}


# ---- layout ---------------------------------------------------------------------------------------------------

def _kv_state(cells: int, n_layer: int = 2, v_trans: int = 0, row: int = 8, el: int = 2, n_embd: int = 4,
              caches: int = 1, n_stream: int = 1, positions: list[int] | None = None) -> bytes:
    out = [struct.pack("<Ii", L.IO_MAGIC, 0)]
    for _ in range(caches):
        out.append(struct.pack("<I", n_stream))
        for s in range(n_stream):
            c = cells if s == 0 else 0
            out.append(struct.pack("<I", c))
            if not c:
                continue
            for i in range(c):
                out.append(struct.pack("<iIi", (positions or list(range(c)))[i], 1, 0))
            out.append(struct.pack("<II", v_trans, n_layer))
            for layer in range(n_layer):
                out.append(struct.pack("<iQ", 1, row) + bytes((layer + j) & 0xFF for j in range(row * c)))
            for layer in range(n_layer):
                if v_trans:
                    out.append(struct.pack("<iII", 1, el, n_embd) + bytes((3 * layer + j) & 0xFF for j in range(el * n_embd * c)))
                else:
                    out.append(struct.pack("<iQ", 1, row) + bytes((5 * layer + j) & 0xFF for j in range(row * c)))
    return b"".join(out)


def layout_run(data: bytes) -> str:
    parsed = L.parse(data)
    if parsed.kind not in ("kv", "blob"):
        raise Violation(f"parse() returned kind {parsed.kind!r}")
    block = 1 + (len(data) % 5)
    pieces = L.cut(data, parsed, block, 64)
    out = []
    for part, got in zip(parsed.parts, pieces):
        if part[0] in ("raw", "cells"):
            out.append(got)
        elif part[0] == "vtrans":
            out.append(L.join_vtrans(got, part[1], part[2]))  # type: ignore[arg-type]
        else:
            out.append(b"".join(got))  # type: ignore[arg-type]
    if len(pieces) != len(parsed.parts) or b"".join(out) != bytes(data):
        raise Violation(f"cut() pieces of a {parsed.kind} layout do not put back the input")
    if parsed.kind == "blob":
        return "blob"
    return "kv:truncatable" if parsed.truncatable else "kv"


def layout_seeds() -> list[bytes]:
    return [_kv_state(3), _kv_state(5, v_trans=1), _kv_state(4, caches=2), _kv_state(2, n_stream=2),
            _kv_state(0), _kv_state(3, positions=[0, 2, 1]), _kv_state(1, n_layer=1, row=1), b"", b"\xd8\x3c\x14\xaf"]


def layout_fields(data: bytes) -> list[tuple[int, str]]:
    return [(0, "<I"), (4, "<i"), (8, "<I"), (12, "<I"), (16, "<i"), (20, "<I")] + [
        (o, "<I") for o in range(24, min(len(data), 200), 4)]


TARGETS: dict[str, Target] = {
    "frame": Target("frame", frame_seeds(), frame_run, frame_fields, frame_huge),
    "kvstream": Target("kvstream", kv_seeds(), kv_run, frame_fields),
    "ggml": Target("ggml", ggml_seeds(), ggml_run, ggml_fields),
    "bus": Target("bus", bus_seeds(), bus_run),
    "openai": Target("openai", openai_seeds(), openai_run),
    "layout": Target("layout", layout_seeds(), layout_run, layout_fields),
}


# ---------------------------------------------------------------- mutation -----------------------------------

INTERESTING = [0, 1, 2, 7, 8, 9, 0x7F, 0x80, 0xFF, 0x100, 0xFFFF, 0x10000, 2**31 - 1, 2**31, 2**32 - 1, 2**32,
               P.MAX_CONTROL_PAYLOAD, P.MAX_CONTROL_PAYLOAD + 1, P.MAX_DATA_PAYLOAD, P.MAX_DATA_PAYLOAD + 1,
               G.MAX_GRAPH_ITEMS, G.MAX_GRAPH_ITEMS + 1, 2**53 + 1, 2**63 - 1, 2**63, 2**64 - 1]
TOKENS = [b"{", b"}", b"[", b"]", b'"', b":", b",", b"null", b"true", b"1e999", b"-0", b"NaN", b"Infinity",
          b'"\\ud800"', b'"\\u0000"', b"\\", b"\xff", b"\xc3", b"\xed\xa0\x80", b"9" * 40, b"[" * 40, b'{"a":' * 40,
          b'"messages"', b'"role"', b'"content"', b'"bytes"', b'"xxh3_128"', b'"stop"', b'"prompt"', b'"model"',
          b'"status"', b'"req"', b"-1", b"1.5", b"2147483648", b"18446744073709551616", SEP]


_VALUE = re.compile(rb'-?[0-9][0-9.eE+-]*|"[^"\\\\]{0,40}"|true|false|null')


def mutate(r: random.Random, data: bytes, t: Target, corpus: list[bytes]) -> bytes:
    b = bytearray(data)
    for _ in range(r.choice((1, 1, 1, 2, 3, 5))):
        op = r.randrange(12)
        if op == 0 and b:  # bit flip
            i = r.randrange(len(b))
            b[i] ^= 1 << r.randrange(8)
        elif op == 1 and b:  # random byte
            b[r.randrange(len(b))] = r.randrange(256)
        elif op == 2:  # insert bytes
            i = r.randint(0, len(b))
            b[i:i] = bytes(r.randrange(256) for _ in range(r.randint(1, 8)))
        elif op == 3 and b:  # delete a span
            i = r.randrange(len(b))
            del b[i:i + r.randint(1, 16)]
        elif op == 4 and b:  # truncate
            del b[r.randrange(len(b)):]
        elif op == 5:  # splice with another corpus input
            other = r.choice(corpus)
            i, j = r.randint(0, len(b)), r.randint(0, len(other))
            b = b[:i] + other[j:] if r.random() < 0.5 else b[:i] + other[:j] + b[i:]
        elif op == 6:  # a length field set to a boundary value
            fields = [(o, f) for o, f in t.length_fields(bytes(b)) if o + struct.calcsize(f) <= len(b)]
            if fields:
                o, f = r.choice(fields)
                size = struct.calcsize(f)
                v = r.choice(INTERESTING + [len(b) - o, len(b) - o - 9, len(b)]) + r.choice((0, 0, -1, 1))
                bits = 8 * size
                v &= (1 << bits) - 1
                if f[-1].islower() and v >= 1 << (bits - 1):
                    v -= 1 << bits
                struct.pack_into(f, b, o, v)
        elif op == 7:  # a JSON-ish token
            i = r.randint(0, len(b))
            b[i:i] = r.choice(TOKENS)
        elif op == 8 and b:  # duplicate a span (repeats / reorders frames and fields)
            i = r.randrange(len(b))
            j = min(len(b), i + r.randint(1, 64))
            k = r.randint(0, len(b))
            b[k:k] = b[i:j]
        elif op == 9 and len(b) > 2:  # swap two spans (out-of-order)
            i, j = sorted(r.sample(range(len(b)), 2))
            n = r.randint(1, min(32, j - i))
            b[i:i + n], b[j:j + n] = b[j:j + n], b[i:i + n]
        elif op == 10:  # an interesting integer anywhere
            size = r.choice((1, 2, 4, 8))
            if len(b) >= size:
                o = r.randrange(len(b) - size + 1)
                b[o:o + size] = (r.choice(INTERESTING) & ((1 << 8 * size) - 1)).to_bytes(size, "little")
        elif op == 11:  # a JSON number or string value replaced by a token (keeps the structure valid)
            spans = [m.span() for m in _VALUE.finditer(b)]
            if spans:
                i, j = r.choice(spans)
                b[i:j] = r.choice(TOKENS)
    return bytes(b[:MAX_INPUT])


def generate(r: random.Random, t: Target, corpus: list[bytes]) -> bytes:
    x = r.random()
    if x < 0.05:
        return bytes(r.randrange(256) for _ in range(r.choice((0, 1, 8, 9, 16, 64, 300))))
    if x < 0.07:
        return r.choice(t.seeds)
    if t.huge is not None and x < 0.0702:
        return t.huge(r)
    return mutate(r, r.choice(corpus), t, corpus)


# ---------------------------------------------------------------- driver -------------------------------------

@dataclass
class Report:
    target: str
    inputs: int = 0
    seconds: float = 0.0
    outcomes: Counter = field(default_factory=Counter)
    violations: list[dict[str, Any]] = field(default_factory=list)
    slowest_ms: float = 0.0


def _alarm(signum: int, frame: Any) -> None:
    raise _Hang()


def run_one(t: Target, data: bytes, bound_s: float) -> tuple[str | None, str | None, float]:
    """(outcome, violation, seconds). A hard alarm at 20x the bound catches real hangs."""
    signal.setitimer(signal.ITIMER_REAL, max(1.0, 20 * bound_s))
    t0 = time.perf_counter()
    try:
        out = t.run(data)
        return out, None, time.perf_counter() - t0
    except _Hang:
        return None, f"hang: still running after {max(1.0, 20 * bound_s):.1f} s", time.perf_counter() - t0
    except Violation as exc:
        return None, str(exc), time.perf_counter() - t0
    except MemoryError:
        return None, "MemoryError (allocation beyond RLIMIT_AS)", time.perf_counter() - t0
    except RecursionError:
        return None, "RecursionError", time.perf_counter() - t0
    except Exception as exc:
        return None, f"undocumented {type(exc).__name__}: {str(exc)[:300]}", time.perf_counter() - t0
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


def fuzz(t: Target, n: int, seed: int, bound_s: float, max_violations: int = 20, log: Callable[[str], None] = print,
         ) -> Report:
    r = random.Random(f"{seed}:{t.name}")
    rep = Report(t.name)
    corpus = list(t.seeds)
    seen_kinds: set[str] = set()
    start = time.perf_counter()
    for i in range(n):
        data = t.seeds[i] if i < len(t.seeds) else generate(r, t, corpus)
        out, bad, dt = run_one(t, data, bound_s)
        if bad is None and dt > bound_s:
            # a busy machine stalls any run: only the fastest of three retries counts
            dt = min(run_one(t, data, bound_s)[2] for _ in range(3))
            if dt > bound_s:
                bad = f"slow: {dt * 1000:.1f} ms > {bound_s * 1000:.0f} ms"
        rep.slowest_ms = max(rep.slowest_ms, dt * 1000)
        rep.inputs += 1
        if bad is not None:
            rep.outcomes["VIOLATION"] += 1
            if len(rep.violations) < max_violations:
                rep.violations.append({"target": t.name, "index": i, "violation": bad, "input_hex": data.hex(),
                                       "input_len": len(data)})
                log(f"  VIOLATION {t.name} #{i}: {bad}\n    input ({len(data)} bytes): {data[:96].hex()}"
                    f"{'...' if len(data) > 96 else ''}")
            continue
        assert out is not None
        rep.outcomes[out] += 1
        # grow the corpus with inputs of a new outcome, and a few others, so mutations go deeper
        if out not in seen_kinds or (len(corpus) < 2000 and r.random() < 0.01):
            seen_kinds.add(out)
            if len(data) <= 8192:
                corpus.append(data)
    rep.seconds = time.perf_counter() - start
    return rep


def limit_memory(extra_mb: int) -> int:
    with open("/proc/self/status") as f:
        vm = next(int(line.split()[1]) for line in f if line.startswith("VmSize:")) * 1024
    cap = vm + extra_mb * (1 << 20)
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    return cap


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--long", action="store_true", help="1,000,000 inputs per target (default 20,000)")
    ap.add_argument("--inputs", type=int, help="inputs per target (overrides --long)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--targets", default=",".join(TARGETS), help=f"comma list of {', '.join(TARGETS)}")
    ap.add_argument("--timeout-per-input", type=float, default=50.0, metavar="MS")
    ap.add_argument("--max-seconds", type=float, default=0, help="stop each target after this long (0: no limit)")
    ap.add_argument("--memory-mb", type=int, default=1024, help="address space allowed beyond the start (RLIMIT_AS)")
    ap.add_argument("--out", type=Path, default=Path("fuzz-out"), help="where violations are written")
    args = ap.parse_args(argv)
    n = args.inputs or (1_000_000 if args.long else 20_000)
    names = [x.strip() for x in args.targets.split(",") if x.strip()]
    unknown = [x for x in names if x not in TARGETS]
    if unknown:
        ap.error(f"unknown target(s) {unknown}; known: {list(TARGETS)}")
    cap = limit_memory(args.memory_mb)
    signal.signal(signal.SIGALRM, _alarm)
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 1000))
    print(f"seed {args.seed}, {n} inputs per target, bound {args.timeout_per_input:.0f} ms/input, "
          f"RLIMIT_AS {cap >> 20} MiB")
    total_bad = 0
    for name in names:
        t = TARGETS[name]
        count = n
        if args.max_seconds:  # calibrate, then cap the count to the time allowed
            probe = fuzz(t, min(n, 2000), args.seed, args.timeout_per_input / 1000, log=lambda s: None)
            count = min(n, max(probe.inputs, int(probe.inputs / max(probe.seconds, 1e-9) * args.max_seconds)))
        rep = fuzz(t, count, args.seed, args.timeout_per_input / 1000)
        bad = rep.outcomes.get("VIOLATION", 0)
        total_bad += bad
        rate = rep.inputs / max(rep.seconds, 1e-9)
        print(f"{name}: {rep.inputs} inputs, {rep.seconds:.1f} s, {rate:,.0f} inputs/s, slowest {rep.slowest_ms:.1f} ms, "
              f"violations {bad}")
        for out, k in sorted(rep.outcomes.items(), key=lambda kv: -kv[1]):
            print(f"    {k:>9,}  {out}")
        if rep.violations:
            args.out.mkdir(parents=True, exist_ok=True)
            for v in rep.violations:
                (args.out / f"{name}-{args.seed}-{v['index']}.json").write_text(json.dumps(v, indent=1) + "\n")
    print("violations: none" if total_bad == 0 else f"violations: {total_bad} (written to {args.out})")
    return 1 if total_bad else 0


if __name__ == "__main__":
    sys.exit(main())
