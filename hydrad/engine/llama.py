"""Thin typed layer over llama-cpp-python's low-level ctypes API.

Only the engine thread (and the loader thread while it builds a model) touches these objects,
with one exception: :meth:`Model.tokenize` may run on any thread (a large prompt is tokenized
off the engine thread), so a model counts its tokenizing readers and ``free`` waits for them.
The high-level ``llama_cpp.Llama`` class is not used: it owns one sequence, while the engine
needs many slots in one context and one ``llama_decode`` per step for all of them.
``llama_cpp`` is imported lazily so the daemon is listening before the library is loaded.
"""

from __future__ import annotations

import ctypes
import logging
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from hydrad.engine.loadreport import LoadReport
from hydrad.engine import tokenchunks
from hydrad.engine.modelparams import BuftOverride, load_failure, load_mode
from hydrad.common.cpus import usable_cpus
from hydrad.common.modeloverrides import KvOverride, parse_kv_override
from hydrad.common.params import RuntimeParams

_lib: Any = None
_PLACEHOLDER = re.compile("\x1a(\\d+)\x1a")
_lib_lock = threading.Lock()
_log = logging.getLogger("hydrad.llama")
_LOG_LEVELS = {"debug": 1, "info": 2, "warning": 3, "error": 4}
_llama_log_min = 3
_log_cb: Any = None  # keeps the ctypes callback alive for the life of the process
_log_partial: list[str] = []
_capture = threading.local()  # .text: llama.cpp's log of this thread, every level, while a load reads it


def lib() -> Any:  # the llama_cpp module: its ctypes functions are untyped
    """Import llama_cpp once, initialise the backend and route its logs into ours."""
    global _lib, _log_cb
    with _lib_lock:
        if _lib is None:
            import llama_cpp as mod

            def _on_log(level: int, text: bytes | None, _user: Any) -> None:
                msg = (text or b"").decode("utf-8", "replace")
                captured = getattr(_capture, "text", None)
                if captured is not None:
                    captured.append(msg)
                if level == 5:  # GGML_LOG_LEVEL_CONT: continuation of the previous line
                    _log_partial.append(msg)
                    return
                line = ("".join(_log_partial) + msg).rstrip()
                _log_partial.clear()
                if line and level >= _llama_log_min:
                    _log.log({1: 10, 2: 20, 3: 30, 4: 40}.get(level, 20), line)

            _log_cb = mod.llama_log_callback(_on_log)
            mod.llama_log_set(_log_cb, ctypes.c_void_p(0))
            mod.llama_backend_init()
            # Register every backend (and initialise CUDA) here, once, under the lock: the ggml RPC server
            # thread, the loader thread and device queries would otherwise race into that lazy
            # initialisation from several threads, which crashes the CUDA build.
            mod.llama_supports_gpu_offload()
            _lib = mod
    return _lib


def preload_native() -> None:
    """dlopen libllama (and with it libggml and its backends) before any other extension that links
    the C++ runtime. On the GPU machine, importing numpy first made llama.cpp crash inside std::regex
    while loading a vocabulary: its C++ symbols had been bound to another copy of the runtime. Only
    the shared objects are loaded here (tens of milliseconds); the Python binding and the backend
    initialisation stay lazy so the daemon is listening within a second."""
    import importlib.util

    override = os.environ.get("LLAMA_CPP_LIB_PATH")
    if override:
        base = Path(override)
    else:
        spec = importlib.util.find_spec("llama_cpp")
        if spec is None or spec.origin is None:
            return
        base = Path(spec.origin).parent / "lib"
    lib_path = base / "libllama.so"
    if lib_path.exists():
        ctypes.CDLL(str(lib_path), mode=ctypes.RTLD_GLOBAL)


def logged(call: Callable[[], Any]) -> tuple[Any, str]:
    """``call()`` and what llama.cpp logged on this thread meanwhile, every level (why it refused)."""
    _capture.text = []
    try:
        result = call()
    finally:
        text, _capture.text = "".join(_capture.text), None
    return result, text


def set_llama_log_level(level: str) -> None:
    global _llama_log_min
    _llama_log_min = _LOG_LEVELS.get(level, 3)


_KV_TAGS = {"int": 0, "float": 1, "bool": 2, "str": 3}  # llama_model_kv_override_type


