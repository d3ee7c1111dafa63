#!/usr/bin/env python3
"""What loading a second model on the same GPU does to the decode steps of a context already serving.

An overlap reload (docs/reload.md) keeps the old generation decoding while the new one loads. On the
H200 its longest gap is 1.4–1.9× the steady gap, and the engine's slow-turn log puts that in one or two
single steps of the old generation that take 8–20 ms instead of 2–5. This script finds which part of a
load those steps fall in, with llama.cpp alone (no engine, no HTTP), so what it shows is the library's
and the driver's, not the serving layer's.

One thread decodes one token at a time on a small model (``--serving``), waiting for each step's result
(``llama_synchronize``) and stamping it. Meanwhile the main thread goes through the phases below, each
stamped, with a pause between them so that every phase's effect stands alone:

- ``cudaMalloc`` of ``--alloc-mb`` in one call, then freed; the same bytes in 64 MiB calls; one call
  again (does a big allocation stall the other context's kernels in proportion to its size, and does
  memory the process had before come back cheaper?);
- a mapping of ``--model``'s file with ``MAP_POPULATE``, as a mapped load makes it, then unmapped: the
  pre-faulting alone, apart from the rest of the load;
- ``llama_model_load_from_file`` of ``--model`` (its progress callback stamps the first and last tensor
  upload: before the first is metadata and buffer allocation, after the last the loader's tail);
- ``llama_init_from_model`` (KV cache, compute buffers, graph reservation), one warm-up decode;
- ``llama_free`` and ``llama_model_free`` of the new model.

For each phase: the steps that overlap it, their median and longest step time against the steady
median before any phase.

On the H200 (docs/benchmarks.md, "A load beside a serving context") the context's creation stalled a
step by about 10 ms, which ``GGML_CUDA_NO_PINNED=1`` (host buffers in pageable memory, no
``cudaMallocHost``) removed; a large ``cudaMalloc`` alone stalled nothing.

The engine's own steps stalled more at the start of the weights' upload (10–27 ms) than this script's
did (5–7 ms), so the differences between the two can be switched on one at a time:

- ``--threads`` and ``--slots``: both contexts' CPU threads and sequences. llama.cpp's default is 4
  threads; the engine's is every core (16 on the GPU host), and a CPU thread pool that large can lose
  one of its threads to the loader mid-step, which holds up the whole step. On the 2-core machine a
  serving pool of 2 threads had 90-145 ms steps during a Gemma load (10.5-15.7x its median), one of 1
  thread 1.2-1.7x; the engine now lends a thread to a load beside it (``load_threads``).
- ``--through-engine``: the new model and both contexts go through the engine's own wrappers
  (``hydrad.engine.llama``: its context parameters, its log callback into Python logging, its progress
  callback).

Both ways run with the engine's interpreter switch interval (``switch_interval_ms``).

On the H200 the upload-start stall was there with a pool of 4 as with 16, so the
width is not it. These switches test the next leads, each the llama.cpp side of an engine setting:

- ``--no-mmap``: the loaded model is read, not mapped (``use_mmap: false``). From a mapping llama.cpp
  copies each tensor in one synchronous copy from pageable memory (the 3B's first is a 124 MB matrix);
  read, it uploads in 1 MiB chunks through page-locked staging buffers.
- ``--pageable-context``: the loaded model's context gets pageable host buffers
  (``cuda_pinned_host: alone``, through the engine's own gate).
- ``--pageable-load``: the model's load too runs with pageable host buffers (the gate open over it, as
  ``--pageable-context`` opens it over the context). llama.cpp then reads the device as having no host
  buffer: a read load uploads each tensor in one synchronous copy from pageable memory instead of through
  its four page-locked 1 MiB staging buffers (whose ``cudaMallocHost`` comes just before the first upload),
  and the weights left on the CPU fall back to ordinary memory as with ``--no-host``. The engine does not
  do this yet; this measures whether it should.
- ``--no-host`` (with ``--no-mmap``): the weights left on the CPU (the token embeddings) go to ordinary
  memory, not a page-locked host buffer (``no_host: true``). Read, not mapped, llama.cpp page-locks them at
  the load's start (about 85 MB for the 3B), and that allocation stalls the whole device.

``--hold-alloc`` makes the serving loop wait, at a step's boundary, while the loader allocates the model's
buffers (from its last tensor's creation to its first upload, found in its log lines; scripts/alloc_hold.py):
whether the stall before the first upload is the allocations running beside a step, which might cost less
on an idle device. On the H100 they did not (the held step took longer), so the engine does not hold.

``--log-marks X`` places each step of the load over X times the steady median among llama.cpp's own log
lines (every level, each stamped by a callback that does no more than the engine's own): which of the
loader's steps it lay beside.

A third thread maps, touches and unmaps 1 MiB of anonymous memory every millisecond, as an allocator
does. Each such call needs the process's memory-map lock for writing, and a mapped load takes that lock
for reading for as long as it pre-faults the whole file (llama.cpp maps with ``MAP_POPULATE``): on the
2-core machine (Linux 6.18) a 2 GB file's populate took 86–103 ms, and another thread's ``mmap``,
``munmap`` or ``brk`` waited all of it, while its page faults on anonymous memory did not wait. Its longest
call per phase says whether a load holds that lock there, and for how long.

Beside the stepping thread, a probe thread makes 20 short C calls at a time, as the engine's step thread
does around each ``llama_decode``; each call gives the interpreter lock up and takes it back. Its longest
batch in each phase says how long a thread that needs the lock waited for it there: Python work of the
load (callbacks, the engine's wrappers) shows there, and not in the step column, which is llama.cpp's.

    .venv/bin/python scripts/bench_load_stall.py --model models/rand-3b.Q4_K_M.gguf
"""

