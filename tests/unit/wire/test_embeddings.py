"""The embedding requests' parsing and bounds, and llama-server's normalisations, without a model."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from hydrad.engine.embedder import as_base64, normalized
from hydrad.wire import embeddings as wire
from hydrad.wire.openai import ApiError


def _openai(body: dict[str, Any], n_vocab: int | None = 100) -> wire.EmbedRequest:
    return wire.parse_openai(json.dumps(body).encode(), n_vocab)


def test_input_shapes() -> None:
    assert _openai({"input": "hi"}).inputs == ["hi"]
    assert _openai({"input": [1, 2, 3]}).inputs == [[1, 2, 3]]
    assert _openai({"input": ["a", [4, 5], "b"]}).inputs == ["a", [4, 5], "b"]
    # llama-server's mixed prompt: a list with a token id and strings is one input; objects of text
    assert _openai({"input": [12, 34, "string", 56]}).inputs == [[12, 34, "string", 56]]
    assert _openai({"input": [[12, 34], [12, "s", 34]]}).inputs == [[12, 34], [12, "s", 34]]
    assert _openai({"input": {"prompt_string": "p"}}).inputs == ["p"]
    assert _openai({"input": {"content": [{"type": "text", "text": "a "}, {"type": "text", "text": "b"}]}}).inputs \
        == ["a b"]
    assert _openai({"input": ["s1", {"prompt_string": "s2"}, {"content": [{"type": "text", "text": "s3"}]}]}).inputs \
        == ["s1", "s2", "s3"]
    req = _openai({"input": "x", "encoding_format": "base64", "dimensions": 8, "embd_normalize": None, "other": 1})
    assert req.base64 and req.dimensions == 8 and req.normalize == 2 and req.field == "input"
    native = wire.parse_native(json.dumps({"content": ["a", [1]], "embd_normalize": -1}).encode())
    assert native.inputs == ["a", [1]] and native.normalize == -1 and native.field == "content"


@pytest.mark.parametrize("body, param", [
    ({}, "input"), ({"input": ""}, "input"), ({"input": []}, "input"), ({"input": [[]]}, "input"),
    ({"input": [100]}, "input"), ({"input": [False]}, "input"), ({"input": [[1, None]]}, "input"),
    ({"input": {"content": "string"}}, "input"), ({"input": {"content": [{"type": "unknown"}]}}, "input"),
    ({"input": {"content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}}, "input"),
    ({"input": {"prompt_string": "x", "other": 1}}, "input"), ({"input": {"prompt_string": ""}}, "input"),
    ({"input": {"prompt_string": "x", "multimodal_data": ["AAAA"]}}, "input"),
    # bounded before any tokenizing: ids and text pieces in all, and characters in all
    ({"input": [[1] * 40_000, [2, "a"] * 15_000]}, "input"), ({"input": ["x" * (1 << 21)] * 3}, "input"),
    ({"input": ["a"] * (wire.MAX_INPUTS + 1)}, "input"), ({"input": "x", "encoding_format": "hex"}, "encoding_format"),
    ({"input": "x", "dimensions": 0}, "dimensions"), ({"input": "x", "dimensions": True}, "dimensions"),
    ({"input": "x", "embd_normalize": wire.MAX_NORM + 1}, "embd_normalize"),
    ({"input": "x", "embd_normalize": 2.0}, "embd_normalize"), ({"input": "x", "model": ""}, "model"),
    ({"input": "x", "model": "a\nb"}, "model"), ({"input": "x", "user": ["u"]}, "user"),
])
def test_bad_fields_named(body: dict[str, Any], param: str) -> None:
    with pytest.raises(ApiError) as err:
        _openai(body)
    assert err.value.status == 400 and err.value.param == param


def test_too_much_to_tokenize_is_refused_before_it_is_tokenized() -> None:
    with pytest.raises(ApiError) as err:
        _openai({"input": [[1] * 40_000, [2, "a"] * 15_000]})
    assert err.value.code == "input_too_long" and "70000 token ids and text pieces" in str(err.value)
    assert _openai({"input": [[1] * 40_000, [2, "a"] * 12_000]}).inputs[0] == [1] * 40_000  # 64,000: within


def test_native_refuses_unknown_and_both_texts() -> None:
    for body, param in (({"content": "x", "dimensions": 3}, "dimensions"), ({"content": "x", "input": "y"}, "content"),
                        ({}, "content")):
        with pytest.raises(ApiError) as err:
            wire.parse_native(json.dumps(body).encode())
        assert err.value.param == param


def test_sizes() -> None:
    req = _openai({"input": ["a", "b"], "dimensions": 4})
    wire.check_sizes(req, [[1] * 8, [2]], max_tokens=8, n_embd=4, pooled=True)
    with pytest.raises(ApiError, match=r"input\[0\] has 9 tokens"):
        wire.check_sizes(req, [[1] * 9, [2]], max_tokens=8, n_embd=4, pooled=True)
    with pytest.raises(ApiError, match="cannot be shortened"):
        wire.check_sizes(req, [[1], [2]], max_tokens=8, n_embd=5, pooled=True)
    with pytest.raises(ApiError, match="numbers"):
        wire.check_sizes(_openai({"input": "x"}), [[1] * 4000], max_tokens=4096, n_embd=2048, pooled=False)


def test_normalisations() -> None:
    v = [3.0, -4.0]
    assert [round(x, 6) for x in normalized(v, 2)] == [0.6, -0.8]
    assert [round(x, 6) for x in normalized(v, 1)] == [round(3 / 7, 6), round(-4 / 7, 6)]
    assert [round(x, 2) for x in normalized(v, 0)] == [round(3 * 32760 / 4, 2), -32760.0]
    assert list(normalized(v, -1)) == v
    big = normalized([1e30, 2e30], 32)  # no overflow: the p-norm of a scaled vector
    assert all(math.isfinite(x) for x in big) and abs(big[1] - 1.0) < 1e-6
    assert list(normalized([0.0, 0.0], 2)) == [0.0, 0.0]
    assert as_base64([1.0]) == "AACAPw=="
