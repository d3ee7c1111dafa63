"""Bus message codec: every message round-trips, and no input makes decode raise anything but
BusDecodeError (the reader task on either end relies on that to log and drop, never die)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hydrad.wire import messages as M
from hydrad.wire.busevents import Event
from hydrad.wire.requests import GenRequest, SamplingOverrides

SAMPLES: list[M._Msg] = [
    M.Register(engine="dev-a", instance="abc.1", version="0.1.0", pid=42,
               gpu=M.GpuInfo(name="CUDA0", description="NVIDIA H200", kind="gpu", arch="sm_90",
                             vram_total=141 << 30, vram_free=140 << 30),
               http="127.0.0.1:8080", rpc="127.0.0.1:9503", models_on_disk=["smollm2-135m", "gemma3-270m"],
               heartbeat_interval_s=0.5, status=M.EngineStatus(stage="idle")),
    M.Heartbeat(status=M.EngineStatus(stage="reloading", model="smollm2-135m", generation="hydra-g1-x", progress=0.42,
                                      load_id=3, loading_model="gemma3-270m", slots_busy=1, slots_total=4, queued=2,
                                      prefill_tps=812.5, decode_tps=77.1, load_seconds=0.53, last_error=None)),
    M.Goodbye(reason="SIGTERM"),
    M.Tokens(req="gen-1", texts=["Hel", "lo ", "wörld ✓"]),
    M.Done(req="gen-1", finish_reason="length", fingerprint="hydra-g1-abc", model="smollm2-135m",
           usage=M.UsageInfo(prompt_tokens=11, completion_tokens=16, cached_tokens=3, prompt_ms=1.5, predicted_ms=20)),
    M.Error(req="gen-2", message="no model is loaded", status=503, code="no_model", engine_failed=False),
    M.ConfigureReply(req="cfg-1", ok=True, result={"tier": "T3", "load_id": 1, "changed": ["model"]}),
    M.ConfigureReply(req="cfg-2", ok=False, status=404, code="model_not_found", message="unknown model 'x'"),
    M.LoadDone(req="cfg-1", load_id=1, phase="done", model="gemma3-270m", seconds=1.25),
    M.Welcome(coordinator="coordinator", version="0.1.0"),
    M.StreamOffer(endpoint="127.0.0.1:9502"),
    M.Ping(),
    M.Reregister(reason="unknown engine"),
    M.Generate(req="gen-3", model="smollm2-135m", messages=[{"role": "user", "content": "hi"}], max_tokens=8,
               stop=["\n"], sampling=M.Sampling(temperature=0.0, seed=7), ignore_eos=True),
    M.Cancel(req="gen-3"),
    M.Configure(req="cfg-3", payload={"model": "gemma3-270m", "n_ctx": 4096, "tensor_split": None}),
]


@pytest.mark.parametrize("msg", SAMPLES, ids=lambda m: type(m).__name__ + "-" + m.KIND.decode())
def test_every_message_round_trips(msg: M._Msg) -> None:
    frames = M.encode(msg)
    assert frames[0] == M.PROTOCOL and frames[1] == msg.KIND
    assert M.decode(frames) == msg
    assert M.decode([bytearray(f) for f in frames]) == msg  # zmq may hand frames as buffers


def test_directions_partition_the_kinds() -> None:
    assert M.FROM_ENGINE | M.TO_ENGINE == set(M.KINDS.values())
    assert not M.FROM_ENGINE & M.TO_ENGINE


def test_generate_carries_a_request_both_ways() -> None:
    gen = GenRequest(prompt="Once", max_tokens=5, stop=["."], ignore_eos=False, slot=None,
                     sampling=SamplingOverrides(temperature=0.2, top_k=5, top_p=0.9, min_p=0.1, repeat_penalty=1.1,
                                                frequency_penalty=0.5, presence_penalty=-0.5, seed=3))
    msg = M.Generate.from_request("gen-9", gen, "smollm2-135m")
    back = M.decode(M.encode(msg)).to_request()  # type: ignore[union-attr]
    assert (back.prompt, back.max_tokens, back.stop, back.sampling) == (gen.prompt, gen.max_tokens, gen.stop, gen.sampling)


# GenRequest fields the bus does not carry: the engine's own (made when it prepares the request), and
# the client's cache_salt (the door folds it into cache_ns: the salt itself never travels on).
NOT_ON_THE_BUS = {"tokens", "tokens_for", "stored_prefix", "id", "cache_salt", "pool_pin"}


@pytest.mark.parametrize("kind, body", [
    ("completion", {"prompt": "Once", "max_tokens": 7, "stop": ["."], "ignore_eos": True, "id_slot": 2,
                    "cache_prompt": False, "logprobs": 3, "temperature": 0.3, "top_k": 9, "seed": 4}),
    ("chat", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "stop": "!", "cache_prompt": True,
              "logprobs": True, "top_logprobs": 2, "id_slot": 1, "ignore_eos": False, "presence_penalty": 0.5,
              "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
              "reasoning_format": "deepseek-legacy", "reasoning_budget_tokens": 4,
              "chat_template_kwargs": {"enable_thinking": True, "effort": ["high", 2]}}),
    ("native", {"prompt": [1, 2, 3], "n_predict": 4, "return_tokens": True, "stream": True, "return_progress": True,
                "n_probs": 2, "cache_prompt": False}),
    ("infill", {"input_prefix": ["def f(", 7], "input_suffix": "):\n", "prompt": "x",
                "input_extra": [{"filename": "a.py", "text": "import os"}], "n_predict": 3}),
])
def test_every_field_a_door_sets_survives_the_bus(kind: str, body: dict) -> None:
    """What the front door parsed is what the engine runs: a field GENERATE drops is a request
    silently answered differently through the coordinator (``cache_prompt`` once was)."""
    import dataclasses

    from hydrad.wire import infill, native_completion, openai

    raw = json.dumps(body).encode()
    parse = {"native": native_completion.parse, "infill": infill.parse}.get(kind) or (lambda r: openai.parse(kind, r))
    _, gen = parse(raw)  # type: ignore[operator]
    gen.report_settings = kind in ("native", "infill")
    back = M.decode(M.encode(M.Generate.from_request("gen-1", gen, "m"))).to_request()  # type: ignore[union-attr]
    carried = [f.name for f in dataclasses.fields(GenRequest) if f.name not in NOT_ON_THE_BUS]
    assert {f: getattr(back, f) for f in carried} == {f: getattr(gen, f) for f in carried}


def test_generate_sends_cache_prompt_only_when_set() -> None:
    unset = M.encode(M.Generate.from_request("gen-1", GenRequest(prompt="x"), None))
    assert b"cache_prompt" not in unset[2]  # an engine of an earlier release refuses fields it does not know
    assert M.decode(M.encode(M.Generate.from_request("gen-1", GenRequest(prompt="x", cache_prompt=False), None))
                    ).cache_prompt is False  # type: ignore[union-attr]


@pytest.mark.parametrize("frames, words", [
    ([], "expected 3 frames"),
    ([M.PROTOCOL, b"PING"], "expected 3 frames"),
    ([M.PROTOCOL, b"PING", b"{}", b"extra"], "expected 3 frames"),
    ([b"other/9", b"PING", b"{}"], "unknown protocol"),
    ([M.PROTOCOL, b"NOPE", b"{}"], "unknown message kind"),
    ([M.PROTOCOL, b"HEARTBEAT", b"{not json"], "HEARTBEAT"),
    ([M.PROTOCOL, b"HEARTBEAT", b"{}"], "status"),
    ([M.PROTOCOL, b"TOKENS", b'{"req": "g", "texts": []}'], "texts"),
    ([M.PROTOCOL, b"TOKENS", b'{"req": "bad id!", "texts": ["x"]}'], "req"),
    ([M.PROTOCOL, b"REGISTER", json.dumps({"engine": "a b", "instance": "1", "version": "0"}).encode()], "engine"),
    ([M.PROTOCOL, b"PING", b'{"surprise": 1}'], "surprise"),
    ([M.PROTOCOL, b"PING", b"\xff\xfe"], "PING"),
    ([M.PROTOCOL, b"PING", b"[" * 100_000], "PING"),
    ([M.PROTOCOL, b"ERROR", b'{"req": "g", "message": "x", "status": 99}'], "status"),
])
def test_malformed_frames_give_a_typed_error(frames: list[bytes], words: str) -> None:
    with pytest.raises(M.BusDecodeError) as info:
        M.decode(frames)
    assert words in info.value.reason


STREAM = [M.Tokens(req="g-1", texts=["Hel", "lo"]), M.Tokens(req="g-2", texts=["x"]),
          M.Error(req="g-3", message="boom", status=500, code="internal_error"),
          M.Done(req="g-1", finish_reason="stop", usage=M.UsageInfo(prompt_tokens=3, completion_tokens=2))]


def test_a_batch_of_stream_messages_round_trips_in_order() -> None:
    frames = M.encode_batch([M.encode(m) for m in STREAM])
    assert len(frames) == 1 + 2 * len(STREAM) and frames[0] == M.PROTOCOL
    assert M.decode_all(frames) == STREAM
    assert M.encode_batch([M.encode(STREAM[0])]) == M.encode(STREAM[0])  # one message stays a plain one
    assert M.decode_all(M.encode(M.Ping())) == [M.Ping()]


@pytest.mark.parametrize("frames, words", [
    ([M.PROTOCOL, b"TOKENS", b'{"req": "g", "texts": ["a"]}', b"DONE"], "pairs"),
    ([], "pairs"),
    ([b"hydra-bus/1", b"TOKENS", b'{"req": "g", "texts": ["a"]}', b"TOKENS", b'{"req": "h", "texts": ["b"]}'],
     "unknown protocol"),
    ([M.PROTOCOL, b"TOKENS", b'{"req": "g", "texts": ["a"]}', b"REGISTER", b"{}"], "cannot travel in a batch"),
    ([M.PROTOCOL, b"HEARTBEAT", b"{}", b"TOKENS", b'{"req": "g", "texts": ["a"]}'], "cannot travel in a batch"),
    ([M.PROTOCOL, b"TOKENS", b'{"req": "g", "texts": ["a"]}', b"TOKENS", b'{"req": "g", "texts": []}'], "texts"),
    ([M.PROTOCOL, b"TOKENS", b'{"req": "g", "texts": ["a"]}', b"NOPE", b"{}"], "unknown message kind"),
    ([M.PROTOCOL] + [b"TOKENS", b'{"req": "g", "texts": ["a"]}'] * (M.MAX_BATCH + 1), "at most"),
])
def test_a_malformed_batch_is_refused_whole(frames: list[bytes], words: str) -> None:
    with pytest.raises(M.BusDecodeError) as info:
        M.decode_all(frames)
    assert words in info.value.reason


def test_decode_takes_no_batch() -> None:
    """A receiver that only expects single messages (the engine's side) refuses a batch as malformed."""
    with pytest.raises(M.BusDecodeError, match="expected 3 frames"):
        M.decode(M.encode_batch([M.encode(m) for m in STREAM[:2]]))


def test_oversized_body_is_refused_before_parsing() -> None:
    with pytest.raises(M.BusDecodeError, match="exceeds"):
        M.decode([M.PROTOCOL, b"PING", b" " * (M.MAX_BODY + 1)])


def test_events_round_trip_and_reject_garbage() -> None:
    ev = Event(topic="engine.up", ts=1.5, data={"engine": "dev-a", "gpu": {"arch": "sm_90"}})
    assert Event.from_frames(ev.frames()) == ev
    for bad in ([b"x"], [b"x", b"nope"], [b"x", b'{"topic": 1}']):
        with pytest.raises(M.BusDecodeError):
            Event.from_frames(bad)


frames_strategy = st.lists(st.binary(max_size=64), max_size=5)
kind = st.sampled_from(sorted(M.KINDS) + [b"", b"PINGX"])
json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=20),
                           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                           max_leaves=20)


