"""Log-probabilities on the wire: the request fields of each endpoint, the three answer shapes, the
bus fields that carry them, and llama-server's numbers in a context-overflow error."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from hydrad.wire import logprobs as lp
from hydrad.wire import messages as M
from hydrad.wire import native_completion
from hydrad.wire.openai import ApiError, overflow_details, parse
from hydrad.wire.render import native as native_render
from hydrad.wire.render.openai import chunk, full_response

USER = [{"role": "user", "content": "Hi"}]
EURO = "€".encode()  # three bytes: a token can end inside it


def tok(tid: int, piece: bytes, logprob: float, *top: tuple[int, bytes, float]) -> lp.TokenLogprob:
    return lp.TokenLogprob(tid, piece, logprob, tuple(lp.Alternative(*t) for t in top))


TOKENS = [
    tok(5, b" Paris", -0.25, (5, b" Paris", -0.25), (9, b" the", -2.5)),
    tok(7, EURO[:2], -1.0, (7, EURO[:2], -1.0)),
    tok(8, EURO[2:] + b"!", -0.5),
]


def _parse(kind: str, **body: Any) -> Any:
    raw = json.dumps(body).encode()
    return native_completion.parse(raw)[1] if kind == "native" else parse(kind, raw)[1]  # type: ignore[arg-type]


def _refused(kind: str, **body: Any) -> ApiError:
    with pytest.raises(ApiError) as ei:
        _parse(kind, **body)
    assert ei.value.status == 400
    return ei.value


# ----- request fields ---------------------------------------------------------------------------


@pytest.mark.parametrize("body, want", [
    ({}, None), ({"logprobs": False}, None), ({"logprobs": True}, 0), ({"logprobs": True, "top_logprobs": 0}, 0),
    ({"logprobs": True, "top_logprobs": 20}, 20), ({"logprobs": None, "top_logprobs": None}, None),
    ({"logprobs": False, "top_logprobs": 0}, None),
])
def test_chat_fields(body: dict[str, Any], want: int | None) -> None:
    assert _parse("chat", messages=USER, **body).logprobs == want


@pytest.mark.parametrize("body, field", [
    ({"logprobs": "yes"}, "logprobs"), ({"logprobs": 1}, "logprobs"), ({"logprobs": [True]}, "logprobs"),
    ({"logprobs": True, "top_logprobs": -1}, "top_logprobs"), ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"logprobs": True, "top_logprobs": "x"}, "top_logprobs"), ({"logprobs": True, "top_logprobs": 1e9}, "top_logprobs"),
    ({"logprobs": True, "top_logprobs": True}, "top_logprobs"), ({"logprobs": True, "top_logprobs": 2.0}, "top_logprobs"),
    ({"top_logprobs": 3}, "top_logprobs"), ({"logprobs": False, "top_logprobs": 3}, "top_logprobs"),
    ({"n_probs": 3}, "n_probs"), ({"logprobs": True, "post_sampling_probs": 1}, "post_sampling_probs"),
])
def test_chat_refusals_name_the_field(body: dict[str, Any], field: str) -> None:
    assert _refused("chat", messages=USER, **body).param == field


@pytest.mark.parametrize("value", [None, 0, 1, 5])
def test_legacy_integer(value: int | None) -> None:
    assert _parse("completion", prompt="x", logprobs=value).logprobs == value


@pytest.mark.parametrize("body, field", [
    ({"logprobs": 6}, "logprobs"), ({"logprobs": -1}, "logprobs"), ({"logprobs": True}, "logprobs"),
    ({"logprobs": "2"}, "logprobs"), ({"logprobs": 1e9}, "logprobs"), ({"top_logprobs": 2}, "top_logprobs"),
    ({"n_probs": 2}, "n_probs"),
])
def test_legacy_refusals_name_the_field(body: dict[str, Any], field: str) -> None:
    assert _refused("completion", prompt="x", **body).param == field


@pytest.mark.parametrize("value, want", [(None, None), (0, None), (1, 1), (100, 100)])
def test_native_n_probs(value: int | None, want: int | None) -> None:
    assert _parse("native", prompt="x", n_probs=value).logprobs == want


@pytest.mark.parametrize("body, field", [
    ({"n_probs": -1}, "n_probs"), ({"n_probs": 101}, "n_probs"), ({"n_probs": "3"}, "n_probs"),
    ({"n_probs": 2.5}, "n_probs"), ({"logprobs": True}, "logprobs"), ({"top_logprobs": 2}, "top_logprobs"),
    ({"n_probs": 2, "post_sampling_probs": "yes"}, "post_sampling_probs"),
    ({"n_probs": 2, "timings_per_token": 1}, "timings_per_token"),
])
def test_native_refusals_name_the_field(body: dict[str, Any], field: str) -> None:
    assert _refused("native", prompt="x", **body).param == field


def test_post_sampling_and_per_token_timings_are_carried_to_the_engine_and_over_the_bus() -> None:
    native = _parse("native", prompt="x", n_probs=2, post_sampling_probs=True, stream=True, timings_per_token=True)
    chat = _parse("chat", messages=USER, logprobs=True, post_sampling_probs=True, timings_per_token=True)
    assert native.post_sampling_probs and native.timings_per_token and native.logprobs == 2
    assert chat.post_sampling_probs and not chat.timings_per_token  # timings per token are a stream's
    back = M.Generate.from_request("r1", native, None).to_request()
    assert back.post_sampling_probs and back.timings_per_token
    assert _refused("completion", prompt="x", logprobs=2, post_sampling_probs=True).param == "post_sampling_probs"


def test_post_sampling_shape_is_llama_servers() -> None:
    post = [lp.TokenLogprob(5, b" Paris", 0.75, (lp.Alternative(5, b" Paris", 0.75), lp.Alternative(9, b" the", 0.25)))]
    (e,) = lp.content(post, post=True)
    assert e == {"id": 5, "token": " Paris", "bytes": list(b" Paris"), "prob": 0.75, "top_probs": [
        {"id": 5, "token": " Paris", "bytes": list(b" Paris"), "prob": 0.75},
        {"id": 9, "token": " the", "bytes": list(b" the"), "prob": 0.25}]}
    assert lp.render("chat", post, post=True) == {"content": [e]}
    # a probability crosses the bus where a log-probability does (0 to 1; a log-probability is at most 0)
    assert M.TokenLogprob.of(post[0]).token() == post[0]


def test_native_settings_report_n_probs() -> None:
    req, _ = native_completion.parse(json.dumps({"prompt": "x", "n_probs": 4}).encode())
    assert native_render.generation_settings(req, {}, 512, "m")["n_probs"] == 4


# ----- answer shapes ----------------------------------------------------------------------------


def test_token_text_cuts_an_incomplete_character_and_replaces_invalid_bytes() -> None:
    assert lp.token_text(EURO) == "€"
    assert lp.token_text(EURO[:2]) == ""
    assert lp.token_text(b"a" + EURO[:1]) == "a"
    assert lp.token_text(EURO[2:] + b"!") == "\ufffd!"
    assert lp.token_text(b"") == ""


def test_chat_shape() -> None:
    out = lp.render("chat", TOKENS)
    assert list(out) == ["content"] and len(out["content"]) == 3
    first = out["content"][0]
    assert first == {"id": 5, "token": " Paris", "bytes": list(b" Paris"), "logprob": -0.25, "top_logprobs": [
        {"id": 5, "token": " Paris", "bytes": list(b" Paris"), "logprob": -0.25},
        {"id": 9, "token": " the", "bytes": list(b" the"), "logprob": -2.5}]}
    assert out["content"][1]["token"] == "" and out["content"][1]["bytes"] == list(EURO[:2])
    assert out["content"][2]["top_logprobs"] == []
    assert b"".join(bytes(e["bytes"]) for e in out["content"]) == " Paris€!".encode()


def test_legacy_shape_and_offsets() -> None:
    out = lp.render("completion", TOKENS)
    assert out["tokens"] == [" Paris", "", "\ufffd!"]
    assert out["token_logprobs"] == [-0.25, -1.0, -0.5]
    # the chosen token is always in its position's dictionary ("up to logprobs + 1 elements")
    assert out["top_logprobs"] == [{" Paris": -0.25, " the": -2.5}, {"": -1.0}, {"\ufffd!": -0.5}]
    # character offsets into " Paris€!": the euro sign starts in the token that completes it
    assert out["text_offset"] == [0, 6, 6]


def test_legacy_offsets_continue_across_stream_chunks() -> None:
    offsets = lp.TextOffsets()
    parts = [lp.render("completion", [t], offsets)["text_offset"] for t in TOKENS]
    assert parts == [[0], [6], [6]]
    assert lp.render("completion", [tok(1, b"x", -1.0)], offsets)["text_offset"] == [8]


def test_responses_and_chunks_carry_logprobs_only_when_asked() -> None:
    usage = {"prompt_tokens": 1, "completion_tokens": 3, "total_tokens": 4}
    for kind in ("chat", "completion"):
        plain = full_response(kind, "id", "m", "t", "stop", usage, "fp", {})
        assert plain["choices"][0]["logprobs"] is None
        asked = full_response(kind, "id", "m", "t", "stop", usage, "fp", {}, lp.render(kind, TOKENS))
        assert asked["choices"][0]["logprobs"] == lp.render(kind, TOKENS)
        data = json.loads(chunk(kind, "id", "m", 0, "t", None, "fp", logprobs=lp.render(kind, TOKENS[:1]))[6:])
        assert data["choices"][0]["logprobs"] == lp.render(kind, TOKENS[:1])
        assert json.loads(chunk(kind, "id", "m", 0, "t", None, "fp")[6:])["choices"][0]["logprobs"] is None


def test_native_shapes() -> None:
    common = dict(content="c", finish_reason="length", stop_word=None, tokens=[], prompt_tokens=1, cached_tokens=0,
                  predicted=3, timings={}, model="m", slot=0, settings={})
    assert "completion_probabilities" not in native_render.result(**common)  # type: ignore[arg-type]
    body = native_render.result(**common, probs=TOKENS)  # type: ignore[arg-type]
    assert body["completion_probabilities"] == lp.content(TOKENS)
    piece = json.loads(native_render.chunk("c", (5,), tuple(TOKENS[:1]))[6:])
    assert piece["completion_probabilities"] == lp.content(TOKENS[:1]) and piece["stop"] is False
    assert "completion_probabilities" not in json.loads(native_render.chunk("c", (5,))[6:])


# ----- the bus ----------------------------------------------------------------------------------


def _roundtrip(msg: M._Msg) -> Any:
    return M.decode(M.encode(msg))


def test_tokens_carry_logprobs_exactly_and_only_when_asked() -> None:
    got = _roundtrip(M.Tokens(req="r1", texts=["a"], logprobs=[M.TokenLogprob.of(t) for t in TOKENS]))
    assert [p.token() for p in got.logprobs] == TOKENS
    plain = M.encode(M.Tokens(req="r1", texts=["a"]))
    assert b"logprobs" not in plain[2] and _roundtrip(M.Tokens(req="r1", texts=["a"])).logprobs is None


@pytest.mark.parametrize("body", [
    b'{"req":"r","texts":["a"],"logprobs":[{"id":1,"piece":"zz","logprob":-1}]}',
    b'{"req":"r","texts":["a"],"logprobs":[{"id":1,"piece":"abc","logprob":-1}]}',
    b'{"req":"r","texts":["a"],"logprobs":[{"id":1,"piece":"61","logprob":1.5}]}',  # above 1: neither kind of value
    b'{"req":"r","texts":["a"],"logprobs":[{"id":1,"piece":"61","logprob":-1e999}]}',
    b'{"req":"r","texts":["a"],"logprobs":[{"id":-1,"piece":"61","logprob":-1}]}',
    b'{"req":"r","texts":["a"],"logprobs":[{"id":1,"piece":"61","logprob":-1,"top":' +
    json.dumps([{"id": 1, "piece": "", "logprob": -1}] * (lp.MAX_N_PROBS + 1)).encode() + b"}]}",
])
def test_bad_logprobs_on_the_bus_are_refused(body: bytes) -> None:
    with pytest.raises(M.BusDecodeError):
        M.decode([M.PROTOCOL, b"TOKENS", body])


def test_generate_carries_the_top_count() -> None:
    gen = _parse("chat", messages=USER, logprobs=True, top_logprobs=7)
    msg = _roundtrip(M.Generate.from_request("r1", gen, None))
    assert msg.logprobs == 7 and msg.to_request().logprobs == 7
    assert _roundtrip(M.Generate.from_request("r1", _parse("chat", messages=USER), None)).to_request().logprobs is None
    with pytest.raises(ValueError):
        M.Generate(req="r1", logprobs=lp.MAX_N_PROBS + 1)  # llama-server's n_probs reaches 100


# ----- context overflow -------------------------------------------------------------------------


def test_overflow_error_has_llama_servers_numbers() -> None:
    # llama-server's type, OpenAI's code: clients of either recognise it
    err = ApiError(400, "too long", "context_length_exceeded", "messages", details=overflow_details(5000, 4096))
    assert err.body() == {"error": {"message": "too long", "type": "exceed_context_size_error",
                                    "code": "context_length_exceeded", "param": "messages",
                                    "n_prompt_tokens": 5000, "n_ctx": 4096}}
    assert overflow_details(None, None) == {} and ApiError(400, "x").body()["error"].keys() == {
        "message", "type", "code", "param"}
    # details never replace the OpenAI members
    assert ApiError(400, "x", details={"code": 1, "message": "y"}).body()["error"]["message"] == "x"


def test_bus_error_carries_the_numbers() -> None:
    got = _roundtrip(M.Error(req="r1", message="m", status=400, code="context_length_exceeded",
                             n_prompt_tokens=9000, n_ctx=4096))
    assert (got.n_prompt_tokens, got.n_ctx) == (9000, 4096)
    assert b"n_ctx" not in M.encode(M.Error(req="r1", message="m"))[2]


def test_floor_is_finite() -> None:
    assert math.isfinite(lp.FLOOR) and lp.FLOOR < -100