from __future__ import annotations

if __name__ == "__main__":  # run as scripts/NAME: under the checkout's .venv when there is one
    import _venv
    _venv.reexec()

import argparse
import contextlib
import ctypes
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))
from alloc_hold import AllocationWatch, StepHold  # noqa: E402
from hydrad.common.params import RuntimeParams  # noqa: E402
from hydrad.engine import gguf_meta, llama  # noqa: E402
from hydrad.engine.gpu import PAGEABLE_BESIDE  # noqa: E402
from hydrad.engine.settings import EngineSettings  # noqa: E402
from tests.support.engine import SMOLLM, models_dir  # noqa: E402


def _cudart() -> ctypes.CDLL | None:
    """The CUDA runtime the ggml CUDA back end loaded (found in this process's maps); None on a CPU build."""
    for line in Path("/proc/self/maps").read_text().splitlines():
        if "libcudart.so" in line:
            return ctypes.CDLL(line.split()[-1])
    return None


_line_sinks: list[Callable[[int, bytes], None]] = []  # --hold-alloc's watch, while the load runs


def feed_line(level: int, text: bytes) -> None:
    """Every log callback this script sets passes each llama.cpp line here."""
    for sink in _line_sinks:
        sink(level, text)


@contextlib.contextmanager
def lines_to(sink: Callable[[int, bytes], None]) -> Iterator[None]:
    _line_sinks.append(sink)
    try:
        yield
    finally:
        _line_sinks.remove(sink)


SERVING_SPAN = 31
"""The serving context's positions cycle below this. Its KV cache's used length then stays within one
padding block, so llama.cpp never rebuilds its graph for a longer cache mid-run: each rebuild made the
CUDA back end run two steps without its CUDA graph and capture it again (4.2-4.8 ms against 2.7 on the
H100), which was the steady p99 and could pass for a load's stall."""
MARK_BEFORE_S = 0.02  # --log-marks: how far before a slow step its log lines are shown


