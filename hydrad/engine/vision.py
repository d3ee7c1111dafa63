"""Images through llama.cpp's multimodal library (mtmd): a model's vision projector (``mmproj``), a
prompt with images made into chunks, and an image chunk evaluated into a slot's KV.

The three steps run where the request path says (docs/architecture.md):

* :meth:`Vision.load` on the loader thread, with the model: the projector's GGUF header is read first
  (a file that is no vision projector fails the load naming ``mmproj``, before llama.cpp's loader, which
  asserts on some malformed files), then ``mtmd_init_from_file`` (which refuses a projector whose output
  width is not the model's).
* :meth:`Vision.prompt` on a preparation worker: each image is decoded and preprocessed (resized,
  normalised) and the prompt text tokenized around the markers (``mtmd_tokenize``). The result is a
  :class:`MediaPrompt`: the prompt's tokens, each image's positions holding *image tokens*, negative ids
  derived from the image's bytes, so a slot's token list says which image its KV holds there. Prefix
  reuse compares token lists: two prompts with the same text and different images part at the first
  image, the same image twice matches.
* :meth:`Vision.evaluate` on the engine thread, for one slot in a step of its own: the image chunk is
  encoded by the projector and its embeddings decoded into the slot's sequence
  (``mtmd_helper_eval_chunk_single``; gemma3's projector attends to an image's embeddings both ways,
  which the helper sets around its own decode, so no other slot's tokens may share that decode).
"""

from __future__ import annotations

import ctypes
import hashlib
import threading
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydrad.common.params import RuntimeParams
from hydrad.engine import gguf_meta, llama
from hydrad.wire import images as img

IMAGE_TOKEN_SPAN = 1 << 30
"""Image tokens are ids in [-2 - IMAGE_TOKEN_SPAN, -2]: never a vocabulary id, never -1 (no token)."""


def _mtmd() -> Any:
    import llama_cpp.mtmd_cpp as mtmd  # the module loads libmtmd: only an engine given a projector needs it

    return mtmd


def is_image_token(tok: int) -> bool:
    return tok < -1


def image_tokens(data: bytes, n: int) -> list[int]:
    """The ``n`` image tokens of an image file: the same for the same bytes, different for others."""
    base = int.from_bytes(hashlib.sha256(data).digest()[:8], "little")
    return [-2 - ((base + i) % IMAGE_TOKEN_SPAN) for i in range(n)]


@dataclass
class MediaPrompt:
    """A prompt with images, made for one generation's projector: its tokens (image tokens where the
    images go) and each image chunk by the position it starts at. Owns llama.cpp's chunk list (the
    preprocessed images), freed when this is dropped."""

    tokens: list[int]
    images: dict[int, tuple[Any, int]] = field(default_factory=dict)  # start -> (chunk pointer, n_tokens)
    starts: list[int] = field(default_factory=list)  # the images' starts, in order
    chunks: Any = None  # mtmd_input_chunks*, freed by the finalizer
    gen_id: int = -1

    def text_run(self, pos: int, limit: int) -> int:
        """How many tokens from ``pos`` on are text, at most ``limit`` (0: an image starts at ``pos``)."""
        for s in self.starts:
            if s >= pos:
                return min(limit, s - pos)
        return limit

    def whole(self, keep: int) -> int:
        """``keep`` moved back to the start of an image it falls inside: KV is reused whole images only."""
        for s in self.starts:
            n = self.images[s][1]
            if s < keep < s + n:
                return s
        return keep

    def drop_first(self) -> None:
        """Without its first token (a BOS the template wrote and the tokenizer added again)."""
        del self.tokens[0]
        self.images = {s - 1: v for s, v in self.images.items()}
        self.starts = [s - 1 for s in self.starts]

    @property
    def n_image_tokens(self) -> int:
        return sum(n for _, n in self.images.values())