@settings(max_examples=300, deadline=None)
@given(frames_strategy)
def test_arbitrary_frames_never_raise_anything_else(frames: list[bytes]) -> None:
    for decoder in (M.decode, M.decode_all):
        try:
            decoder(frames)
        except M.BusDecodeError:
            pass


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(kind, st.binary(max_size=48)), min_size=1, max_size=4), st.sampled_from([0, 1]))
def test_arbitrary_batches_decode_or_raise_the_typed_error(pairs: list[tuple[bytes, bytes]], extra: int) -> None:
    frames = [M.PROTOCOL] + [f for pair in pairs for f in pair] + [b"x"] * extra
    try:
        out = M.decode_all(frames)
    except M.BusDecodeError:
        return
    assert len(out) == len(pairs) and not extra


@settings(max_examples=300, deadline=None)
@given(kind, st.dictionaries(st.sampled_from(["req", "texts", "status", "engine", "instance", "version", "payload",
                                              "message", "ok", "load_id", "phase", "usage", "finish_reason", "x"]),
                             json_values, max_size=6))
def test_well_framed_arbitrary_json_never_raises_anything_else(k: bytes, body: dict) -> None:
    try:
        raw = json.dumps(body).encode()
    except ValueError:
        return
    try:
        msg = M.decode([M.PROTOCOL, k, raw])
    except M.BusDecodeError:
        return
    assert type(msg).KIND == k


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(SAMPLES), st.integers(min_value=0, max_value=400), st.binary(min_size=1, max_size=4))
def test_corrupted_bodies_never_raise_anything_else(msg: M._Msg, at: int, junk: bytes) -> None:
    proto, k, body = M.encode(msg)
    at = min(at, len(body))
    try:
        M.decode([proto, k, body[:at] + junk + body[at:]])
    except M.BusDecodeError:
        pass