class LogMarks:
    """llama.cpp's log lines, each stamped when it came: where a slow step of the serving context falls
    among the loader's own steps. The engine's callback is replaced by one that only stamps the line's
    bytes (about what the engine's own costs per line: it decodes, joins and drops what is below its
    level), so the marks do not add interpreter-lock time to the load. Python logging of every line
    did: about 1,000 debug lines held the lock for up to 6 ms of the load on the H100."""

    def __init__(self, lib: Any) -> None:
        self.raw: list[tuple[float, int, bytes]] = []
        self._lines: list[tuple[float, str]] | None = None
        stamp = self.raw.append
        clock = time.perf_counter
        feed = feed_line  # (--hold-alloc's watch reads the lines too)

        def mark(level: int, text: bytes | None, _user: object) -> None:
            stamp((clock(), level, text or b""))
            feed(level, text or b"")
        self._cb = lib.llama_log_callback(mark)
        lib.llama_log_set(self._cb, ctypes.c_void_p(0))  # kept alive by self for the life of the run

    def between(self, a: float, b: float) -> list[tuple[float, str]]:
        """The whole lines that began within [a, b] (a continuation joins the line it continues)."""
        return [(t, line) for t, line in self.lines() if a <= t <= b]

    def lines(self) -> list[tuple[float, str]]:
        """The stamped bytes as whole lines, joined once (read after the load, when no more come)."""
        if self._lines is None:
            lines: list[tuple[float, str]] = []
            for t, level, text in self.raw:
                msg = text.decode("utf-8", "replace")
                if level == 5 and lines:  # GGML_LOG_LEVEL_CONT
                    lines[-1] = (lines[-1][0], lines[-1][1] + msg)
                else:
                    lines.append((t, msg))
            self._lines = [(t, line.rstrip()) for t, line in lines if line.strip()]
        return self._lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--serving", type=Path, default=models_dir() / SMOLLM, help="the model that keeps decoding")
    ap.add_argument("--model", type=Path, required=True, help="the model loaded beside it")
    ap.add_argument("--n-ctx", type=int, default=4096, help="both contexts' n_ctx (default 4096, as bench_reload)")
    ap.add_argument("--alloc-mb", type=int, default=2048, help="bytes of the raw cudaMalloc phases (MiB)")
    ap.add_argument("--pause", type=float, default=0.25, help="seconds between phases")
    ap.add_argument("--threads", type=int, default=0,
                    help="both contexts' CPU threads (default: llama.cpp's own, 4; the engine's default is every core)")
    ap.add_argument("--slots", type=int, default=1, help="both contexts' sequences (n_seq_max; the engine's default is 4)")
    ap.add_argument("--through-engine", action="store_true",
                    help="load the new model and make both contexts through the engine's own wrappers and callbacks")
    ap.add_argument("--loader-nice", type=int, default=0, metavar="N",
                    help="lower the loading thread's priority by N (Linux: per thread; the thread pools llama.cpp "
                         "starts from it inherit it). On the 2-core machine 19 starved the load (12-39 s) and left "
                         "the stalls as they were, which is why the engine lends threads (load_threads) instead")
    ap.add_argument("--no-mmap", action="store_true",
                    help="read the loaded model instead of mapping it (the engine's use_mmap: false): llama.cpp then "
                         "uploads it in 1 MiB chunks through page-locked staging buffers, not a tensor at a time")
    ap.add_argument("--pageable-context", action="store_true",
                    help="create the loaded model's context with pageable host buffers, as the engine "
                         "does beside a serving generation with cuda_pinned_host: alone")
    ap.add_argument("--pageable-load", action="store_true",
                    help="load the model with pageable host buffers too (GGML_CUDA_NO_PINNED through the engine's "
                         "gate, open over the load): no page-locked staging buffers, no page-locked CPU weights")
    ap.add_argument("--no-host", action="store_true",
                    help="with --no-mmap: keep the weights left on the CPU in ordinary memory, not a page-locked "
                         "host buffer (the engine's no_host: true)")
    ap.add_argument("--log-marks", type=float, default=0.0, metavar="X",
                    help="print each step of the load and the context's creation longer than "
                         "X times the steady median beside llama.cpp's log lines around it (every level), to place "
                         "a stall among the loader's own steps")
    ap.add_argument("--hold-alloc", action="store_true",
                    help="the serving loop waits at a step's boundary while the loader allocates the model's buffers "
                         "(from its last tensor's creation to its first upload; scripts/alloc_hold.py)")
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args()
    if args.pageable_context or args.pageable_load:
        PAGEABLE_BESIDE.arm()

    import llama_cpp as L

    sys.setswitchinterval(EngineSettings().switch_interval_ms / 1000)
    params = RuntimeParams(n_ctx=args.n_ctx, n_batch=512, n_ubatch=512, n_parallel=args.slots,
                           n_threads=args.threads, n_gpu_layers=-1)
    if args.through_engine:
        llama.lib()  # the engine's log callback (into Python logging) and backend set-up
        serving_model = llama.Model.load(args.serving, params)
        ctx = llama.Context(serving_model, params).ptr
        serving = serving_model.ptr
    else:
        quiet = L.llama_log_callback(lambda level, text, _user: feed_line(level, text or b""))
        L.llama_log_set(quiet, ctypes.c_void_p(0))
        L.llama_backend_init()
        mp = L.llama_model_default_params()
        mp.n_gpu_layers = 999
        serving = L.llama_model_load_from_file(str(args.serving).encode(), mp)
        cp = L.llama_context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_seq_max = args.n_ctx, 512, 512, args.slots
        if args.threads:
            cp.n_threads = cp.n_threads_batch = args.threads
        ctx = L.llama_init_from_model(serving, cp)
    if not serving or not ctx:
        raise SystemExit(f"could not load {args.serving}")
    marks = LogMarks(L) if args.log_marks else None
    if args.hold_alloc and args.through_engine and marks is None:  # the engine's callback feeds no watch
        feeding = L.llama_log_callback(lambda level, text, _user: feed_line(level, text or b""))
        L.llama_log_set(feeding, ctypes.c_void_p(0))
    cuda = _cudart()
    libc = ctypes.CDLL(None)

    steps: list[tuple[float, float]] = []
    stop = threading.Event()
    hold = StepHold() if args.hold_alloc else None

    def decode_loop() -> None:
        tok = (L.llama_token * 1)(1)
        pos = 0
        while not stop.is_set():
            if pos >= SERVING_SPAN:
                L.llama_memory_clear(L.llama_get_memory(ctx), True)
                pos = 0
            batch = L.llama_batch_get_one(tok, 1)
            t0 = time.perf_counter()
            if hold is not None:
                hold.enter_step()
            L.llama_decode(ctx, batch)
            L.llama_synchronize(ctx)
            if hold is not None:
                hold.exit_step()
            steps.append((t0, time.perf_counter()))
            pos += 1

    waits: list[tuple[float, float]] = []

    def probe_loop() -> None:
        while not stop.is_set():
            t0 = time.perf_counter()
            for _ in range(20):
                libc.getpid()
            waits.append((t0, time.perf_counter()))
            time.sleep(0.0002)

    maps: list[tuple[float, float]] = []
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]

    def map_loop() -> None:
        """A thread that maps, touches and unmaps 1 MiB, as an allocator does (glibc's large blocks,
        Python's arenas, a driver's host allocations): each needs the process's memory-map lock for writing."""
        size, prot, flags = 1 << 20, 0x1 | 0x2, 0x02 | 0x20  # PROT_READ|PROT_WRITE, MAP_PRIVATE|MAP_ANONYMOUS
        while not stop.is_set():
            t0 = time.perf_counter()
            addr = libc.mmap(None, size, prot, flags, -1, 0)
            if addr and addr != ctypes.c_void_p(-1).value:
                ctypes.memset(addr, 1, 1)
                libc.munmap(addr, size)
            maps.append((t0, time.perf_counter()))
            time.sleep(0.001)

    phases: list[tuple[str, float, float]] = []

    def phase(name: str, fn) -> object:
        t0 = time.perf_counter()
        out = fn()
        phases.append((name, t0, time.perf_counter()))
        time.sleep(args.pause)
        return out

    with open(args.model, "rb") as f:  # in the page cache, as a model the engine loads again is
        while f.read(64 << 20):
            pass
    worker = threading.Thread(target=decode_loop, daemon=True)
    worker.start()
    prober = threading.Thread(target=probe_loop, daemon=True)
    prober.start()
    mapper = threading.Thread(target=map_loop, daemon=True)
    mapper.start()
    time.sleep(1.0)
    steady_end = time.perf_counter()

    if cuda is not None:
        nbytes = args.alloc_mb << 20
        ptr = ctypes.c_void_p()
        phase("cudaMalloc one call", lambda: cuda.cudaMalloc(ctypes.byref(ptr), ctypes.c_size_t(nbytes)))
        phase("cudaFree one call", lambda: cuda.cudaFree(ptr))
        chunks = [ctypes.c_void_p() for _ in range(nbytes // (64 << 20))]
        phase("cudaMalloc 64 MiB calls",
              lambda: [cuda.cudaMalloc(ctypes.byref(c), ctypes.c_size_t(64 << 20)) for c in chunks])
        phase("cudaFree 64 MiB calls", lambda: [cuda.cudaFree(c) for c in chunks])
        phase("cudaMalloc one call, again", lambda: cuda.cudaMalloc(ctypes.byref(ptr), ctypes.c_size_t(nbytes)))
        phase("cudaFree one call, again", lambda: cuda.cudaFree(ptr))
    else:
        print("no CUDA runtime in this process (a CPU build): the raw cudaMalloc phases are left out")

    fd = os.open(args.model, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        # PROT_READ, MAP_SHARED | MAP_POPULATE: llama.cpp's flags for a mapped load with prefetch
        mapped = phase("mmap of the file with MAP_POPULATE", lambda: libc.mmap(None, size, 0x1, 0x01 | 0x08000, fd, 0))
        if mapped and mapped != ctypes.c_void_p(-1).value:
            phase("munmap of it", lambda: libc.munmap(mapped, size))
    finally:
        os.close(fd)

    if args.loader_nice:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), args.loader_nice)
    uploads: list[float] = []

    def upload(value: float) -> bool:
        uploads.append(time.perf_counter())
        return True

    watch = AllocationWatch(hold, gguf_meta.tensor_names(args.model)) if hold is not None else None
    progress = upload if watch is None else watch.wrap(upload)
    t_load = time.perf_counter()
    with PAGEABLE_BESIDE.open(args.pageable_load), \
            (lines_to(watch.line) if watch is not None else contextlib.nullcontext()):
        if args.through_engine:
            load_params = params.model_copy(update={"use_mmap": not args.no_mmap, "no_host": args.no_host})
            loaded = phase("model load (whole)", lambda: llama.Model.load(args.model, load_params, progress))
            model = loaded.ptr
        else:
            cb = L.llama_progress_callback(lambda value, _user: progress(value))
            mp2 = L.llama_model_default_params()
            mp2.n_gpu_layers = 999
            mp2.progress_callback = cb
            if args.no_mmap:
                mp2.load_mode = L.LLAMA_LOAD_MODE_NONE
            mp2.no_host = args.no_host
            model = phase("model load (whole)", lambda: L.llama_model_load_from_file(str(args.model).encode(), mp2))
    load_end = next(t1 for name, _, t1 in phases if name == "model load (whole)")
    if watch is not None:
        watch.close()
        if watch.began is not None and watch.ended is not None:  # (time.monotonic is perf_counter's clock on Linux)
            phases.append(("model load: the held allocations", watch.began, watch.ended))
    if uploads:
        phases.append(("model load: before the first upload", t_load, uploads[0]))
        phases.append(("model load: uploads", uploads[0], uploads[-1]))
        phases.append(("model load: after the last upload", uploads[-1], load_end))
    with PAGEABLE_BESIDE.open(args.pageable_context):
        if args.through_engine:
            ctx2 = phase("context creation", lambda: llama.Context(loaded, params).ptr)
        else:
            ctx2 = phase("context creation", lambda: L.llama_init_from_model(model, cp))
    tok = (L.llama_token * 8)(*([1] * 8))
    phase("warm-up decode (8 tokens)", lambda: (L.llama_decode(ctx2, L.llama_batch_get_one(tok, 8)), L.llama_synchronize(ctx2)))
    phase("context free", lambda: L.llama_free(ctx2))
    phase("model free", lambda: L.llama_model_free(model))
    stop.set()
    worker.join()
    prober.join()
    mapper.join()

    base = [b - a for a, b in steps if b < steady_end]
    med = statistics.median(base)
    probe_base = [b - a for a, b in waits if b < steady_end]
    probe_p99 = sorted(probe_base)[int(len(probe_base) * 0.99)]
    map_base = [b - a for a, b in maps if b < steady_end]
    map_p99 = sorted(map_base)[int(len(map_base) * 0.99)]
    way = "the engine's wrappers" if args.through_engine else "llama.cpp's C API"
    threads = args.threads or ("every core" if args.through_engine else "llama.cpp's default")
    print(f"through {way}; threads {threads}, slots {args.slots}")
    print(f"steady step (serving {args.serving.name}): median {med * 1000:.2f} ms, p99 "
          f"{sorted(base)[int(len(base) * 0.99)] * 1000:.2f} ms over {len(base)} steps; "
          f"probe batch p99 {probe_p99 * 1e6:.0f} µs; map call p99 {map_p99 * 1e6:.0f} µs")
    print("| phase | phase ms | steps in it | median step ms | longest step ms | longest ÷ steady median "
          "| longest probe batch µs | longest map call ms |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    rows = []
    for name, t0, t1 in phases:
        inside = [b - a for a, b in steps if b > t0 and a < t1]
        longest = max(inside, default=0.0)
        probe = max((b - a for a, b in waits if b > t0 and a < t1), default=0.0)
        mapped = max((b - a for a, b in maps if b > t0 and a < t1), default=0.0)
        rows.append({"phase": name, "ms": (t1 - t0) * 1000, "steps": len(inside),
                     "median_step_ms": statistics.median(inside) * 1000 if inside else None,
                     "longest_step_ms": longest * 1000, "longest_probe_us": probe * 1e6,
                     "longest_map_ms": mapped * 1000})
        print(f"| {name} | {(t1 - t0) * 1000:.1f} | {len(inside)} | "
              f"{statistics.median(inside) * 1000 if inside else 0:.2f} | {longest * 1000:.2f} | {longest / med:.1f} "
              f"| {probe * 1e6:.0f} | {mapped * 1000:.2f} |")
    held: dict[str, Any] = {}
    if hold is not None:
        held = {"holds": hold.holds, "held_ms": hold.held_s * 1000, "steps_waited_ms": hold.steps_waited_s * 1000}
        print(f"--hold-alloc: {hold.holds} window(s) held, {hold.held_s * 1000:.2f} ms in all; the serving loop "
              f"waited {hold.steps_waited_s * 1000:.2f} ms for them")
    slow_steps: list[dict] = []
    if marks is not None:
        loading = [(t0, t1) for name, t0, t1 in phases if name in ("model load (whole)", "context creation")]
        slow = [(a, b) for a, b in steps if b - a > args.log_marks * med and any(b > t0 and a < t1 for t0, t1 in loading)]
        print(f"\nsteps of the load and the context's creation over {args.log_marks}x the steady median, with "
              f"llama.cpp's log lines from {MARK_BEFORE_S * 1000:.0f} ms before each to its end (ms from the step's start):")
        for a, b in slow:
            print(f"- step of {(b - a) * 1000:.2f} ms at {(a - t_load) * 1000:.1f} ms into the load:")
            lines = [((t - a) * 1000, line) for t, line in marks.between(a - MARK_BEFORE_S, b)]
            before = [x for x in lines if x[0] < 0][-3:]  # what the loader had just done
            during = [x for x in lines if x[0] >= 0]
            shown = before + (during if len(during) <= 8 else during[:4] + [(None, f"... {len(during) - 7} more")]
                              + during[-3:])
            for at, line in shown:
                print(f"    {'' if at is None else f'{at:+7.2f}':>7}  {line[:160]}")
            slow_steps.append({"at_ms": (a - t_load) * 1000, "ms": (b - a) * 1000,
                               "lines": [[round(at, 3), line] for at, line in lines]})
    if args.json:
        Path(args.json).write_text(json.dumps({
            "through_engine": args.through_engine, "threads": args.threads, "slots": args.slots,
            "steady_median_ms": med * 1000, "probe_p99_us": probe_p99 * 1e6, "map_p99_us": map_p99 * 1e6,
            "phases": rows, **({"slow_steps": slow_steps} if marks is not None else {}),
            **({"hold": held} if held else {})}, indent=1))
    L.llama_free(ctx)
    L.llama_model_free(serving)  # the engine's Model wrappers have no finaliser: freed here either way
    return 0


if __name__ == "__main__":
    sys.exit(main())
