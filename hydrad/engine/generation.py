"""A generation: model + context + batch + slots, and the parameter snapshot that built them.

Slots remember which tokens their KV holds (``cache``), so a new request can go to the slot
that shares the longest prefix with it and skip prefilling that prefix.
"""

from __future__ import annotations

import ctypes
import hashlib
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from hydrad.engine.filedigest import edge_digest
from hydrad.engine.tokenprefix import common_prefix
from hydrad.engine import ggml, gguf_meta, kvshift, llama, speculate
from hydrad.engine.adapters import Adapters
from hydrad.engine.draftmodel import DraftModel
from hydrad.engine.batch import Batch
from hydrad.engine.embedder import Embedder
from hydrad.engine.gpu import PAGEABLE_BESIDE
from hydrad.engine.peer_watch import PeerWatch
from hydrad.engine.placement import Placement, PlacementError, plan
from hydrad.engine.requests import GenerationTag
from hydrad.engine.statebuf import StateBuffers
from hydrad.engine.vision import Vision
from hydrad.common.modeloverrides import parse_kv_override
from hydrad.common.params import RuntimeParams
from hydrad.common.registry import ResolvedModel
from hydrad.wire.kvstream import fresh


@dataclass
class Slot:
    id: int
    cache: list[int] = field(default_factory=list)  # tokens whose KV sits in sequence `id`
    active: Any = None  # the core's _Active while a request runs here
    last_used: float = 0.0
    # The KV came from a STATE_PUT nobody vouched for (no engine token proven): its token list is the
    # uploader's claim, not something this engine computed, so only a request pinned to this slot
    # (id_slot) may build on it. Cleared when the slot is emptied.
    foreign: bool = False
    # The cache namespace of the requests whose KV this is (hydrad.common.tenants): a request of another
    # namespace never reuses it, except the request the pool itself pinned here after putting its state
    # (a moved session, a split's prefill: GenRequest.pool_pin). None: an untrusted upload's (foreign).
    owner: str | None = ""
    # How many leading tokens of ``cache`` hold the KV a prefill of them gives; None: all of them. A context
    # shift or a reused chunk (hydrad.engine.kvshift) leaves KV computed after other tokens past this point:
    # never given to another conversation, and a shifted tail is dropped when its request ends.
    exact: int | None = None


def _memory_of(buft: str) -> str:
    """Which memory a llama.cpp buffer type's name is in: ``CPU``, ``CPU_Mapped``, ``CPU_REPACK`` and a
    GPU's ``*_Host`` (page-locked) are host memory, ``RPC*`` a peer's device, the rest this engine's GPUs."""
    name = buft.upper()
    if name.startswith("CPU") or name.endswith("_HOST"):
        return "host_bytes"
    return "peer_bytes" if name.startswith("RPC") else "device_bytes"


STATE_FORMAT = "hydra-kv/1"
_FP_EDGE = 4 << 20


def file_fingerprint(path: Path) -> str:
    """sha256 over the file size and its first and last 4 MiB: same GGUF ⇒ same fingerprint,
    cheap enough to compute on every load even for a model of many gigabytes."""
    return edge_digest(path, _FP_EDGE)[:32]


def kv_family(info: llama.ModelInfo, path: Path) -> str:
    """What sibling quants of one model share and other models do not: the KV layout (architecture,
    layers, width, KV heads) and the vocabulary. KV state moves between two engines of one family
    even when their weights are quantized differently, as SWAP_QUANT moves it inside one engine."""
    try:
        vocab = gguf_meta.vocab_digest(path)
    except (OSError, gguf_meta.GgufError):
        vocab = f"unread:{file_fingerprint(path)}"  # never matches another file: only same-file moves
    layout = f"{info.arch}|{info.n_layer}|{info.n_embd}|{info.n_head_kv}|{info.n_vocab}|{vocab}"
    return hashlib.sha256(layout.encode()).hexdigest()[:24]


