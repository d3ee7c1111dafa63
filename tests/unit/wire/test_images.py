"""How the doors read images (hydrad.wire.images and its callers): data URIs and base64 bounded before
they are decoded, a picture's size read from its header, remote URLs refused by name, the markers of a
prompt matched to its images, and a GENERATE carrying them unchanged."""

from __future__ import annotations

import base64
import json
import struct
from typing import Any

import pytest

from hydrad.wire import images as img
from hydrad.wire import messages as M
from hydrad.wire import native_completion, openai
from hydrad.wire.openai import ApiError
from tests.support.tinyvision import tiny_png

PNG = tiny_png((10, 20, 30), width=3, height=5)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def chat(*parts: dict[str, Any]) -> bytes:
    return json.dumps({"messages": [{"role": "user", "content": list(parts)}]}).encode()


def image_part(url: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}}


def jpeg(width: int, height: int) -> bytes:
    """The head of a baseline JPEG: SOI, an APP0 segment, then a start-of-frame with the size."""
    app0 = b"\xff\xe0" + struct.pack(">H", 16) + b"JFIF\x00" + b"\x01\x01\x00\x00\x01\x00\x01\x00\x00"
    sof = b"\xff\xc0" + struct.pack(">HBHHB", 11, 8, height, width, 1) + b"\x01\x11\x00"
    return b"\xff\xd8" + app0 + sof + b"\xff\xd9"


def test_dimensions_from_headers() -> None:
    assert img.dimensions(PNG) == (3, 5)
    assert img.dimensions(jpeg(640, 480)) == (640, 480)
    assert img.dimensions(b"GIF89a" + struct.pack("<HH", 7, 9) + b"\x00" * 8) == (7, 9)
    assert img.dimensions(b"not an image at all") is None


def test_a_chat_image_becomes_a_marker_and_its_bytes() -> None:
    _, gen = openai.parse("chat", chat({"type": "text", "text": "look "}, image_part("data:image/png;base64," + b64(PNG))))
    assert gen.messages == [{"role": "user", "content": "look " + img.MARKER}]
    assert gen.images == [PNG]
    _, plain = openai.parse("chat", chat({"type": "text", "text": "no image"}))
    assert plain.images is None


@pytest.mark.parametrize("url, status, says", [
    ("https://example.com/a.png", 400, "remote image URLs are not fetched"),
    ("http://example.com/a.png", 400, "remote image URLs are not fetched"),
    ("file:///etc/passwd", 400, "must be a data: URI"),
    ("data:image/png;base64,@@@", 400, "not valid base64"),
    ("data:image/png;base64," + b64(b"hello, world"), 400, "not a PNG"),
    ("data:image/jpeg;base64," + b64(jpeg(8000, 8000)), 413, "8000x8000 pixels"),
    ("data:image/png;base64," + "A" * (img.MAX_IMAGE_B64 + 4), 413, "base64 has"),
])
def test_bad_image_urls_are_refused_naming_the_field(url: str, status: int, says: str) -> None:
    with pytest.raises(ApiError) as exc:
        openai.parse("chat", chat({"type": "text", "text": "x"}, image_part(url)))
    assert exc.value.status == status and says in str(exc.value)
    assert exc.value.param == "messages[0].content[1].image_url.url"


def test_image_count_and_typed_markers_are_bounded() -> None:
    uri = "data:image/png;base64," + b64(PNG)
    with pytest.raises(ApiError) as exc:
        openai.parse("chat", chat(*[image_part(uri)] * (img.MAX_IMAGES + 1)))
    assert exc.value.status == 413
    with pytest.raises(ApiError) as exc:  # a marker typed as text would take an image's place
        openai.parse("chat", chat({"type": "text", "text": "see " + img.MARKER}, image_part(uri)))
    assert exc.value.status == 400 and exc.value.param == "messages"


def test_completion_multimodal_data() -> None:
    body = {"prompt": {"prompt_string": f"a {img.MARKER} b", "multimodal_data": [b64(PNG)]}, "n_predict": 1}
    _, gen = native_completion.parse(json.dumps(body).encode())
    assert gen.prompt == f"a {img.MARKER} b" and gen.images == [PNG]
    _, listed = native_completion.parse(json.dumps({**body, "prompt": [body["prompt"]]}).encode())
    assert listed.images == [PNG]
    for prompt, param in [({"prompt_string": "no marker", "multimodal_data": [b64(PNG)]}, "prompt.multimodal_data"),
                          ({"prompt_string": img.MARKER, "multimodal_data": ["%%"]}, "prompt.multimodal_data[0]"),
                          ({"prompt_string": 5}, "prompt.prompt_string"),
                          ({"prompt_string": "x", "images": []}, "prompt")]:
        with pytest.raises(ApiError) as exc:
            native_completion.parse(json.dumps({"prompt": prompt}).encode())
        assert exc.value.status == 400 and exc.value.param == param, (prompt, exc.value)


def test_a_generate_carries_the_images_as_base64() -> None:
    _, gen = openai.parse("chat", chat(image_part("data:image/png;base64," + b64(PNG)), {"type": "text", "text": "?"}))
    frames = M.encode(M.Generate.from_request("r1", gen, None))
    assert json.loads(frames[2])["images"] == [b64(PNG)]
    back = M.decode(frames)
    assert isinstance(back, M.Generate)
    req = back.to_request()
    assert req.images == [PNG] and req.messages == gen.messages
    bad = json.loads(frames[2])
    bad["images"] = ["not base64!"]
    with pytest.raises(M.BusDecodeError):
        M.decode([frames[0], frames[1], json.dumps(bad).encode()])


def test_anthropic_image_blocks() -> None:
    from hydrad.wire import anthropic

    def body(source: dict[str, Any]) -> bytes:
        return json.dumps({"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": [
            {"type": "text", "text": "what is it?"}, {"type": "image", "source": source}]}]}).encode()

    _, gen = anthropic.parse(body({"type": "base64", "media_type": "image/png", "data": b64(PNG)}))
    assert gen.messages == [{"role": "user", "content": "what is it?" + img.MARKER}] and gen.images == [PNG]
    with pytest.raises(ApiError) as exc:
        anthropic.parse(body({"type": "url", "url": "https://example.com/a.png"}))
    assert exc.value.status == 400 and exc.value.param == "messages[0].content[1].source.url"