def kv_override_array(items: list[KvOverride]) -> Any:
    """``llama_model_params.kv_overrides``: one ``llama_model_kv_override`` per entry, then one whose key
    is empty, which ends the list (as llama-server terminates its own)."""
    C = lib()
    arr = (C.llama_model_kv_override * (len(items) + 1))()  # zeroed: the last entry's key is ""
    for slot, kv in zip(arr, items):
        slot.key = kv.key.encode()
        slot.tag = _KV_TAGS[kv.type]
        if kv.type == "int":
            slot.value.val_i64 = int(kv.value)
        elif kv.type == "float":
            slot.value.val_f64 = float(kv.value)
        elif kv.type == "bool":
            slot.value.val_bool = bool(kv.value)
        else:
            slot.value.val_str = str(kv.value).encode()
    return arr


_CACHE_TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8, "iq4_nl": 20, "bf16": 30}
_SPLIT = {"none": 0, "layer": 1, "row": 2}
_ROPE = {"model": -1, "none": 0, "linear": 1, "yarn": 2, "longrope": 3}
_FLASH = {"auto": -1, "off": 0, "on": 1}
class LoadError(RuntimeError):
    """llama.cpp refused the model or the context; the message says which and why."""


class PromptTextTooLong(ValueError):
    """A chat's prompt text, as its template renders it, longer than the caller's bound: refused
    before it is tokenized (``chars`` says how long)."""

    def __init__(self, chars: int) -> None:
        super().__init__(f"the chat's prompt has {chars} characters")
        self.chars = chars


class ModelFreed(RuntimeError):
    """The model went away (a reload retired it) while another thread was using its vocabulary."""


class LoadAborted(LoadError):
    """The progress callback asked llama.cpp to stop (a newer configure superseded the load)."""


@dataclass
class ModelInfo:
    path: str
    desc: str
    arch: str
    size_bytes: int
    n_params: int
    n_layer: int
    n_embd: int
    n_head_kv: int
    n_ctx_train: int
    n_vocab: int


@dataclass(frozen=True)
class Specials:
    """What a model's special tokens mean for tokenizing: the ids only special parsing matches
    (:meth:`Model.has_special_text`) and where a long prompt may be cut (:mod:`tokenchunks`)."""

    controls: frozenset[int]
    marker: tokenchunks.Marker | None


_SPECIAL_ATTRS = 1 | 8 | 16  # llama_token_attr UNKNOWN | CONTROL | USER_DEFINED: what llama.cpp cuts a text at
_PARSED_ONLY_ATTRS = 1 | 8  # UNKNOWN | CONTROL: what it matches only with special parsing