class VisionRefused(ValueError):
    """A request's images that the projector cannot take (status 400, ``param`` the field at fault)."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


class Vision:
    """A generation's projector: llama.cpp's mtmd context over its model. Built on the loader thread,
    freed with the generation (before its model, which it reads)."""

    def __init__(self, ptr: Any, path: Path, marker: str) -> None:
        self.ptr = ptr
        self.path = path
        self.marker = marker
        self._lock = threading.Lock()  # mtmd_tokenize keeps per-context scratch state: one prompt at a time

    @classmethod
    def load(cls, model: llama.Model, params: RuntimeParams, models_dir: Path) -> Vision | None:
        """The projector ``params.mmproj`` names for ``model``, or None when it names none; LoadError
        naming ``mmproj`` for a file that is not a vision projector of this model."""
        if not params.mmproj:
            return None
        p = Path(params.mmproj).expanduser()
        path = p if p.is_absolute() else models_dir / p
        if not path.is_file():
            raise llama.LoadError(f"mmproj: no such file: {params.mmproj} (an absolute path, or one under {models_dir})")
        try:
            meta = gguf_meta.metadata(path, {"general.architecture", "clip.has_vision_encoder", "clip.projector_type",
                                             "clip.vision.projector_type"})
        except (OSError, gguf_meta.GgufError) as exc:
            raise llama.LoadError(f"mmproj: {path.name} is not a readable GGUF: {exc}") from None
        if meta.get("general.architecture") != "clip" or not meta.get("clip.has_vision_encoder"):
            raise llama.LoadError(f"mmproj: {path.name} is not a vision projector (general.architecture "
                                  f"{meta.get('general.architecture')!r}, clip.has_vision_encoder "
                                  f"{meta.get('clip.has_vision_encoder')!r})")
        mtmd = _mtmd()
        mtmd.mtmd_log_set(llama._log_cb, None)
        mtmd.mtmd_helper_log_set(llama._log_cb, None)
        cp = mtmd.mtmd_context_params_default()
        cp.use_gpu = params.n_gpu_layers != 0
        cp.print_timings = False
        cp.n_threads = params.n_threads or llama.usable_cpus()
        cp.warmup = True
        ptr, said = llama.logged(lambda: mtmd.mtmd_init_from_file(str(path).encode(), model.ptr, cp))
        if not ptr:
            why = next((ln.strip() for ln in said.splitlines() if "error" in ln.lower()), said.strip()[-300:])
            raise llama.LoadError(f"mmproj: llama.cpp refused {path.name} for {model.path.name}: {why}")
        vision = cls(ptr, path, (mtmd.mtmd_default_marker() or b"").decode())
        if not mtmd.mtmd_support_vision(ptr) or mtmd.mtmd_decode_use_mrope(ptr):
            vision.free()
            raise llama.LoadError(f"mmproj: {path.name} is not served: it has no vision encoder, or its model places "
                                  "image embeddings by M-RoPE positions, which this engine's slots do not track")
        return vision

    def free(self) -> None:
        with self._lock:
            if self.ptr:
                _mtmd().mtmd_free(self.ptr)
                self.ptr = None

    # ----- a request's prompt (a preparation worker) ---------------------------------------------

    def prompt(self, text: str, images: list[bytes], param: str, gen_id: int = -1) -> MediaPrompt:
        """``text`` (the rendered prompt, one marker per image) and ``images`` as a :class:`MediaPrompt`;
        :class:`VisionRefused` for an image llama.cpp cannot decode or markers that do not match."""
        mtmd = _mtmd()
        if text.count(img.MARKER) != len(images):
            raise VisionRefused(f"the prompt has {text.count(img.MARKER)} image markers for {len(images)} images",
                                param)
        bitmaps: list[Any] = []
        chunks = mtmd.mtmd_input_chunks_init()
        out = MediaPrompt(tokens=[], gen_id=gen_id)
        weakref.finalize(out, mtmd.mtmd_input_chunks_free, chunks)
        out.chunks = chunks
        try:
            for i, data in enumerate(images):
                size = img.dimensions(data)
                if size is None or size[0] * size[1] > img.MAX_IMAGE_PIXELS:
                    raise VisionRefused(f"image {i}: not an image of at most {img.MAX_IMAGE_PIXELS} pixels", param)
                buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
                with self._lock:
                    if not self.ptr:
                        raise llama.ModelFreed("the projector was unloaded while the prompt was being prepared")
                    bmp = mtmd.mtmd_helper_bitmap_init_from_buf(self.ptr, buf, len(data), False)
                if not bmp:
                    raise VisionRefused(f"image {i}: llama.cpp could not decode it", param)
                bitmaps.append(bmp)
            raw = text.encode("utf-8")
            inp = mtmd.mtmd_input_text(raw, len(raw), True, True)
            arr = (mtmd.mtmd_bitmap_p_ctypes * max(1, len(bitmaps)))(*bitmaps)
            with self._lock:
                if not self.ptr:
                    raise llama.ModelFreed("the projector was unloaded while the prompt was being prepared")
                rc = mtmd.mtmd_tokenize(self.ptr, chunks, ctypes.byref(inp), arr, len(bitmaps))
            if rc != 0:
                raise VisionRefused({1: "the image markers do not match the images",
                                     2: "an image could not be preprocessed"}.get(rc, f"mtmd_tokenize failed ({rc})"),
                                    param)
        finally:
            for bmp in bitmaps:
                mtmd.mtmd_bitmap_free(bmp)
        n_image = 0
        for j in range(mtmd.mtmd_input_chunks_size(chunks)):
            chunk = mtmd.mtmd_input_chunks_get(chunks, j)
            if mtmd.mtmd_input_chunk_get_type(chunk) == mtmd.MTMD_INPUT_CHUNK_TYPE_TEXT:
                n = ctypes.c_size_t(0)
                toks = mtmd.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(n))
                out.tokens.extend(toks[i] for i in range(n.value))
                continue
            n_tok = int(mtmd.mtmd_input_chunk_get_n_tokens(chunk))
            if mtmd.mtmd_input_chunk_get_type(chunk) != mtmd.MTMD_INPUT_CHUNK_TYPE_IMAGE or n_image >= len(images):
                raise VisionRefused("the prompt holds media other than images", param)
            start = len(out.tokens)
            out.images[start] = (chunk, n_tok)
            out.starts.append(start)
            out.tokens.extend(image_tokens(images[n_image], n_tok))
            n_image += 1
        if out.tokens and is_image_token(out.tokens[-1]):
            raise VisionRefused("the prompt may not end with an image: text must follow it", param)
        return out

    # ----- evaluation (the engine thread) ---------------------------------------------------------

    def evaluate(self, ctx: llama.Context, media: MediaPrompt, pos: int, seq: int) -> int:
        """Encode the image starting at ``pos`` and decode its embeddings into sequence ``seq`` at its
        positions; returns how many tokens it filled. RuntimeError when llama.cpp fails."""
        chunk, n_tok = media.images[pos]
        mtmd = _mtmd()
        new_pos = llama.lib().llama_pos(0)
        rc = mtmd.mtmd_helper_eval_chunk_single(self.ptr, ctx.ptr, chunk, pos, seq, ctx.n_batch, False,
                                                ctypes.byref(new_pos))
        if rc != 0:
            raise RuntimeError(f"evaluating the image failed (mtmd_helper_eval_chunk_single returned {rc})")
        if new_pos.value != pos + n_tok:
            raise RuntimeError(f"the image took positions {pos}..{new_pos.value}, not {n_tok}")
        return n_tok
