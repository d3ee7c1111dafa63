"""Images in a request, as both doors read them: OpenAI chat ``image_url`` parts, Anthropic ``image``
blocks, llama-server's ``multimodal_data``. Every image arrives as base64 in the JSON body (a
``data:`` URI or a bare base64 string); what is carried on is its bytes, checked here before anything
decodes the picture:

* at most :data:`MAX_IMAGES` images a request;
* the base64 text at most :data:`MAX_IMAGE_B64` characters, checked before it is decoded;
* a PNG, JPEG, GIF, BMP or WebP by its first bytes, whose width × height (read from its header, not
  by decoding it) is at most :data:`MAX_IMAGE_PIXELS`: llama.cpp's decoder allocates 3 bytes a pixel
  before it looks at the rest, so a 100-byte PNG claiming 60,000 × 60,000 pixels is refused here;
* remote ``http(s)`` URLs are refused by name: the doors never fetch from the network on a
  client's say-so.

In the prompt each image is :data:`MARKER` (llama.cpp's multimodal marker, ``mtmd_default_marker``),
which the engine's projector replaces with the image's embeddings; a text part holding the marker
itself is refused, so the markers of a request are exactly its images.
"""

from __future__ import annotations

import base64
import binascii
import re
import struct
from typing import Any

MARKER = "<__media__>"
MAX_IMAGES = 16
MAX_IMAGE_B64 = 8 << 20
"""Base64 characters of one image (6 MiB of image data); the body limit bounds their sum."""
MAX_IMAGE_PIXELS = 4096 * 4096

_DATA_URI = re.compile(r"^data:(image/[A-Za-z0-9.+-]+)?(;[A-Za-z0-9=._+-]+)*;base64,", re.ASCII)


class ImageRefused(ValueError):
    """An image a door refuses: the message, the field at fault (``param``) and the HTTP status."""

    def __init__(self, message: str, param: str, status: int = 400) -> None:
        super().__init__(f"{param}: {message}")
        self.param = param
        self.status = status
        self.code = "image_too_large" if status == 413 else "invalid_image"


def dimensions(data: bytes) -> tuple[int, int] | None:
    """(width, height) from an image file's header, without decoding it; None when ``data`` is none of
    the formats llama.cpp's decoder reads that this knows (PNG, JPEG, GIF, BMP, WebP)."""
    if data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) >= 24:
        w, h = struct.unpack(">II", data[16:24])
        return w, h
    if data[:6] in (b"GIF87a", b"GIF89a") and len(data) >= 10:
        w, h = struct.unpack("<HH", data[6:10])
        return w, h
    if data[:2] == b"BM" and len(data) >= 26:
        w, h = struct.unpack("<ii", data[18:26])
        return abs(w), abs(h)
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP" and len(data) >= 30:
        kind = data[12:16]
        if kind == b"VP8X":
            return 1 + int.from_bytes(data[24:27], "little"), 1 + int.from_bytes(data[27:30], "little")
        if kind == b"VP8 ":
            w, h = struct.unpack("<HH", data[26:30])
            return w & 0x3FFF, h & 0x3FFF
        if kind == b"VP8L" and len(data) >= 25:
            bits = int.from_bytes(data[21:25], "little")
            return 1 + (bits & 0x3FFF), 1 + ((bits >> 14) & 0x3FFF)
        return None
    if data[:2] == b"\xff\xd8":
        return _jpeg_dimensions(data)
    return None


def _jpeg_dimensions(data: bytes) -> tuple[int, int] | None:
    """A JPEG's size from its first start-of-frame marker (walking the segments, not the image)."""
    i = 2
    while i + 4 <= len(data):
        if data[i] != 0xFF:
            return None
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:
            i += 2
            continue
        (length,) = struct.unpack(">H", data[i + 2:i + 4])
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            if i + 9 > len(data):
                return None
            h, w = struct.unpack(">HH", data[i + 5:i + 9])
            return w, h
        i += 2 + length
    return None


def decode_base64(text: Any, param: str) -> bytes:
    """One image given as base64 (a bare string or a ``data:`` URI's payload), bounded and checked."""
    if not isinstance(text, str) or not text:
        raise ImageRefused("an image must be a non-empty base64 string", param)
    if len(text) > MAX_IMAGE_B64:
        raise ImageRefused(f"the image's base64 has {len(text)} characters; at most {MAX_IMAGE_B64} are accepted",
                           param, 413)
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ImageRefused("the image is not valid base64", param) from None
    size = dimensions(data)
    if size is None:
        raise ImageRefused("the image is not a PNG, JPEG, GIF, BMP or WebP file", param)
    w, h = size
    if w <= 0 or h <= 0:
        raise ImageRefused(f"the image's header says {w}x{h} pixels", param)
    if w * h > MAX_IMAGE_PIXELS:
        raise ImageRefused(f"the image has {w}x{h} pixels; at most {MAX_IMAGE_PIXELS} are accepted", param, 413)
    return data


def from_url(url: Any, param: str) -> bytes:
    """An ``image_url``'s image: a ``data:`` URI holding base64. A remote URL is refused by name."""
    if not isinstance(url, str):
        raise ImageRefused("must be a string (a data: URI)", param)
    m = _DATA_URI.match(url[:256])
    if m is None:
        if url[:8].lower().startswith(("http://", "https://")):
            raise ImageRefused("remote image URLs are not fetched; send the image inline as a data: URI "
                               "(data:image/png;base64,...)", param)
        raise ImageRefused("must be a data: URI holding base64 (data:image/png;base64,...)", param)
    return decode_base64(url[m.end():], param)


def check_text(text: str, param: str) -> None:
    """Text beside images may not hold the image marker: the markers of a prompt are its images."""
    if MARKER in text:
        raise ImageRefused(f"text may not contain {MARKER}, which marks where an image goes", param)


def openai_part(part: dict[str, Any], param: str) -> bytes:
    """An OpenAI chat content part of type ``image_url`` (``{"image_url": {"url": ...}}`` or the
    URL as a string)."""
    ref = part.get("image_url")
    url = ref.get("url") if isinstance(ref, dict) else ref
    return from_url(url, f"{param}.image_url.url" if isinstance(ref, dict) else f"{param}.image_url")


def anthropic_block(block: dict[str, Any], param: str) -> bytes:
    """An Anthropic ``image`` block: ``source`` of type ``base64`` (``url`` sources are refused by name)."""
    src = block.get("source")
    if not isinstance(src, dict):
        raise ImageRefused("an image block needs a source", f"{param}.source")
    if src.get("type") == "url":
        raise ImageRefused("remote image URLs are not fetched; send the image as a base64 source",
                           f"{param}.source.url")
    if src.get("type") != "base64":
        raise ImageRefused("the source must be of type base64", f"{param}.source.type")
    return decode_base64(src.get("data"), f"{param}.source.data")


def count_ok(n: int, param: str) -> None:
    if n > MAX_IMAGES:
        raise ImageRefused(f"{n} images; at most {MAX_IMAGES} a request", param, 413)