def test_register_device_is_optional_both_ways() -> None:
    """``device`` (the engine's GPU binding) is new in REGISTER: an older engine's REGISTER without
    it decodes, and an unbound engine does not send it, so an older coordinator still admits it."""
    old = [M.PROTOCOL, b"REGISTER", json.dumps({"engine": "a", "instance": "x.1", "version": "0"}).encode()]
    assert M.decode(old).device is None  # type: ignore[union-attr]
    assert b"device" not in M.encode(M.Register(engine="a", instance="x.1", version="0"))[2]
    bound = M.decode(M.encode(M.Register(engine="a", instance="x.1", version="0", device="0,1")))
    assert isinstance(bound, M.Register) and bound.device == "0,1"


def test_register_carries_the_weights_each_model_keeps_in_host_memory() -> None:
    """``host_weights`` (per model on disk) reaches the coordinator as sent; none is not sent at all, and
    a negative count is refused."""
    reg = M.decode(M.encode(M.Register(engine="a", instance="x.1", version="0", host_weights={"moe": 12 << 30})))
    assert isinstance(reg, M.Register) and reg.host_weights == {"moe": 12 << 30}
    assert b"host_weights" not in M.encode(M.Register(engine="a", instance="x.1", version="0"))[2]
    bad = [M.PROTOCOL, b"REGISTER", json.dumps({"engine": "a", "instance": "x.1", "version": "0",
                                                 "host_weights": {"moe": -1}}).encode()]
    with pytest.raises(M.BusDecodeError):
        M.decode(bad)


def test_bound_device_reports_what_the_backends_see() -> None:
    from hydrad.engine.gpu import bound_device
    assert bound_device(None, {}) is None
    assert bound_device("1", {}) == "1"
    assert bound_device("1", {"CUDA_VISIBLE_DEVICES": "1"}) == "1"
    assert bound_device("1", {"CUDA_VISIBLE_DEVICES": "3"}) == "3"  # an operator's drop-in won
    assert bound_device(None, {"HIP_VISIBLE_DEVICES": "0,1", "CUDA_VISIBLE_DEVICES": ""}) == "0,1"
