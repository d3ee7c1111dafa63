"""A tiny vision projector (mmproj) for the Gemma-3-270M text model, written with the ``gguf`` package.

Real projectors are hundreds of megabytes; what the image path needs tested is that llama.cpp's
multimodal library (mtmd) loads a projector beside the model, turns an image into embeddings and that
the engine evaluates them in a slot's prefill, not what the model then says. So this writes a
projector of the ``gemma3`` type (the one Gemma 3's vision models use: a SigLIP-style ViT, an average
pool, an RMS norm and a projection to the text model's embedding width) with one ViT block of
width 32 and random weights, a few hundred kilobytes:

* ``image_size`` 64 and ``patch_size`` 8: an image is resized to 64×64, cut into 8×8 patches;
* ``clip.vision.projector.scale_factor`` 2: the pool merges 2×2 patches, so every image becomes
  ``IMAGE_TOKENS`` = 16 embeddings, whatever its size;
* the projection's output width is the text model's ``n_embd`` (640 for Gemma-3-270M); mtmd refuses
  a projector whose width differs from its model's (which :func:`write_projector` can be asked to
  do, for the refusal's test).

The text model is the real Gemma-3-270M of ``./models``: its vocabulary has the
``<start_of_image>``/``<end_of_image>`` tokens mtmd puts around a gemma3 image.

:func:`tiny_png` writes small PNGs (solid colours) with the standard library alone, so tests
need no imaging package to make an image.
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import numpy as np

IMAGE_SIZE = 64
PATCH_SIZE = 8
MERGE = 2
IMAGE_TOKENS = (IMAGE_SIZE // PATCH_SIZE // MERGE) ** 2
GEMMA_EMBD = 640


def write_projector(path: Path, *, text_embd: int = GEMMA_EMBD, seed: int = 0, embd: int = 32,
                    heads: int = 2, ff: int = 64, layers: int = 1) -> Path:
    """Write a ``gemma3`` mmproj GGUF of random f32 weights at ``path``; return ``path``."""
    import gguf

    rng = np.random.default_rng(seed)

    def w(*shape: int) -> np.ndarray:
        """A weight of numpy shape ``shape`` (GGUF's ne reversed), scaled by 1/sqrt(fan-in)."""
        return (rng.standard_normal(shape, dtype=np.float32) / np.sqrt(shape[-1])).astype(np.float32)

    def ones(n: int) -> np.ndarray:
        return np.ones(n, dtype=np.float32)

    def zeros(n: int) -> np.ndarray:
        return np.zeros(n, dtype=np.float32)

    tmp = path.with_name(path.name + ".tmp")
    writer = gguf.GGUFWriter(str(tmp), "clip")
    writer.add_name("tiny-gemma3-mmproj")
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_bool("clip.has_vision_encoder", True)
    writer.add_string("clip.projector_type", "gemma3")
    writer.add_uint32("clip.vision.image_size", IMAGE_SIZE)
    writer.add_uint32("clip.vision.patch_size", PATCH_SIZE)
    writer.add_uint32("clip.vision.embedding_length", embd)
    writer.add_uint32("clip.vision.feed_forward_length", ff)
    writer.add_uint32("clip.vision.block_count", layers)
    writer.add_uint32("clip.vision.projection_dim", text_embd)
    writer.add_uint32("clip.vision.attention.head_count", heads)
    writer.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-6)
    writer.add_uint32("clip.vision.projector.scale_factor", MERGE)
    writer.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
    writer.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])
    writer.add_bool("clip.use_gelu", True)

    n_patches = (IMAGE_SIZE // PATCH_SIZE) ** 2
    # patch embedding: a conv of ne [patch, patch, 3, embd]
    writer.add_tensor("v.patch_embd.weight", w(embd, 3, PATCH_SIZE, PATCH_SIZE))
    writer.add_tensor("v.patch_embd.bias", zeros(embd))
    writer.add_tensor("v.position_embd.weight", w(n_patches, embd))
    for i in range(layers):
        b = f"v.blk.{i}"
        for part in ("attn_q", "attn_k", "attn_v", "attn_out"):
            writer.add_tensor(f"{b}.{part}.weight", w(embd, embd))
            writer.add_tensor(f"{b}.{part}.bias", zeros(embd))
        for norm in ("ln1", "ln2"):
            writer.add_tensor(f"{b}.{norm}.weight", ones(embd))
            writer.add_tensor(f"{b}.{norm}.bias", zeros(embd))
        writer.add_tensor(f"{b}.ffn_up.weight", w(ff, embd))
        writer.add_tensor(f"{b}.ffn_up.bias", zeros(ff))
        writer.add_tensor(f"{b}.ffn_down.weight", w(embd, ff))
        writer.add_tensor(f"{b}.ffn_down.bias", zeros(embd))
    writer.add_tensor("v.post_ln.weight", ones(embd))
    writer.add_tensor("v.post_ln.bias", zeros(embd))
    # gemma3's projection: soft-embedding RMS norm, then ne [text_embd, embd] (applied transposed)
    writer.add_tensor("mm.soft_emb_norm.weight", ones(embd))
    writer.add_tensor("mm.input_projection.weight", w(embd, text_embd))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tmp.replace(path)
    return path


def tiny_png(rgb: tuple[int, int, int], *, width: int = 16, height: int = 16) -> bytes:
    """A ``width``×``height`` PNG of one colour (8-bit RGB, no filter), made with zlib alone."""
    row = b"\x00" + bytes(rgb) * width
    raw = row * height

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")