WARMUP_PROMPT_TOKENS = 8  # the throw-away prompt of a new generation's warm-up (then WARMUP_DECODE_STEPS steps)
WARMUP_DECODE_STEPS = 3
"""Single-token steps of the warm-up: llama.cpp's CUDA back end captures a decode step as a CUDA graph only
once it has seen the same graph twice in a row, so with one step the first user request still paid for
the capture (and its instantiation) of its decode graph; with three, the warm-up has replayed it once."""
SPARE_TAIL = 4  # tokens past a shared prefix that still count as the same conversation (its last reply re-tokenized)


class Generation:
    def __init__(self, gen_id: int, resolved: ResolvedModel, params: RuntimeParams, model: llama.Model,
                 ctx: llama.Context, load_seconds: float) -> None:
        self.id = gen_id
        self.resolved = resolved
        self.params = params
        self.model = model
        self.ctx = ctx
        self.batch = Batch(ctx.n_batch)
        self.slots = [Slot(i) for i in range(params.n_parallel)]
        self.n_active = 0
        self.load_seconds = load_seconds
        self.model_seconds = 0.0  # the parts of a load, for its record: weights, context, warm-up
        self.context_seconds = 0.0
        self.warmup_seconds = 0.0
        self.loaded_at = time.time()
        self.bos = llama.lib().llama_vocab_bos(model.vocab)
        self.tag = GenerationTag(gen_id, resolved.id, params.snapshot_hash())
        # llama_decode only queues work on a GPU (reading the logits waits for it); on a CPU it computes
        self.asynchronous = params.n_gpu_layers != 0 and any(d.kind in ("gpu", "igpu") for d in ggml.devices())
        self.fingerprint = ""
        self.family = ""  # kv_family(): the same for sibling quants of one model
        self.placement: Placement | None = None  # devices, peers and overrides, when not llama.cpp's defaults
        self.watch: PeerWatch | None = None  # the watch of the placement's peers, while installed
        self.abandoned = False  # a peer died: never free (freeing talks to it, and llama.cpp aborts)
        self.embedder: Embedder | None = None  # the embedding context, when params.embeddings
        self.adapters: Adapters | None = None  # LoRA adapters and control vector, when params name any
        self.vision: Vision | None = None  # the projector of params.mmproj (images), when it names one
        self.tail_rm = True  # the context's memory drops the tail of a sequence (a recurrent model's cannot: warmup)
        self.n_swa = int(llama.lib().llama_model_n_swa(model.ptr))  # a sliding window's length, 0 for none
        self.draft: DraftModel | None = None  # spec_draft_model's weights and context, when set
        self.ngrams = speculate.Memory()  # ngram-mod's n-grams across requests (empty unless it runs)

    def load_view(self) -> dict[str, Any]:
        """What this generation's load did with the model parameters, as llama.cpp reported it: its load
        mode, the bytes of weights in each buffer type (and so on the devices and in host memory), how
        many tensors the overrides (override_tensors, n_cpu_moe) placed where, and the metadata values
        kv_overrides gave it. Shown by /v1/models, INFO and the load's record."""
        view = self.model.report.public()
        where = {"device_bytes": 0, "host_bytes": 0, "peer_bytes": 0}
        for buft, nbytes in view["buffers"].items():
            where[_memory_of(buft)] += nbytes
        view.update(where)
        p = self.params
        view.update(n_cpu_moe=self.placement.n_cpu_moe if self.placement is not None else 0,
                    devices=self.placement.device_names if self.placement is not None and p.devices is not None
                    else None)
        return view

    @property
    def n_expert(self) -> int:
        """Experts per MoE layer (0 for a dense model), from the GGUF's ``<arch>.expert_count``."""
        value = self.model.meta(f"{self.model.info.arch}.expert_count")
        return int(value) if value and value.isdigit() else 0

    # ----- KV state of a slot (engine thread only) ---------------------------------------

    def identity(self) -> dict[str, Any]:
        """What must match for KV state to be portable between two engines: the same file
        (fingerprint), or a sibling quant of it (family: same layout and vocabulary)."""
        info = self.model.info
        return {"arch": info.arch, "n_layer": info.n_layer, "n_embd": info.n_embd, "n_head_kv": info.n_head_kv,
                "n_vocab": info.n_vocab, "fingerprint": self.fingerprint, "family": self.family, "desc": info.desc}

    def state_meta(self, slot: Slot, n_bytes: int) -> dict[str, Any]:
        return {"format": STATE_FORMAT, "model": self.identity(), "model_id": self.resolved.id,
                "cache_type_k": self.params.cache_type_k, "cache_type_v": self.params.cache_type_v,
                "n_ctx": self.ctx.n_ctx_seq, "tokens": list(slot.cache), "n_tokens": len(slot.cache),
                "bytes": n_bytes}

    def incompatibility(self, meta: dict[str, Any]) -> str | None:
        """Why a state cannot be restored here, or None when it can."""
        if not isinstance(meta, dict) or meta.get("format") != STATE_FORMAT:
            return f"not a {STATE_FORMAT} state (format={meta.get('format') if isinstance(meta, dict) else None!r})"
        mine, theirs = self.identity(), meta.get("model") or {}
        if not isinstance(theirs, dict):
            return "meta.model must be an object"
        for key in ("arch", "n_layer", "n_embd", "n_head_kv", "n_vocab"):
            if theirs.get(key) != mine[key]:
                return (f"state is from another model: {key} is {theirs.get(key)!r}, this engine has {mine[key]!r} "
                        f"({self.resolved.id})")
        if theirs.get("fingerprint") != mine["fingerprint"] and theirs.get("family") != mine["family"]:
            return (f"state is from another model: neither the same file (fingerprint {theirs.get('fingerprint')!r}, "
                    f"this engine has {mine['fingerprint']!r}) nor a sibling quant of it (family "
                    f"{theirs.get('family')!r}, this engine has {mine['family']!r}: layout and vocabulary differ) "
                    f"({self.resolved.id})")
        for key in ("cache_type_k", "cache_type_v"):
            if meta.get(key) != getattr(self.params, key):
                return f"{key} differs: state has {meta.get(key)!r}, this engine uses {getattr(self.params, key)!r}"
        tokens = meta.get("tokens")
        if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
            return "meta.tokens must be a list of token ids"
        if meta.get("n_tokens") != len(tokens):
            return "meta.n_tokens does not match the token list"
        if len(tokens) >= self.ctx.n_ctx_seq:
            return f"state holds {len(tokens)} tokens; this engine's slot context holds {self.ctx.n_ctx_seq}"
        if any(t < 0 or t >= self.model.n_vocab for t in tokens):
            return "meta.tokens has ids outside the vocabulary"
        return None

    def read_state(self, slot: Slot, buffers: StateBuffers | None = None) -> Any:
        """The slot's KV state as a uint8 array, in a kept buffer when one is free (see statebuf):
        a fresh mapping's page faults were most of the time before the first byte was sent."""
        C = llama.lib()
        size = C.llama_state_seq_get_size(self.ctx.ptr, slot.id)
        # several slots at once (a rebuild's carry, no ``buffers``) take fresh ones
        buf = buffers.take(size) if buffers is not None else fresh(size)
        n = C.llama_state_seq_get_data(self.ctx.ptr, buf.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8)), size, slot.id)
        if n != size:
            raise RuntimeError(f"llama_state_seq_get_data wrote {n} of {size} bytes")
        return buf

    def write_state(self, slot: Slot, tokens: list[int], data: Any, foreign: bool = False,
                    owner: str | None = None) -> None:
        """Replace the slot's KV with ``data`` and its token list with ``tokens``; ``foreign`` marks a state
        nobody trusted vouched for (see ``Slot.foreign``).

        With one KV pool for all slots, idle slots' caches are evicted (oldest first) to make room, as
        for a prompt; busy slots are never touched, and a state that still does not fit is refused.
        On failure the slot keeps what it had: llama.cpp clears the sequence before it parses a state,
        so the old KV is read out first (when the slot holds any) and written back if the new one is
        refused. Only when even that restore fails does the slot end up empty, never half-written."""
        import numpy as np

        C = llama.lib()
        arr = np.frombuffer(data, dtype=np.uint8)
        old_tokens, old_foreign, old_owner = list(slot.cache), slot.foreign, slot.owner
        backup = self.read_state(slot) if old_tokens else None
        self.ctx.seq_rm(slot.id, -1, -1)
        slot.cache.clear()
        self.ensure_room(len(tokens), exclude=slot)
        used = sum(len(s.cache) for s in self.slots)
        if self.params.kv_unified and used + len(tokens) > self.ctx.n_ctx:
            why = (f"no room in the KV cache for {len(tokens)} tokens: busy slots hold {used} of its "
                   f"{self.ctx.n_ctx} cells")
        elif C.llama_state_seq_set_data(self.ctx.ptr, arr.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8)),
                                        len(arr), slot.id) == 0:
            why = "llama.cpp refused the state data (corrupt, from another build, or no room in the KV cache)"
        else:
            slot.cache.extend(tokens)
            slot.foreign, slot.owner, slot.exact = foreign, owner, None
            return
        self.ctx.seq_rm(slot.id, -1, -1)
        slot.foreign, slot.owner = False, ""
        if backup is None:
            raise RuntimeError(f"{why}; the slot is unchanged")
        back = C.llama_state_seq_set_data(self.ctx.ptr, backup.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8)),
                                          len(backup), slot.id)
        if back == 0:
            self.ctx.seq_rm(slot.id, -1, -1)
            raise RuntimeError(f"{why}, and the slot's previous KV could not be put back; the slot is empty")
        slot.cache.extend(old_tokens)
        slot.foreign, slot.owner = old_foreign, old_owner  # (and exact as it was: the same KV is back)
        raise RuntimeError(f"{why}; the slot is unchanged")

    @property
    def drafts_ok(self) -> bool:
        """Speculative decoding may run here: taking back a rejected draft drops a sequence's tail, and a
        sliding-window cache is one pool (kv_unified). With a stream per sequence llama.cpp splits a step
        into ubatches of equal rows per sequence, a long draft over several, and a later one may overwrite
        a cell of the window that the tokens after a rejected draft attend to (see speculate.add_drafts)."""
        return self.tail_rm and (self.params.kv_unified or self.n_swa == 0)

    def free_slot_exists(self) -> bool:
        return self.n_active < len(self.slots)

    def pick_slot(self, tokens: list[int] | None, spare_tails: int = 0, owner: str = "") -> Slot:
        """The free slot sharing the longest prefix with ``tokens``; otherwise the least recently used.

        Foreign slots (restored from an untrusted STATE_PUT) never count as sharing a prefix: their
        token list may lie about their KV, and answering an honest prompt from it would hand the
        uploader's forged cache to someone else. When a foreign slot is picked anyway (least recently
        used), it is emptied first, so ``reuse_prefix`` finds nothing to reuse. A request pinned to
        the slot (id_slot) does not come through here and may build on it.

        ``spare_tails`` (prefix sharing on: its ``min_tokens``, 0 when off): when the best slot holds
        another conversation past a shared prefix of at least that many tokens (more than
        :data:`SPARE_TAIL` tokens past it), an empty slot is taken instead and the shared prefix is
        copied into it (``prefixshare``), so sessions sharing a system prompt do not drop each other's
        KV while slots are free. A shorter shared prefix would not be copied, so the best slot is
        reused as usual rather than prefilling from nothing."""
        free = [s for s in self.slots if s.active is None]
        if tokens:
            def held(s: Slot) -> int:  # what the slot shares with the prompt, for a request of ``owner``
                return 0 if s.foreign or s.owner != owner else common_prefix(s.cache, tokens)  # type: ignore[arg-type]

            best = max(free, key=lambda s: (held(s), -s.last_used))
            shared = held(best)
            if shared > 0:
                if spare_tails and shared >= spare_tails and len(best.cache) - shared > SPARE_TAIL:
                    empty = [s for s in free if not s.cache]
                    if empty:
                        return empty[0]
                return best
        slot = min(free, key=lambda s: (len(s.cache) > 0 and not s.foreign, s.last_used))
        if slot.foreign:
            self.reset_slot(slot)
        return slot

    def reuse_prefix(self, slot: Slot, tokens: list[int], min_chunk: int = 0) -> tuple[int, int]:
        """Keep the shared prefix of the slot's KV, drop the rest; returns (tokens kept, of which moved).
        ``min_chunk`` (the request's n_cache_reuse, 0: off): first move the cached chunks of at least that
        many tokens that the prompt repeats after the shared prefix to their new positions
        (kvshift.reuse_chunks)."""
        keep = prefix = common_prefix(slot.cache, tokens)
        if keep >= len(tokens):
            keep = prefix = len(tokens) - 1  # the last prompt token must be decoded again to get logits
        if min_chunk > 0 and keep < len(slot.cache):
            keep = kvshift.reuse_chunks(self, slot, tokens, keep, min_chunk)
        kept = self.truncate(slot, keep)
        return kept, max(0, kept - prefix)

    def truncate(self, slot: Slot, keep: int) -> int:
        """Drop the slot's KV and tokens from ``keep`` on; returns what it holds after (0 when the cache
        cannot drop a tail and the slot was started afresh)."""
        if keep < len(slot.cache):
            if not self.ctx.seq_rm(slot.id, keep, -1):
                # some caches (sliding-window, recurrent) cannot drop a tail: start the slot afresh
                return self.reset_slot(slot)
            del slot.cache[keep:]
        if slot.exact is not None and slot.exact >= keep:
            slot.exact = None
        return len(slot.cache)

    def reset_slot(self, slot: Slot) -> int:
        self.ctx.seq_rm(slot.id, -1, -1)
        slot.cache.clear()
        slot.foreign = False
        slot.owner = ""
        slot.exact = None
        return 0

    def ensure_room(self, needed: int, exclude: Slot) -> None:
        """With one KV pool for all slots, evict idle slots' caches (oldest first) to fit a prompt."""
        if not self.params.kv_unified:
            return
        used = sum(len(s.cache) for s in self.slots)
        idle = sorted((s for s in self.slots if s.active is None and s is not exclude and s.cache),
                      key=lambda s: s.last_used)
        for s in idle:
            if used + needed <= self.ctx.n_ctx:
                break
            used -= len(s.cache)
            self.reset_slot(s)

    def evict_idle(self) -> int:
        """Drop every idle slot's cached KV (the unified pool ran out mid-decode); returns slots freed."""
        freed = 0
        for s in self.slots:
            if s.active is None and s.cache:
                self.reset_slot(s)
                freed += 1
        return freed

    def rebuild_context(self, params: RuntimeParams) -> dict[str, int]:
        """T2: a new context with new parameters; the model stays. Each idle slot's KV is carried into the
        new context when the new context can hold it (same cache types, enough room, slot still exists);
        otherwise that slot starts empty and its next request prefills again."""
        saved: list[tuple[int, list[int], Any, float, bool, str | None, int | None]] = []
        same_layout = (params.cache_type_k, params.cache_type_v) == (self.params.cache_type_k, self.params.cache_type_v)
        dropped = 0
        for slot in self.slots:
            if not slot.cache:
                continue
            if same_layout and slot.id < params.n_parallel:
                saved.append((slot.id, list(slot.cache), self.read_state(slot), slot.last_used, slot.foreign,
                              slot.owner, slot.exact))
            else:
                dropped += 1
        new_ctx = llama.Context(self.model, params)
        if self.draft is not None:  # its sequences follow the slots (n_parallel), its batch and threads the context
            try:
                self.draft.rebuild(params)
            except Exception:
                new_ctx.free()
                raise
        if self.adapters is not None:
            try:
                self.adapters.attach(new_ctx)
            except Exception:
                new_ctx.free()
                raise
        if self.embedder is not None:  # its size follows n_ubatch
            try:
                embedder = Embedder(self.model, params)
            except Exception:
                new_ctx.free()
                raise
            self.embedder.free()
            self.embedder = embedder
        self.batch.free()
        self.ctx.free()
        self.ctx = new_ctx
        self.batch = Batch(new_ctx.n_batch)
        self.slots = [Slot(i) for i in range(params.n_parallel)]
        self.params = params
        self.tag = GenerationTag(self.id, self.resolved.id, params.snapshot_hash())
        carried = 0
        for sid, tokens, data, last_used, foreign, owner, exact in saved:
            if len(tokens) >= new_ctx.n_ctx_seq:
                dropped += 1
                continue
            try:
                self.write_state(self.slots[sid], tokens, data, foreign=foreign, owner=owner)
                self.slots[sid].last_used, self.slots[sid].exact = last_used, exact  # (moved chunks stay marked)
                carried += 1
            except RuntimeError:
                dropped += 1
        return {"carried": carried, "dropped": dropped}

    def warmup(self) -> None:
        """A short prompt and a few decode steps, thrown away, so that the first user request does not pay
        for lazy work. Both shapes matter: on a GPU a batch of several tokens takes other kernels than a
        single token (a multi-token attention product goes through cuBLAS, whose handle each new context
        creates on first use), and under an overlap reload whatever the first request pays is a gap in
        service."""
        tok = self.bos if self.bos >= 0 else 0
        n = max(1, min(WARMUP_PROMPT_TOKENS, self.ctx.n_batch - 1, self.ctx.n_ctx_seq - 1))
        self.batch.clear()
        for pos in range(n):
            self.batch.add(tok, pos, 0, pos == n - 1)
        self.batch.decode(self.ctx)
        for pos in range(n, min(n + WARMUP_DECODE_STEPS, self.ctx.n_ctx_seq)):
            self.batch.clear()
            self.batch.add(tok, pos, 0, True)
            self.batch.decode(self.ctx)
        self.tail_rm = self.ctx.seq_rm(0, n, -1)  # as llama-server's common_context_can_seq_rm asks
        self.ctx.clear()

    def free(self) -> None:
        for _name, part in self.free_parts():
            part()

    def free_parts(self) -> list[tuple[str, Callable[[], None]]]:
        """What freeing this generation does, in two parts (its context, then its weights): the reaper
        pauses between them so that no request of the next generation waits for both."""
        if self.watch is not None:
            self.watch.stop()
        if self.abandoned:
            return []

        def context() -> None:
            for s in self.slots:
                if s.active is not None and getattr(s.active, "sampler", None) is not None:
                    s.active.sampler.free()
            if self.embedder is not None:
                self.embedder.free()
            if self.draft is not None:
                self.draft.free()
            self.batch.free()
            self.ctx.free()

        def weights() -> None:
            if self.vision is not None:  # it reads the model: freed first
                self.vision.free()
            self.model.free()

        return [("context", context), ("model", weights)]