class Model:
    """A loaded GGUF: weights, vocabulary, chat template, token pieces."""

    def __init__(self, ptr: Any, path: Path, keep: list[Any] | None = None,
                 report: LoadReport | None = None) -> None:
        C = lib()
        self.ptr = ptr
        self.path = path
        # What llama_model_params pointed into (the device list, the tensor overrides and their patterns):
        # llama.cpp keeps the struct with the model and reads the overrides again after the load (its
        # has_tensor_overrides(), when a context is made), so they live exactly as long as the model.
        self._keep = keep or []
        self.report = report or LoadReport()
        self.vocab = C.llama_model_get_vocab(ptr)
        self.n_vocab = C.llama_vocab_n_tokens(self.vocab)
        self._pieces: dict[int, bytes] = {}
        self._piece_buf = ctypes.create_string_buffer(256)
        self._readers = 0  # threads inside tokenize(); free() waits for them
        self._readers_cv = threading.Condition()
        self._specials: Specials | None = None  # read at the first need (specials())
        self._specials_lock = threading.Lock()
        self.info = ModelInfo(
            path=str(path),
            desc=self._desc(),
            arch=self.meta("general.architecture") or "unknown",
            size_bytes=C.llama_model_size(ptr),
            n_params=C.llama_model_n_params(ptr),
            n_layer=C.llama_model_n_layer(ptr),
            n_embd=C.llama_model_n_embd(ptr),
            n_head_kv=C.llama_model_n_head_kv(ptr),
            n_ctx_train=C.llama_model_n_ctx_train(ptr),
            n_vocab=self.n_vocab,
        )
        tmpl = C.llama_model_chat_template(ptr, None)
        self.chat_template: bytes | None = tmpl if tmpl else None
        if self.chat_template is None:
            # Some GGUFs ship without tokenizer.chat_template; pick llama.cpp's built-in one for the family.
            fallback = "gemma" if self.info.arch.startswith("gemma") else "chatml"
            self.chat_template = fallback.encode()
            _log.warning("model %s has no chat template; using built-in '%s'", path.name, fallback)

    @classmethod
    def load(cls, path: Path, params: RuntimeParams, progress: Callable[[float], bool] | None = None,
             devices: list[int] | None = None, overrides: list[tuple[str, int]] | None = None) -> "Model":
        """Load ``path``. ``devices`` (ggml device handles, peers' included) and ``overrides``
        ((tensor-name regex, buffer type) pairs) replace llama.cpp's own choice of where tensors go;
        :func:`hydrad.engine.placement.plan` makes them."""
        C = lib()
        mp = C.llama_model_default_params()
        mp.n_gpu_layers = 999 if params.n_gpu_layers < 0 else params.n_gpu_layers
        mp.split_mode = _SPLIT[params.split_mode]
        mp.main_gpu = params.main_gpu
        mp.load_mode = load_mode(params)
        mp.no_host = params.no_host
        mp.check_tensors = params.check_tensors
        keep: list[Any] = []
        split = params.tensor_split
        if devices is not None:  # [] = no device at all (devices: ['none']); None = llama.cpp's own choice
            devs = (ctypes.c_void_p * (len(devices) + 1))(*devices, None)
            keep.append(devs)
            mp.devices = ctypes.cast(devs, ctypes.c_void_p)
        if overrides:
            patterns = [pat.encode() for pat, _ in overrides]
            ov = (BuftOverride * (len(overrides) + 1))(
                *[BuftOverride(pat, buft) for pat, (_, buft) in zip(patterns, overrides)], BuftOverride(None, None))
            keep += [patterns, ov]
            mp.tensor_buft_overrides = ctypes.cast(ov, ctypes.c_void_p)
        if params.kv_overrides:
            kv = kv_override_array([parse_kv_override(item) for item in params.kv_overrides])
            keep.append(kv)
            mp.kv_overrides = ctypes.cast(kv, ctypes.POINTER(C.llama_model_kv_override))
        if split:
            arr = (ctypes.c_float * 128)(*split)
            keep.append(arr)
            mp.tensor_split = ctypes.cast(arr, ctypes.POINTER(ctypes.c_float))
        aborted = threading.Event()
        if progress is not None:
            def _cb(value: float, _user: Any) -> bool:
                try:
                    ok = bool(progress(float(value)))
                except Exception:  # a callback error must not unwind through C
                    _log.exception("progress callback failed")
                    ok = True
                if not ok:
                    aborted.set()
                return ok
            cb = C.llama_progress_callback(_cb)
            keep.append(cb)
            mp.progress_callback = cb
        _capture.text = []  # llama.cpp logs the load on this thread: what it did with the parameters
        try:
            ptr = C.llama_model_load_from_file(str(path).encode(), mp)
        finally:
            text, _capture.text = "".join(_capture.text), None
        if not ptr:
            if aborted.is_set():
                raise LoadAborted(f"loading {path} was aborted")
            raise LoadError(load_failure(path, text, params))
        return cls(ptr, path, keep, LoadReport.parse(text))

    def _desc(self) -> str:
        buf = ctypes.create_string_buffer(256)
        n = lib().llama_model_desc(self.ptr, buf, len(buf))
        return buf.value[: max(n, 0)].decode("utf-8", "replace")

    def meta(self, key: str) -> str | None:
        buf = ctypes.create_string_buffer(512)
        n = lib().llama_model_meta_val_str(self.ptr, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", "replace") if n >= 0 else None

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        """Tokens of ``text``; safe from any thread while the model is alive (``ModelFreed`` after)."""
        C = lib()
        data = text.encode("utf-8")
        with self._readers_cv:
            if not self.ptr:
                raise ModelFreed("the model was unloaded while the prompt was being tokenized")
            self._readers += 1
        try:
            cap = len(data) + 16
            buf = (C.llama_token * cap)()
            n = C.llama_tokenize(self.vocab, data, len(data), buf, cap, add_special, parse_special)
            if n < 0:
                cap = -n
                buf = (C.llama_token * cap)()
                n = C.llama_tokenize(self.vocab, data, len(data), buf, cap, add_special, parse_special)
            return list(buf[:n])
        finally:
            with self._readers_cv:
                self._readers -= 1
                self._readers_cv.notify_all()

    def tokenize_prompt(self, text: str, add_special: bool = True) -> list[int]:
        """A prompt's tokens with special parsing, as :meth:`tokenize` makes them; a long one in
        pieces, so llama.cpp's pass over special tokens stays linear (:mod:`tokenchunks`)."""
        if len(text) < tokenchunks.MIN_CUT_CHARS:
            return self.tokenize(text, add_special, True)
        return tokenchunks.tokenize(text, self.specials().marker, add_special, lambda t, a: self.tokenize(t, a, True))

    def specials(self) -> "Specials":
        """The vocabulary's special tokens, read in one walk of it the first time (the loader asks,
        so no request pays the walk: 85 ms for Gemma-3's 262,144 tokens on 2 cores)."""
        with self._specials_lock:
            if self._specials is None:
                C = lib()
                texts: dict[str, int] = {}
                controls: set[int] = set()
                buf = ctypes.create_string_buffer(256)
                for t in range(self.n_vocab):
                    attr = C.llama_vocab_get_attr(self.vocab, t)
                    if not attr & _SPECIAL_ATTRS:
                        continue
                    if attr & _PARSED_ONLY_ATTRS:
                        controls.add(t)
                    n = C.llama_token_to_piece(self.vocab, t, buf, len(buf), 0, True)
                    if n > 0:
                        texts[buf.raw[:n].decode("utf-8", "replace")] = attr
                try:
                    probe = self.apply_chat_template([{"role": "user", "content": "x"}])
                except ValueError:  # a template llama.cpp's own formatter does not know: no marker to cut at
                    probe = ""
                marker = tokenchunks.Marker.choose(probe, texts, bool(C.llama_vocab_get_add_eos(self.vocab)))
                self._specials = Specials(frozenset(controls), marker)
            return self._specials

    def detokenize(self, tokens: list[int], pieces: bool = False) -> bytes | list[bytes]:
        """The text of ``tokens`` (special tokens written out), or each token's own bytes with
        ``pieces``; safe from any thread while the model is alive (``ModelFreed`` after). Token ids
        must lie in [0, n_vocab): the caller checks, llama.cpp does not."""
        C = lib()
        with self._readers_cv:
            if not self.ptr:
                raise ModelFreed("the model was unloaded while tokens were being read")
            self._readers += 1
        try:
            if pieces:
                out: list[bytes] = []
                buf = ctypes.create_string_buffer(256)
                for t in tokens:
                    n = C.llama_token_to_piece(self.vocab, t, buf, 256, 0, True)
                    if n < 0:
                        big = ctypes.create_string_buffer(-n)
                        n = C.llama_token_to_piece(self.vocab, t, big, -n, 0, True)
                        out.append(big.raw[:n])
                    else:
                        out.append(buf.raw[:n])
                return out
            arr = (C.llama_token * max(1, len(tokens)))(*tokens)
            cap = max(64, len(tokens) * 8)
            text = ctypes.create_string_buffer(cap)
            n = C.llama_detokenize(self.vocab, arr, len(tokens), text, cap, False, True)
            if n < 0:
                cap = -n
                text = ctypes.create_string_buffer(cap)
                n = C.llama_detokenize(self.vocab, arr, len(tokens), text, cap, False, True)
            return text.raw[:max(n, 0)]
        finally:
            with self._readers_cv:
                self._readers -= 1
                self._readers_cv.notify_all()

    def chat_tokens(self, messages: list[dict[str, str]], template: str | None = None,
                    render: Callable[[list[dict[str, str]]], str] | None = None,
                    max_chars: int | None = None) -> list[int]:
        """Tokens of the chat prompt for ``messages``, formatted with the model's template (or by
        ``render``, which formats a list of messages some other way: a jinja template with tools).

        The template's own markers (``<|im_start|>``, ``<start_of_turn>``, ...) are special tokens;
        the same characters typed by a user are text. Tokenizing the whole prompt with special
        parsing (as llama-server does) would let a user close their turn and open a system one.
        When no message contains special-token text the whole prompt is tokenized in one call (the
        common case, the same tokens llama-server makes). Otherwise the template is applied to
        placeholders, its pieces are tokenized with special parsing and each message body without,
        and the pieces are spliced in order."""
        def fmt(ms: list[dict[str, str]]) -> str:
            text = render(ms) if render is not None else self.apply_chat_template(ms, template)
            if max_chars is not None and len(text) > max_chars:
                raise PromptTextTooLong(len(text))
            return text

        contents = [m["content"] for m in messages]
        if not any(self.has_special_text(c) for c in contents):
            return self.tokenize_prompt(fmt(messages))
        probe = fmt([{"role": "user", "content": " \x1aP\x1a "}])
        trims = " \x1aP\x1a " not in probe  # some templates strip each body (gemma, llama3)
        marked = [{**m, "content": f"\x1a{i}\x1a"} for i, m in enumerate(messages)]
        parts = _PLACEHOLDER.split(fmt(marked))
        tokens: list[int] = []
        for j, part in enumerate(parts):
            if j % 2 == 0:
                if part or j == 0:
                    tokens += self.tokenize(part, add_special=j == 0, parse_special=True)
            else:
                body = contents[int(part)]
                tokens += self.tokenize(body.strip() if trims else body, add_special=False, parse_special=False)
        return tokens

    def has_special_text(self, content: str) -> bool:
        """Whether ``content`` holds the text of a control token (``<|im_end|>``): with special parsing
        its tokens then include one, and only then do they differ from the tokens without it (user-
        defined tokens are matched either way). One tokenization instead of both to compare."""
        if "<" not in content and "[" not in content and "|" not in content:
            return False  # every special-token text of the supported families has one of these
        controls = self.specials().controls
        return any(t in controls for t in self.tokenize(content, add_special=False, parse_special=True))

    def piece(self, token: int) -> bytes:
        """Bytes of one token; cached, since decode loops ask for the same tokens again and again."""
        got = self._pieces.get(token)
        if got is None:
            n = lib().llama_token_to_piece(self.vocab, token, self._piece_buf, 256, 0, False)
            if n < 0:
                big = ctypes.create_string_buffer(-n)
                n = lib().llama_token_to_piece(self.vocab, token, big, -n, 0, False)
                got = big.raw[:n]
            else:
                got = self._piece_buf.raw[:n]
            self._pieces[token] = got
        return got

    def eog_tokens(self) -> list[int]:
        """Every end-of-generation token (computed once; a 262k vocabulary takes a moment)."""
        if getattr(self, "_eog", None) is None:
            C = lib()
            self._eog = [t for t in range(self.n_vocab) if C.llama_vocab_is_eog(self.vocab, t)]
        return self._eog

    def is_eog(self, token: int) -> bool:
        return bool(lib().llama_vocab_is_eog(self.vocab, token))

    def fim_tokens(self) -> dict[str, int | None]:
        """The fill-in-the-middle tokens llama.cpp found in the vocabulary (``pre``, ``suf``,
        ``mid``, ``rep``, ``sep``), None for each one it lacks; /infill needs the first three."""
        C = lib()
        ids = {k: getattr(C, f"llama_vocab_fim_{k}")(self.vocab) for k in ("pre", "suf", "mid", "rep", "sep")}
        return {k: None if t < 0 else t for k, t in ids.items()}

    def added_bos(self) -> int | None:
        """The BOS token when the vocabulary adds one to a prompt (Gemma's does, SmolLM2's not)."""
        C = lib()
        return C.llama_vocab_bos(self.vocab) if C.llama_vocab_get_add_bos(self.vocab) else None

    def apply_chat_template(self, messages: list[dict[str, str]], template: str | None = None,
                            add_generation_prompt: bool = True) -> str:
        """Format messages with llama.cpp's built-in template engine (the model's own template by
        default), the assistant's turn opened unless ``add_generation_prompt`` is false."""
        C = lib()
        tmpl = template.encode() if template else self.chat_template
        encoded = [(m["role"].encode(), m["content"].encode()) for m in messages]
        arr = (C.llama_chat_message * len(encoded))()
        for i, (role, content) in enumerate(encoded):
            arr[i].role = role
            arr[i].content = content
        size = sum(len(c) + len(r) for r, c in encoded) * 2 + 512
        buf = ctypes.create_string_buffer(size)
        n = C.llama_chat_apply_template(tmpl, arr, len(encoded), add_generation_prompt, buf, size)
        if n > size:
            buf = ctypes.create_string_buffer(n + 1)
            n = C.llama_chat_apply_template(tmpl, arr, len(encoded), add_generation_prompt, buf, n + 1)
        if n < 0:
            raise ValueError("the chat template is not one llama.cpp knows; set chat_template to a known name such as 'chatml'")
        return buf.raw[:n].decode("utf-8", "replace")

    def free(self) -> None:
        with self._readers_cv:
            ptr, self.ptr = self.ptr, None  # new tokenize() calls now refuse
            while self._readers:
                self._readers_cv.wait()
        if ptr:
            lib().llama_model_free(ptr)


class Context:
    """A llama_context with its KV cache, sized for n_parallel slots; or, with ``pooling`` (a
    ``POOLING`` value), an embedding context of ``n_tokens`` (its context and both batch sizes) for
    ``n_seq`` inputs at once, which outputs embeddings instead of sampling (``engine/embedder.py``)."""

    def __init__(self, model: Model, params: RuntimeParams, pooling: int | None = None, n_tokens: int = 0,
                 n_seq: int = 1) -> None:
        C = lib()
        cp = C.llama_context_default_params()
        cp.n_ctx = params.n_ctx
        cp.n_batch = params.n_batch
        cp.n_ubatch = min(params.n_ubatch, params.n_batch)
        cp.n_seq_max = params.n_parallel
        if pooling is not None:
            cp.n_ctx = cp.n_batch = cp.n_ubatch = n_tokens
            cp.n_seq_max = n_seq
            cp.embeddings = True
            cp.pooling_type = pooling
        threads = params.n_threads or usable_cpus()
        cp.n_threads = threads
        cp.n_threads_batch = params.n_threads_batch or threads
        self.threads = (cp.n_threads, cp.n_threads_batch)  # its own; share_cpu lends some for a while
        self._threads_now = self.threads
        cp.type_k = _CACHE_TYPES[params.cache_type_k]
        cp.type_v = _CACHE_TYPES[params.cache_type_v]
        cp.flash_attn_type = _FLASH[params.flash_attn]
        cp.rope_scaling_type = _ROPE[params.rope_scaling]
        cp.rope_freq_base = params.rope_freq_base
        cp.rope_freq_scale = params.rope_freq_scale
        cp.yarn_ext_factor = params.yarn_ext_factor
        cp.yarn_attn_factor = params.yarn_attn_factor
        cp.yarn_beta_fast = params.yarn_beta_fast
        cp.yarn_beta_slow = params.yarn_beta_slow
        cp.yarn_orig_ctx = params.yarn_orig_ctx
        cp.kv_unified = params.kv_unified or pooling is not None  # an input may take the whole embedding context
        cp.no_perf = True
        ptr = C.llama_init_from_model(model.ptr, cp)
        if not ptr:
            raise LoadError("llama.cpp could not create the context (n_ctx too large for memory, or an unsupported cache type)")
        self.ptr = ptr
        self.mem = C.llama_get_memory(ptr)
        self.n_ctx = C.llama_n_ctx(ptr)
        self.n_ctx_seq = C.llama_n_ctx_seq(ptr)
        self.n_batch = C.llama_n_batch(ptr)
        self.n_ubatch = C.llama_n_ubatch(ptr)
        self.n_seq = cp.n_seq_max

    def share_cpu(self, lent: int) -> None:
        """Compute with ``lent`` CPU threads fewer than the context's own (never fewer than 1); 0 gives them
        back. Takes effect from the next decode; the call itself only sets two numbers."""
        self._use_threads((max(1, self.threads[0] - lent), max(1, self.threads[1] - lent)))

    def limit_threads(self, n: int) -> None:
        """Compute with at most ``n`` CPU threads (0: the context's own) until told otherwise."""
        self._use_threads(self.threads if n <= 0 else (min(n, self.threads[0]), min(n, self.threads[1])))

    def _use_threads(self, want: tuple[int, int]) -> None:
        if want != self._threads_now and self.ptr:
            lib().llama_set_n_threads(self.ptr, *want)
            self._threads_now = want

    @property
    def threads_now(self) -> tuple[int, int]:
        return self._threads_now

    def synchronize(self) -> None:
        """Wait until the device has computed what was queued (a no-op when it has)."""
        lib().llama_synchronize(self.ptr)

    def seq_rm(self, seq: int, p0: int, p1: int = -1) -> bool:
        return bool(lib().llama_memory_seq_rm(self.mem, seq, p0, p1))

    def seq_add(self, seq: int, p0: int, p1: int, delta: int) -> None:
        """Move the positions [p0, p1) of a sequence by ``delta`` (hydrad.engine.kvshift)."""
        lib().llama_memory_seq_add(self.mem, seq, p0, p1, delta)

    @property
    def can_shift(self) -> bool:
        return bool(lib().llama_memory_can_shift(self.mem))

    def clear(self) -> None:
        lib().llama_memory_clear(self.mem, True)

    def free(self) -> None:
        if self.ptr:
            lib().llama_free(self.ptr)
            self.ptr = None