def check_kv_overrides(path: Path, params: RuntimeParams) -> None:
    """Refuse, before the load, a ``kv_overrides`` entry llama.cpp would skip: one typed otherwise than
    the GGUF's own value of that key (llama.cpp warns and keeps the file's value), or one of an array
    (llama.cpp cannot override arrays)."""
    if not params.kv_overrides:
        return
    kinds = gguf_meta.key_kinds(path)
    for item in params.kv_overrides:
        kv = parse_kv_override(item)
        kind = kinds.get(kv.key)
        if kind == "array":
            raise llama.LoadError(f"kv_overrides: {kv.key!r} is an array in {path.name}; llama.cpp cannot override "
                                  "an array")
        if kind is not None and kind != kv.type:
            raise llama.LoadError(f"kv_overrides: {kv.key!r} is {kind} in {path.name}, the override {item!r} is "
                                  f"{kv.type}: llama.cpp would ignore it; write {kv.key}={kind}:...")


def kv_overrides_used(model: llama.Model, params: RuntimeParams) -> None:
    """After the load: every ``kv_overrides`` key must have been used by llama.cpp (it logs each one it
    applies). A key it never read (a typo, or a key this architecture does not use) would change nothing,
    and llama.cpp says nothing of it: the load fails naming it instead."""
    report = model.report
    for item in params.kv_overrides or []:
        key = parse_kv_override(item).key
        if key in report.kv_refused:
            raise llama.LoadError(f"kv_overrides: {key!r}: {report.kv_refused[key]}")
        if key not in report.kv_applied:
            raise llama.LoadError(f"kv_overrides: llama.cpp did not read {key!r} while loading {model.path.name} "
                                  f"({model.info.arch}): no part of its load uses that key, so the override would "
                                  "change nothing")


def build_generation(resolved: ResolvedModel, params: RuntimeParams, progress: Callable[[float], bool],
                     gen_id: int, on_warming: Callable[[], None], warm_threads: int = 0,
                     beside: bool = False) -> Generation:
    """Load model + context on the calling (loader) thread; nothing here is shared yet. ``warm_threads``
    (0: all of the context's own) caps the CPU threads of the warm-up, when a generation serves beside
    it with that many threads fewer; the engine thread gives the new context its own when it installs it.
    ``beside`` (a generation serves while this one loads) opens :data:`PAGEABLE_BESIDE`'s window over
    the contexts' creation and warm-up, where an armed engine keeps their host buffers pageable."""
    t0 = time.monotonic()
    try:
        check_kv_overrides(resolved.path, params)
        placement = plan(resolved.path, params)
    except (PlacementError, gguf_meta.GgufError) as exc:
        raise llama.LoadError(str(exc)) from None
    if placement is None:
        model = llama.Model.load(resolved.path, params, progress)
    else:
        placed = params.model_copy(update={"n_gpu_layers": placement.n_gpu_layers,
                                           "tensor_split": placement.tensor_split})
        model = llama.Model.load(resolved.path, placed, progress, placement.devices, placement.overrides)
    try:
        kv_overrides_used(model, params)
        adapters = Adapters.build(model, params, resolved.models_dir or resolved.path.parent)
        vision = Vision.load(model, params, resolved.models_dir or resolved.path.parent)
    except llama.LoadError:
        model.free()
        raise
    model.specials()  # the vocabulary's special tokens read here, on the loader thread, not by a request
    t_model = time.monotonic()
    with PAGEABLE_BESIDE.open(beside):
        try:
            ctx = llama.Context(model, params)
        except Exception:
            if vision is not None:
                vision.free()
            model.free()
            raise
        gen = Generation(gen_id, resolved, params, model, ctx, 0.0)
        gen.vision = vision
        kvshift.say_if_fixed(ctx, resolved.id)
        if adapters is not None:
            gen.adapters = adapters
            try:
                adapters.attach(ctx)
            except Exception:
                gen.free()
                raise
        if params.embeddings:
            try:
                gen.embedder = Embedder(model, params)
            except Exception:
                gen.free()
                raise
        if params.spec_draft_model:
            try:
                gen.draft = DraftModel.load(model, params, resolved.models_dir or resolved.path.parent)
            except Exception:
                gen.free()
                raise
        gen.placement = placement
        gen.fingerprint = file_fingerprint(resolved.path)
        gen.family = kv_family(model.info, resolved.path)
        gen.model_seconds = t_model - t0
        try:
            on_warming()
            t1 = time.monotonic()
            gen.context_seconds = t1 - t_model
            ctx.limit_threads(warm_threads)
            gen.warmup()
            gen.warmup_seconds = time.monotonic() - t1
        except Exception:
            gen.free()
            raise
    gen.load_seconds = time.monotonic() - t0
    return gen
