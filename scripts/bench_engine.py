#!/usr/bin/env python3
"""Benchmark hydrad against llama.cpp's own llama-server on the same GGUF, same settings.

Both servers are started on loopback with matching context, batch, slot, thread and KV
settings; then the same workloads are driven through ``POST /v1/completions`` (streaming,
``temperature: 0``, ``ignore_eos: true``, fixed seed) in alternating A/B pairs: a hydrad run,
then a llama-server run, repeated ``--runs`` times. Only one server works at a time, so on a
small machine neither steals cores from the other. Every prompt carries a fresh random prefix
and prompt caching is off on both sides, so each run prefills its whole prompt.

Workloads (prompt tokens are exact, counted with the model's own tokenizer):

  a  1 stream,   128-token prompt, 256 generated   (decode-bound)
  b  8 streams,  128-token prompt, 256 generated   (continuous batching; aggregate tok/s)
  c  1 stream,  2048-token prompt,  32 generated   (prefill-bound)
  d  1 stream,   512-token prompt,   1 generated   (time to first token)
  e  1 stream,   128-token prompt, 256 generated, ``logprobs: 5``   (decode with the log-probabilities
     of each token and its 5 most likely alternatives; llama-server reads ``logprobs`` as its
     ``n_probs``; not in the default set)
  f  as (a), sampled: ``temperature 0.8, top_k 40, top_p 0.95`` (what most clients send), seed fixed
  g  as (b), sampled likewise
  h  32 streams, 128-token prompt, 128 generated   (many streams; needs ``--n-parallel 32`` or more)
  i  64 streams, 128-token prompt, 128 generated   (needs ``--n-parallel 64`` and ``--n-ctx`` ≥ 16384)
  j  as (a), held by a GBNF ``grammar`` (WORDS_GRAMMAR: a JSON-like list of lower-case words that
     never has to end, so ``ignore_eos`` cannot meet a grammar whose only continuation is the end
     and both servers generate exactly 256 tokens): the cost of constrained decoding
  k  1 stream,   512-token prompt,   1 generated, the prompt cached: the same prompt every run with
     ``cache_prompt: true``, answered by each server just before each timed run, so only its last token is
     evaluated and the TTFT is each server's own time around a request (HTTP, parsing, tokenizing,
     the slot, hand-overs), the part of (d) that is not the prefill
  l  1 stream,  ~540-token prompt, 400 generated, copying: the prompt asks for COPY_CODE back (494
     tokens of Python) and greedy decoding copies it, the case speculative decoding by n-gram lookup
     is for. Run it twice, plain and with ``--spec KIND`` (both servers speculate the same way at
     llama-server's sizes: ngram-simple, ngram-mod, or draft-simple with a draft model), and compare
     the decode tok/s of the two runs; the table also says how many runs' answers were the plain ones
  m  1 stream,  562-token prompt, 400 generated, a code edit: COPY_CODE handed back with a parameter renamed
  n  1 stream,  708-token prompt, 300 generated, extraction: the ERROR lines of a 14-line log, as written
  (f to n are not in the default set)

Before the workloads, each server is also asked for the same 4 streams (32-token prompt, 64
generated) one after another and then all at once: the ratio of the two wall times is what
continuous batching buys ("batching speedup"; above 1 when concurrent streams share decode
steps). The engine's tests check only that concurrent streams all complete and overlap; the
speed claim is measured here.

Metrics, measured by this client: TTFT (request sent → first streamed token), prefill tok/s
(prompt tokens / TTFT), decode tok/s ((generated - 1) / (last token - first token)) and, for
(b), aggregate tok/s (all generated tokens / wall time of the batch). Tables show medians over
the runs and the ratio hydrad ÷ llama-server (for throughput higher is better; for TTFT the
ratio of times, lower is better).

Beside them, how evenly each server streams: the gaps between a stream's consecutive tokens
(median, p99, longest). A step that stalls now and then barely moves a decode rate but sets the
longest gap, which is what a reader of the stream sees; the reference's own longest gap on the
same host says how much of that is the host.

``--hydrad-only`` skips llama-server. hydrad's boot-to-READY time (from a NOTIFY_SOCKET this
script binds, as systemd would) and its model load seconds (``/control/loads/{id}``) are
reported in every mode.

Examples::

    .venv/bin/python scripts/bench_engine.py --hydrad-only --runs 3
    .venv/bin/python scripts/bench_engine.py --runs 5 --json bench.json --markdown
    .venv/bin/python scripts/bench_engine.py --workloads l,m,n --spec ngram-mod --n-parallel 1
    .venv/bin/python scripts/bench_engine.py --workloads l --spec draft-simple --n-parallel 1
"""

from __future__ import annotations

if __name__ == "__main__":  # run as scripts/NAME: under the checkout's .venv when there is one
    import _venv
    _venv.reexec()

import argparse
import asyncio
import contextlib
import ctypes
import datetime as dt
import functools
import hashlib
import json
import os
import platform
import random
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterator

import httpx
import yaml

REPO = Path(__file__).resolve().parents[1]
REGISTRY = REPO / "etc" / "hydra" / "models.yaml"
sys.path.insert(0, str(REPO))
from hydrad.common import heap  # noqa: E402
from hydrad.common.cpus import usable_cpus  # noqa: E402
DEFAULT_MODELS = "smollm2-135m,gemma3-270m"

# Filler words that are one token each (with their leading space) in common BPE vocabularies.
FILLER = ("the of and to in is was for on that with as by at from it this be are or an which "
          "one all we can has more when will about if there time some year new people would "
          "their what out up other into only also its two after first made well may day").split()


# ----- workloads ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Workload:
    """One request shape: ``streams`` concurrent requests of ``n_prompt`` → ``n_gen`` tokens."""

    key: str
    n_prompt: int
    n_gen: int
    streams: int
    logprobs: int | None = None  # each request asks for its tokens' log-probabilities and this many alternatives
    sampled: bool = False  # SAMPLED's temperature/top-k/top-p instead of greedy decoding
    grammar: str | None = None  # a GBNF grammar every request is held to
    cached: bool = False  # one prompt for every run, prompt caching on: only its last token is evaluated
    copy: str = ""  # the prompt asks for this text's (ASKS) input back, whole or in part: COPY_CODE, an edit, lines

    @property
    def label(self) -> str:
        s = f"{self.streams}×" if self.streams > 1 else "1×"
        extra = f", top-{self.logprobs} logprobs" if self.logprobs is not None else ""
        extra += ", sampled" if self.sampled else ""
        extra += ", grammar" if self.grammar is not None else ""
        extra += ", prompt cached" if self.cached else ""
        extra += {"": "", "code": ", copying code", "edit": ", editing code", "lines": ", extracting lines"}[self.copy]
        return f"({self.key}) {s}{self.n_prompt}→{self.n_gen}{extra}"


# What most clients send: sampling, not argmax. The seed is fixed per request, so both servers draw
# from the same distribution shapes; the tokens themselves may differ (their samplers differ).
SAMPLED = {"temperature": 0.8, "top_k": 40, "top_p": 0.95}


# Words in an open list: "[" word ("," " "? word)*, no closing bracket. Every state can go on, so
# banning the end of generation (ignore_eos) never leaves a grammar with nothing to sample, and the
# token count is the workload's on both servers; the model is free within it (greedy).
WORDS_GRAMMAR = 'root ::= "[\\"" word "\\"" ("," " "? "\\"" word "\\"")*\nword ::= [a-z]+'

WORKLOADS: dict[str, Workload] = {
    "a": Workload("a", 128, 256, 1),
    "b": Workload("b", 128, 256, 8),
    "c": Workload("c", 2048, 32, 1),
    "d": Workload("d", 512, 1, 1),
    "e": Workload("e", 128, 256, 1, logprobs=5),
    "f": Workload("f", 128, 256, 1, sampled=True),
    "g": Workload("g", 128, 256, 8, sampled=True),
    "h": Workload("h", 128, 128, 32),
    "i": Workload("i", 128, 128, 64),
    "j": Workload("j", 128, 256, 1, grammar=WORDS_GRAMMAR),
    "k": Workload("k", 512, 1, 1, cached=True),
    "l": Workload("l", 540, 400, 1, copy="code"),
    "m": Workload("m", 562, 400, 1, copy="edit"),
    "n": Workload("n", 708, 300, 1, copy="lines"),
}

BATCHING = Workload("batching", 32, 64, 4)  # streams one after another, then all at once

# (metric, unit, higher_is_better) per workload, in table order
METRICS: dict[str, list[tuple[str, str, bool]]] = {
    "a": [("ttft_ms", "TTFT ms", False), ("prefill_tps", "prefill tok/s", True), ("decode_tps", "decode tok/s", True)],
    "b": [("aggregate_tps", "aggregate tok/s", True), ("ttft_ms", "TTFT ms (median stream)", False),
          ("prefill_tps", "prefill tok/s (all prompts)", True), ("decode_tps", "decode tok/s (median stream)", True)],
    "c": [("ttft_ms", "TTFT ms", False), ("prefill_tps", "prefill tok/s", True), ("decode_tps", "decode tok/s", True)],
    "d": [("ttft_ms", "TTFT ms", False), ("prefill_tps", "prefill tok/s", True)],
    "e": [("ttft_ms", "TTFT ms", False), ("prefill_tps", "prefill tok/s", True), ("decode_tps", "decode tok/s", True)],
}
METRICS["f"] = METRICS["j"] = METRICS["l"] = METRICS["m"] = METRICS["n"] = METRICS["a"]
METRICS["k"] = [("ttft_ms", "TTFT ms (the server's own time)", False)]
METRICS["g"] = METRICS["h"] = METRICS["i"] = METRICS["b"]


# What workload (l) asks to have copied back: code, as an edit of a file hands a model its file.
COPY_CODE = 'COPY_CODE = \'\'\'class LRUCache:\n    """A fixed-size mapping that forgets the least recently used key first."""\n\n    def __init__(self, capacity: int) -> None:\n        if capacity <= 0:\n            raise ValueError("capacity must be positive")\n        self.capacity = capacity\n        self.items: dict[str, int] = {}\n        self.order: list[str] = []\n\n    def get(self, key: str) -> int | None:\n        if key not in self.items:\n            return None\n        self.order.remove(key)\n        self.order.append(key)\n        return self.items[key]\n\n    def put(self, key: str, value: int) -> None:\n        if key in self.items:\n            self.order.remove(key)\n        elif len(self.items) >= self.capacity:\n            oldest = self.order.pop(0)\n            del self.items[oldest]\n        self.items[key] = value\n        self.order.append(key)\n\n    def __len__(self) -> int:\n        return len(self.items)\n\n\ndef word_counts(text: str, stop_words: set[str]) -> list[tuple[str, int]]:\n    """The words of ``text`` with how often each occurs, most frequent first."""\n    counts: dict[str, int] = {}\n    for raw in text.split():\n        word = raw.strip(".,;:!?\\\\"\'()").lower()\n        if not word or word in stop_words:\n            continue\n        counts[word] = counts.get(word, 0) + 1\n    return sorted(counts.items(), key=lambda item: (-item[1], item[0]))\n\n\ndef merge_sorted(left: list[int], right: list[int]) -> list[int]:\n    out: list[int] = []\n    i = j = 0\n    while i < len(left) and j < len(right):\n        if left[i] <= right[j]:\n            out.append(left[i])\n            i += 1\n        else:\n            out.append(right[j])\n            j += 1\n    out.extend(left[i:])\n    out.extend(right[j:])\n    return out\n\'\'\'\n'
COPY_ASK = "Repeat this code exactly:\n\n" + COPY_CODE + "\nHere it is:\n\n"
# (m): an edit that hands back the file changed in a few places (a rename).
EDIT_ASK = ("Rename the parameter capacity to max_items everywhere in this code and give back the whole code:\n\n"
            + COPY_CODE + "\nThe code with capacity renamed to max_items:\n\n")
# (n): extraction: the lines of a log that name an error, as written.
LOG_LINES = "\n".join(
    f"2026-03-{1 + i // 9:02d} 0{i % 10}:{(7 * i) % 60:02d}:{(13 * i) % 60:02d} "
    + (f"ERROR payment-service: charge {1000 + 37 * i} for order A{4400 + i} failed: card declined (code {50 + i % 7})"
       if i % 3 == 0 else f"INFO web-frontend: GET /orders/A{4400 + i} 200 in {20 + (11 * i) % 90} ms")
    for i in range(14))
EXTRACT_ASK = ("Copy every ERROR line of this log, exactly as written, one per line:\n\n" + LOG_LINES
               + "\n\nThe ERROR lines:\n\n")
ASKS = {"code": COPY_ASK, "edit": EDIT_ASK, "lines": EXTRACT_ASK}

# ----- prompts with an exact token count -----------------------------------------------------


class Tokenizer:
    """The model's vocabulary only (no weights), through llama-cpp-python's low-level API.

    Tokenizes exactly as both servers do for a completion prompt: special tokens added
    (BOS where the model wants one) and parsed.
    """

    _log_cb: Any = None

    def __init__(self, path: Path) -> None:
        import llama_cpp as lib

        self.lib = lib
        if Tokenizer._log_cb is None:  # silence llama.cpp's load chatter; keep the callback alive
            Tokenizer._log_cb = lib.llama_log_callback(lambda _lvl, _text, _user: None)
            lib.llama_log_set(Tokenizer._log_cb, ctypes.c_void_p(0))
            lib.llama_backend_init()
        mp = lib.llama_model_default_params()
        mp.vocab_only = True
        self.model = lib.llama_model_load_from_file(str(path).encode(), mp)
        if not self.model:
            raise SystemExit(f"bench: cannot read the vocabulary of {path}")
        self.vocab = lib.llama_model_get_vocab(self.model)

    def count(self, text: str) -> int:
        data = text.encode("utf-8")
        cap = len(data) + 16
        buf = (self.lib.llama_token * cap)()
        n = self.lib.llama_tokenize(self.vocab, data, len(data), buf, cap, True, True)
        if n < 0:
            raise RuntimeError(f"tokenize failed ({n})")
        return int(n)

    def close(self) -> None:
        if self.model:
            self.lib.llama_model_free(self.model)
            self.model = None


class PromptMaker:
    """Prompts of an exact token count that never share more than a token or two of prefix."""

    def __init__(self, tok: Tokenizer, seed: int) -> None:
        self.tok = tok
        self.rng = random.Random(seed)
        self.serial = 0

    def make(self, n_tokens: int) -> str:
        self.serial += 1
        head = f"{self.rng.randrange(10**8, 10**9)} run {self.serial}:"
        for attempt in range(50):
            words = [self.rng.choice(FILLER) for _ in range(n_tokens + 8)]
            k = max(1, n_tokens - self.tok.count(head))
            seen: set[int] = set()
            while k not in seen and 0 < k <= len(words):
                seen.add(k)
                n = self.tok.count(head + " " + " ".join(words[:k]))
                if n == n_tokens:
                    return head + " " + " ".join(words[:k])
                k += n_tokens - n if abs(n_tokens - n) > 1 else (1 if n < n_tokens else -1)
            head += f" {attempt}"
        raise RuntimeError(f"could not build a prompt of exactly {n_tokens} tokens")

    def copying(self, n_tokens: int, ask: str = COPY_ASK) -> str:
        """A prompt of exactly ``n_tokens`` of ``ask`` (what it asks to have copied back, whole or in
        part), after a fresh filler head (the head's length found by trying those near the difference of
        the counts)."""
        body = self.tok.count(ask)
        for n_head in (n_tokens - body + d for d in (0, -1, -2, 1, -3, 2)):
            prompt = self.make(max(2, n_head)) + "\n\n" + ask
            if self.tok.count(prompt) == n_tokens:
                return prompt
        raise RuntimeError(f"could not build a copy prompt of exactly {n_tokens} tokens")


# ----- servers ------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class NotifyListener:
    """An AF_UNIX datagram socket that receives sd_notify messages, stamped on arrival."""

    def __init__(self, path: Path) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        path.unlink(missing_ok=True)  # a server that died left its socket: a restart binds anew
        self.sock.bind(str(path))
        self.sock.settimeout(0.1)
        self.path = path
        self.messages: list[tuple[float, str]] = []
        self._stop = False
        self._t = threading.Thread(target=self._read, daemon=True)
        self._t.start()

    def _read(self) -> None:
        while not self._stop:
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return
            self.messages.append((time.perf_counter(), data.decode("utf-8", "replace")))

    def wait_for(self, line: str, timeout: float) -> float:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for t, m in list(self.messages):
                if line in m.splitlines():
                    return t
            time.sleep(0.002)
        raise RuntimeError(f"no {line} on NOTIFY_SOCKET within {timeout:.0f}s")

    def close(self) -> None:
        self._stop = True
        self.sock.close()


@dataclass
class ServerSettings:
    """Settings both servers get, so that they do the same work."""

    n_ctx: int
    n_batch: int
    n_ubatch: int
    n_parallel: int
    kv_unified: bool
    threads: int
    flash_attn: str
    gpu_layers: int
    hydrad_params: dict[str, Any] = field(default_factory=dict)  # hydrad's alone, e.g. {"text_overlap": "off"}


def _die_with_parent() -> None:
    """In the child: get SIGTERM when the benchmark dies, so no server outlives it."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class Server:
    """A server subprocess with a log file; the base of both sides."""

    name = "server"

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = workdir / f"{self.name}.log"
        self.timings: dict[str, float] = {}
        self.wrap: list[str] = []  # a command the server runs under (a profiler's), none by default

    def log_tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def _check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.log_tail()}")

    def wait_health(self, timeout: float) -> float:
        """Poll /health until 200; returns the time it answered."""
        deadline = time.monotonic() + timeout
        with httpx.Client(timeout=5) as c:
            while time.monotonic() < deadline:
                self._check_alive()
                try:
                    if c.get(self.url + "/health").status_code == 200:
                        return time.perf_counter()
                except httpx.TransportError:
                    pass
                time.sleep(0.02)
        raise RuntimeError(f"{self.name} not healthy within {timeout:.0f}s:\n{self.log_tail()}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def hydrad_yaml(s: ServerSettings, port: int, rpc_port: int, extra: dict[str, Any]) -> dict[str, Any]:
    """hydrad's engine YAML: the settings both servers share, then ``--hydrad-config``. Its ``defaults``
    are merged into the bench's own (a variant such as ``{"defaults": {"use_mmap": false}}`` must not
    drop n_parallel and the rest, which would leave the two servers doing different work); its other
    keys are the engine's own."""
    extra = dict(extra)
    extra_defaults = extra.pop("defaults", {})
    return {
        "name": "bench", "http": {"host": "127.0.0.1", "port": port},
        "rpc": {"host": "127.0.0.1", "port": rpc_port},
        "models_dir": str(models_dir()), "registry": str(REGISTRY), "drain_timeout_s": 5,
        "logging": {"level": "warning"},
        "defaults": {"n_ctx": s.n_ctx, "n_batch": s.n_batch, "n_ubatch": s.n_ubatch,
                     "n_parallel": s.n_parallel, "kv_unified": s.kv_unified, "n_threads": s.threads,
                     "n_threads_batch": s.threads, "flash_attn": s.flash_attn,
                     "n_gpu_layers": s.gpu_layers, "cache_prompt": False, **s.hydrad_params, **extra_defaults},
        **extra,
    }


class Hydrad(Server):
    """hydrad started model-less (boot to READY=1 timed), then configured with the model."""

    name = "hydrad"

    def __init__(self, workdir: Path, settings: ServerSettings, env_lib: str | None,
                 config: dict[str, Any] | None = None) -> None:
        super().__init__(workdir)
        self.settings = settings
        self.env_lib = env_lib
        self.config = config or {}  # extra engine YAML (--hydrad-config)
        self.notify: NotifyListener | None = None

    def start(self) -> None:
        cfg = hydrad_yaml(self.settings, self.port, free_port(), self.config)
        path = self.workdir / "hydrad.yaml"
        path.write_text(yaml.safe_dump(cfg))
        self.notify = NotifyListener(self.workdir / "notify.sock")
        env = dict(os.environ, NOTIFY_SOCKET=str(self.notify.path), PYTHONUNBUFFERED="1")
        env.pop("JOURNAL_STREAM", None)
        if self.env_lib:
            env["LLAMA_CPP_LIB_PATH"] = self.env_lib
        python = REPO / ".venv" / "bin" / "python"
        argv = [str(python if python.exists() else Path(sys.executable)), "-m", "hydrad.cli.hydrad", "--config", str(path)]
        t0 = time.perf_counter()
        self.proc = subprocess.Popen([*self.wrap, *argv], stdout=open(self.log_path, "wb"), stderr=subprocess.STDOUT,
                                     env=env, cwd=str(self.workdir), preexec_fn=_die_with_parent)
        ready = self.notify.wait_for("READY=1", 60)
        self.timings["boot_to_ready_ms"] = (ready - t0) * 1000

    def load(self, model: str) -> None:
        """Configure the model; record the engine's own load seconds and configure→healthy."""
        with httpx.Client(base_url=self.url, timeout=30) as c:
            t0 = time.perf_counter()
            r = c.post("/control/configure", json={"model": model})
            if r.status_code != 202:
                raise RuntimeError(f"hydrad configure answered {r.status_code}: {r.text}")
            load_id = r.json()["load_id"]
            deadline = time.monotonic() + 600
            while True:
                self._check_alive()
                rec = c.get(f"/control/loads/{load_id}").json()
                if rec["phase"] in ("done", "failed"):
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"hydrad load {load_id} did not finish: {rec}")
                time.sleep(0.02)
            if rec["phase"] == "failed":
                raise RuntimeError(f"hydrad could not load {model}: {rec['error']}")
            healthy = self.wait_health(60)
        self.timings["load_seconds"] = float(rec["seconds"])
        self.timings["configure_to_healthy_ms"] = (healthy - t0) * 1000

    def stop(self) -> None:
        super().stop()
        if self.notify is not None:
            self.notify.close()


class LlamaServer(Server):
    """llama.cpp's llama-server with the flags that mirror hydrad's context (and no web UI)."""

    name = "llama-server"

    def __init__(self, workdir: Path, binary: str, settings: ServerSettings, model_path: Path,
                 extra: list[str]) -> None:
        super().__init__(workdir)
        s = settings
        self.argv = [
            binary, "-m", str(model_path), "--host", "127.0.0.1", "--port", str(self.port),
            "-c", str(s.n_ctx), "-b", str(s.n_batch), "-ub", str(s.n_ubatch), "-np", str(s.n_parallel),
            "--kv-unified" if s.kv_unified else "--no-kv-unified",
            "-t", str(s.threads), "-tb", str(s.threads), "-fa", s.flash_attn,
            "-ngl", "all" if s.gpu_layers < 0 else str(s.gpu_layers),
            # what hydrad does (or does not do): a full-size SWA cache (llama.cpp's library
            # default), no host-memory prompt cache, no context checkpoints, no prompt reuse,
            # no automatic fitting of the context to memory
            "--swa-full", "--cache-ram", "0", "--ctx-checkpoints", "0", "--no-cache-prompt", "-fit", "off",
            "--no-ui", "--metrics", *extra,
        ]

    def start(self) -> None:
        t0 = time.perf_counter()
        self.proc = subprocess.Popen([*self.wrap, *self.argv], stdout=open(self.log_path, "wb"), stderr=subprocess.STDOUT,
                                     cwd=str(self.workdir), preexec_fn=_die_with_parent)
        healthy = self.wait_health(600)
        self.timings["start_to_healthy_ms"] = (healthy - t0) * 1000


# ----- CPU contention: other work on the machine spoils a run ------------------------------

_CLK = os.sysconf("SC_CLK_TCK")


def _system_busy_ticks() -> tuple[int, int]:
    """(busy, total) clock ticks of all CPUs since boot, from /proc/stat."""
    f = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = f[3] + (f[4] if len(f) > 4 else 0)  # idle + iowait
    total = sum(f[:8])  # guest time is already inside user
    return total - idle, total


def _proc_ticks(pid: int) -> int:
    """utime + stime of a process (all its threads) in clock ticks."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0
    return int(fields[11]) + int(fields[12])


class CpuGuard:
    """Measures how much of the machine's CPU went to processes other than the benchmark.

    The server under test and this client may use every core; anything else (another
    server's idle loop, someone's test suite) is "foreign" and makes the run unfair.
    """

    def __init__(self, own_pids: Callable[[], list[int]]) -> None:
        self.own_pids = own_pids

    def _own_ticks(self) -> int:
        t = os.times()
        return int((t.user + t.system) * _CLK) + sum(_proc_ticks(p) for p in self.own_pids())

    def idle_share(self, seconds: float = 1.0) -> float:
        """Fraction of all CPUs busy with foreign work over a short window (nothing of ours runs)."""
        return self.measure(lambda: time.sleep(seconds))[1]

    def measure(self, fn: Callable[[], Any]) -> tuple[Any, float]:
        """Run ``fn``; return its result and the foreign share of CPU capacity during it."""
        b0, t0 = _system_busy_ticks()
        o0 = self._own_ticks()
        result = fn()
        b1, t1 = _system_busy_ticks()
        o1 = self._own_ticks()
        total = max(t1 - t0, 1)
        return result, max(0.0, ((b1 - b0) - (o1 - o0)) / total)

    def watcher(self, threshold: float) -> Callable[[], bool]:
        """A check to call now and then during a run: True when other processes took more than
        ``threshold`` of the CPUs since the previous call."""
        busy, total = _system_busy_ticks()
        own = self._own_ticks()

        def check() -> bool:
            nonlocal busy, total, own
            b1, t1 = _system_busy_ticks()
            o1 = self._own_ticks()
            share = ((b1 - busy) - (o1 - own)) / max(t1 - total, 1)
            busy, total, own = b1, t1, o1
            return share > threshold

        return check

    def wait_quiet(self, threshold: float, max_wait: float, log: Callable[[str], None]) -> float:
        """Wait (up to ``max_wait`` s) until foreign load is at most ``threshold``; returns the last share."""
        deadline = time.monotonic() + max_wait
        share = self.idle_share()
        told = False
        while share > threshold and time.monotonic() < deadline:
            if not told:
                log(f"other processes use {share:.0%} of the CPUs; waiting for the machine to be quiet")
                told = True
            time.sleep(2.0)
            share = self.idle_share()
        return share


# ----- one streamed request -----------------------------------------------------------------


@dataclass
class Stream:
    """Client-side timings of one streamed completion (perf_counter seconds)."""

    t_send: float
    t_first: float = 0.0  # first event carrying a choice: the first token (or the end)
    t_tok_first: float = 0.0  # first event with text
    t_tok_last: float = 0.0  # last event with text
    t_end: float = 0.0
    text_events: int = 0
    prompt_tokens: int | None = None  # as the server reports them
    completion_tokens: int | None = None
    logprob_tokens: int = 0  # tokens whose log-probabilities the stream carried
    admit_ms: float | None = None  # hydrad's own timings: arrival → the request had its slot
    server: dict[str, float] = field(default_factory=dict)  # the answer's timings named in LAG_KEYS
    t_toks: list[float] = field(default_factory=list)  # when each event with text arrived
    text: list[str] = field(default_factory=list)  # the answer's pieces, to compare passes (--spec)
    drafts: tuple[int, int] | None = None  # speculative decoding: (draft_n, draft_n_accepted) from the timings


async def stream_completion(client: httpx.AsyncClient, url: str, payload: dict[str, Any]) -> Stream:
    st = Stream(time.perf_counter())
    async with client.stream("POST", url + "/v1/completions", json=payload) as r:
        if r.status_code != 200:
            body = (await r.aread()).decode(errors="replace")
            raise RuntimeError(f"{url}: HTTP {r.status_code}: {body[:500]}")
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            now = time.perf_counter()
            data = line[6:]
            if data == "[DONE]":
                break
            ev = json.loads(data)
            if "error" in ev:
                raise RuntimeError(f"{url}: stream error: {ev['error']}")
            choices = ev.get("choices") or []
            if choices:
                st.logprob_tokens += _logprob_tokens(choices[0].get("logprobs"))
                if not st.t_first:
                    st.t_first = now
                if choices[0].get("text"):
                    st.text.append(choices[0]["text"])
                    st.text_events += 1
                    st.t_tok_last = now
                    st.t_toks.append(now)
                    if not st.t_tok_first:
                        st.t_tok_first = now
            usage = ev.get("usage")
            if usage:
                st.prompt_tokens = usage.get("prompt_tokens", st.prompt_tokens)
                st.completion_tokens = usage.get("completion_tokens", st.completion_tokens)
            timings = ev.get("timings")
            if timings and st.completion_tokens is None:
                st.completion_tokens = timings.get("predicted_n")
            if timings and "draft_n" in timings:
                st.drafts = (int(timings["draft_n"]), int(timings.get("draft_n_accepted", 0)))
            if timings and timings.get("admit_ms") is not None:
                st.admit_ms = timings["admit_ms"]
            if timings:
                st.server.update({k: timings[k] for k in LAG_KEYS if isinstance(timings.get(k), (int, float))})
    st.t_end = time.perf_counter()
    return st


def token_gaps(times: list[float]) -> dict[str, float] | None:
    """The gaps between a stream's consecutive tokens (ms): median, p99 and longest. A server whose
    steps stall now and then shows it here and not in a decode rate."""
    gaps = sorted((b - a) * 1000 for a, b in zip(times, times[1:]))
    if len(gaps) < 2:
        return None
    return {"median_ms": statistics.median(gaps), "p99_ms": gaps[min(len(gaps) - 1, round(0.99 * (len(gaps) - 1)))],
            "max_ms": gaps[-1]}


def _logprob_tokens(logprobs: Any) -> int:
    """Tokens a chunk's ``logprobs`` covers: OpenAI's legacy shape (hydrad) or the chat-like
    ``content`` list llama-server sends on ``/v1/completions``."""
    if not isinstance(logprobs, dict):
        return 0
    return len(logprobs.get("tokens") or logprobs.get("content") or ())


def request_payload(prompt: str, n_gen: int, seed: int, slot: int, logprobs: int | None = None,
                    sampled: bool = False, grammar: str | None = None, cached: bool = False) -> dict[str, Any]:
    """Stream ``slot`` of a workload runs in slot ``slot`` on both servers (``id_slot``): each slot then
    holds at most its last request's KV, so idle caches never crowd the unified KV pool."""
    payload = {"prompt": prompt, "max_tokens": n_gen, "temperature": 0, "ignore_eos": True, "seed": seed,
               "stream": True, "stream_options": {"include_usage": True}, "cache_prompt": cached, "id_slot": slot}
    if logprobs is not None:
        payload["logprobs"] = logprobs
    if sampled:
        payload.update(SAMPLED, seed=seed + slot)
    if grammar is not None:
        payload["grammar"] = grammar
    return payload


class Disturbed(Exception):
    """Other processes took the CPUs in the middle of a run, so it was abandoned."""


async def _run_streams(url: str, payloads: list[dict[str, Any]],
                       disturbed: Callable[[], bool] | None) -> tuple[float, list[Stream]]:
    limits = httpx.Limits(max_connections=len(payloads) + 2, max_keepalive_connections=len(payloads) + 2)
    async with httpx.AsyncClient(timeout=httpx.Timeout(900, connect=10), limits=limits) as client:
        t0 = time.perf_counter()
        task = asyncio.ensure_future(asyncio.gather(*(stream_completion(client, url, p) for p in payloads)))
        while True:
            done, _ = await asyncio.wait({task}, timeout=1.0)
            if done:
                return t0, list(task.result())
            if disturbed is not None and disturbed():
                task.cancel()  # closing the streams makes both servers drop the requests
                with contextlib.suppress(asyncio.CancelledError, httpx.HTTPError):
                    await task
                raise Disturbed()


def run_workload(url: str, w: Workload, prompts: list[str], seed: int,
                 disturbed: Callable[[], bool] | None = None) -> dict[str, Any]:
    """Drive one run of a workload; returns its metrics and per-stream raw figures.

    ``disturbed`` is asked about once a second; when it says so the run is abandoned
    (:class:`Disturbed`) instead of crawling on under foreign load.
    """
    payloads = [request_payload(p, w.n_gen, seed, i, w.logprobs, w.sampled, w.grammar, w.cached)
                for i, p in enumerate(prompts)]
    t0, streams = asyncio.run(_run_streams(url, payloads, disturbed))
    per: list[dict[str, Any]] = []
    for st in streams:
        n_gen = st.completion_tokens if st.completion_tokens is not None else st.text_events
        if st.prompt_tokens is not None and st.prompt_tokens != w.n_prompt:
            print(f"bench: warning: {url} counted {st.prompt_tokens} prompt tokens, expected {w.n_prompt}",
                  file=sys.stderr)
        if n_gen != w.n_gen:
            print(f"bench: warning: {url} generated {n_gen} tokens, expected {w.n_gen}", file=sys.stderr)
        if w.logprobs is not None and st.logprob_tokens != n_gen:
            print(f"bench: warning: {url} sent log-probabilities for {st.logprob_tokens} of {n_gen} tokens",
                  file=sys.stderr)
        ttft = st.t_first - st.t_send
        decode = None
        if n_gen > 1 and st.t_tok_last > st.t_tok_first:
            decode = (n_gen - 1) / (st.t_tok_last - st.t_tok_first)
        per.append({"ttft_ms": ttft * 1000, "prefill_tps": w.n_prompt / ttft if ttft > 0 else None,
                    "decode_tps": decode, "completion_tokens": n_gen, "prompt_tokens_reported": st.prompt_tokens,
                    "text_events": st.text_events, "total_ms": (st.t_end - st.t_send) * 1000,
                    "logprob_tokens": st.logprob_tokens, "admit_ms": st.admit_ms, "server": st.server,
                    "token_gaps": token_gaps(st.t_toks), "drafts": st.drafts,
                    "text_sha": hashlib.sha256("".join(st.text).encode()).hexdigest()[:16]})
    out: dict[str, Any] = {"streams": per}
    if w.streams == 1:
        out.update({k: per[0][k] for k in ("ttft_ms", "prefill_tps", "decode_tps")})
    else:
        wall = max(st.t_end for st in streams) - t0
        last_first = max(st.t_first for st in streams) - t0
        out["aggregate_tps"] = sum(p["completion_tokens"] for p in per) / wall
        out["ttft_ms"] = statistics.median(p["ttft_ms"] for p in per)
        out["prefill_tps"] = w.n_prompt * w.streams / last_first
        decodes = [p["decode_tps"] for p in per if p["decode_tps"] is not None]
        out["decode_tps"] = statistics.median(decodes) if decodes else None
        out["wall_ms"] = wall * 1000
    gaps = [p["token_gaps"] for p in per if p["token_gaps"]]
    if gaps:  # the median stream's median and p99, the longest gap of any stream
        out["token_gaps"] = {"median_ms": statistics.median(g["median_ms"] for g in gaps),
                             "p99_ms": statistics.median(g["p99_ms"] for g in gaps),
                             "max_ms": max(g["max_ms"] for g in gaps)}
    admits = [p["admit_ms"] for p in per if p["admit_ms"] is not None]
    if admits:
        out["admit_ms_median"], out["admit_ms_max"] = statistics.median(admits), max(admits)
    lag = {k: statistics.median(vs) for k in LAG_KEYS if (vs := [p["server"][k] for p in per if k in p["server"]])}
    if lag:
        out["server_ms"] = lag
    return out


def batching_speedup(url: str, prompts: list[str], seed: int) -> dict[str, Any]:
    """The same streams one after another, then all at once; ``speedup`` is sequential ÷ concurrent
    wall time (above 1: continuous batching shares decode steps between them)."""
    one = Workload("batching-1", BATCHING.n_prompt, BATCHING.n_gen, 1)
    t0 = time.perf_counter()
    for p in prompts:
        run_workload(url, one, [p], seed)
    sequential = time.perf_counter() - t0
    t0 = time.perf_counter()
    run_workload(url, replace(BATCHING, streams=len(prompts)), prompts, seed)
    concurrent = time.perf_counter() - t0
    return {"streams": len(prompts), "sequential_s": round(sequential, 4), "concurrent_s": round(concurrent, 4),
            "speedup": round(sequential / concurrent, 3)}


# ----- the benchmark ------------------------------------------------------------------------


def models_dir() -> Path:
    return Path(os.environ.get("HYDRA_MODELS_DIR", REPO / "models"))


def resolve_model(name: str) -> tuple[str, Path]:
    """A registry alias or a GGUF path → (name hydrad is configured with, GGUF path)."""
    reg = yaml.safe_load(REGISTRY.read_text()).get("models", {})
    if name in reg:
        return name, models_dir() / reg[name]["path"]
    p = Path(name)
    if p.suffix == ".gguf" and p.exists():
        return str(p.resolve()), p.resolve()
    raise SystemExit(f"bench: unknown model {name!r} (registry aliases: {', '.join(reg)}; or a GGUF path)")


def llama_server_binary(path: str | None) -> str:
    if path:
        if not os.access(path, os.X_OK):
            raise SystemExit(f"bench: {path} is not an executable")
        return path
    print("bench: building (or finding) llama-server with scripts/build_llama_server ...", file=sys.stderr)
    r = subprocess.run([str(REPO / "scripts" / "build_llama_server"), "-q"], stdout=subprocess.PIPE, text=True)
    lines = r.stdout.strip().splitlines()
    if r.returncode != 0 or not lines:
        raise SystemExit("bench: scripts/build_llama_server failed; pass --llama-server PATH or --hydrad-only")
    return lines[-1]


@contextlib.contextmanager
def py_spy(pid: int, out: Path | None) -> Iterator[None]:
    """Sample hydrad with py-spy while the block runs (when asked to)."""
    if out is None:
        yield
        return
    exe = shutil.which("py-spy") or str(REPO / ".venv" / "bin" / "py-spy")
    if not os.access(exe, os.X_OK):
        raise SystemExit("bench: --profile needs py-spy (.venv/bin/pip install py-spy)")
    fmt = "speedscope" if out.suffix == ".json" else ("raw" if out.suffix == ".txt" else "flamegraph")
    proc = subprocess.Popen([exe, "record", "--pid", str(pid), "--output", str(out), "--format", fmt,
                             "--rate", "200", "--threads", "--nonblocking"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    time.sleep(1.0)
    try:
        yield
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            _, err = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
        if proc.returncode not in (0, -signal.SIGINT) and not out.exists():
            print(f"bench: py-spy failed: {err.decode(errors='replace')[-500:]}", file=sys.stderr)
        else:
            print(f"bench: profile written to {out}", file=sys.stderr)


STEP_PARTS = ("submit", "overlap", "device_wait", "sample", "between")
# Where the time to the first token went, as the servers' own `timings` say (median stream of a run):
# both report prompt_ms (the prompt's compute up to the first token); hydrad also the arrival at its
# HTTP handler → its engine thread's queue → its slot, and the first token → back at the handler.
LAG_KEYS = ("prompt_ms", "to_engine_ms", "admit_ms", "first_token_handoff_ms", "server_ttft_ms")


def step_counters(url: str) -> dict[str, float] | None:
    """A server's step counters from ``/metrics``: ``decodes`` (llama_decode calls, both servers;
    llama-server with ``--metrics``), and hydrad's ``steps`` and seconds per part; None when there
    are none."""
    try:
        text = httpx.get(url + "/metrics", timeout=10).text
    except httpx.HTTPError:
        return None
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("llamacpp:n_decode_total "):  # both servers (llama-server with --metrics)
            out["decodes"] = float(line.split()[-1])
        elif line.startswith("hydra_steps_total "):
            out["steps"] = float(line.split()[-1])
        elif line.startswith("hydra_step_seconds_total{"):
            part = line.split('part="', 1)[1].split('"', 1)[0]
            out[part] = float(line.split()[-1])
    return out or None


def step_profile(before: dict[str, float] | None, after: dict[str, float] | None) -> dict[str, float] | None:
    """Milliseconds per step by part over one run (the difference of two :func:`step_counters`)."""
    if not before or not after or after.get("steps", 0) <= before.get("steps", 0):
        return None
    n = after["steps"] - before["steps"]
    prof = {"steps": n, **{p: (after.get(p, 0.0) - before.get(p, 0.0)) * 1000 / n for p in STEP_PARTS}}
    prof["step_ms"] = sum(prof[p] for p in STEP_PARTS)
    return prof


def median(values: list[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def summarize(result: dict[str, Any], workloads: list[Workload], max_foreign: float) -> dict[str, Any]:
    """Medians per workload and metric, and hydrad ÷ llama-server.

    A run that other processes disturbed beyond ``max_foreign`` even after its retries (a
    "flagged" run) is left out of the medians, and its pair out of the pair ratios, as long as
    a clean run remains; it stays in the JSON.
    """
    summary: dict[str, Any] = {}
    for w in workloads:
        runs = result["runs"][w.key]
        hyd_runs = runs["hydrad"]
        ref_runs = runs.get("llama-server")

        def clean(ms: list[dict[str, Any]]) -> list[dict[str, Any]]:
            ok = [m for m in ms if m["foreign_cpu"] <= max_foreign]
            return ok or ms

        pairs_all = list(zip(hyd_runs, ref_runs or [], strict=False))
        pairs_ok = [(a, b) for a, b in pairs_all if a["foreign_cpu"] <= max_foreign and b["foreign_cpu"] <= max_foreign]
        rows = []
        for metric, unit, higher in METRICS[w.key]:
            h = median([m[metric] for m in clean(hyd_runs)])
            r = median([m[metric] for m in clean(ref_runs)]) if ref_runs is not None else None
            ratio = h / r if h is not None and r else None
            pairs = [a[metric] / b[metric] for a, b in (pairs_ok or pairs_all) if a[metric] and b[metric]]
            rows.append({"metric": metric, "unit": unit, "higher_is_better": higher, "hydrad": h,
                         "llama_server": r, "ratio": ratio, "pair_ratio_median": median(list(pairs)),
                         "pair_ratio_min": min(pairs) if pairs else None,
                         "pair_ratio_max": max(pairs) if pairs else None})
        profiles = [m["step_profile"] for m in clean(hyd_runs) if m.get("step_profile")]
        steps = {k: median([p[k] for p in profiles]) for k in ("steps", "step_ms", *STEP_PARTS)} if profiles else None
        if steps is not None:
            for k in ("admit_ms_median", "admit_ms_max"):
                steps[k] = median([m.get(k) for m in clean(hyd_runs)])
        calls = {"hydrad": median([m.get("decode_calls") for m in clean(hyd_runs)]),
                 "llama-server": median([m.get("decode_calls") for m in clean(ref_runs)]) if ref_runs else None}
        if steps is not None:
            steps["decode_calls"] = calls
        lag = {name: {k: median([m["server_ms"][k] for m in clean(ms) if k in m.get("server_ms", {})])
                      for k in LAG_KEYS} for name, ms in (("hydrad", hyd_runs), ("llama-server", ref_runs or []))}
        gaps = {name: {k: median([m["token_gaps"][k] for m in clean(ms) if m.get("token_gaps")])
                       for k in ("median_ms", "p99_ms", "max_ms")} for name, ms in (("hydrad", hyd_runs),
                                                                                    ("llama-server", ref_runs or []))}
        summary[w.key] = {"label": w.label, "rows": rows, "hydrad_steps": steps, "server_ms": lag,
                          "token_gaps": gaps, "clean_runs": {
            "hydrad": len(clean(hyd_runs)), **({"llama-server": len(clean(ref_runs))} if ref_runs is not None else {})}}
    return summary


SPEC_KINDS: dict[str, dict[str, Any]] = {  # hydrad's parameters for llama-server's --spec-type, at its sizes
    "ngram-simple": {"spec_type": "ngram", "spec_ngram_size": 12, "spec_n_max": 48},
    "ngram-mod": {"spec_type": "ngram-mod", "spec_ngram_size": 24, "spec_n_max": 64, "spec_n_min": 48},
    "draft-simple": {"spec_type": "draft", "spec_p_min": 0.0},
}
SPEC_FLAGS: dict[str, dict[str, str]] = {  # llama-server's flag for each of them, per kind
    "ngram-simple": {"spec_ngram_size": "--spec-ngram-simple-size-n", "spec_n_max": "--spec-ngram-simple-size-m"},
    "ngram-mod": {"spec_ngram_size": "--spec-ngram-mod-n-match", "spec_n_max": "--spec-ngram-mod-n-max",
                  "spec_n_min": "--spec-ngram-mod-n-min"},
    "draft-simple": {"spec_draft_model": "--spec-draft-model", "spec_n_max": "--spec-draft-n-max",
                     "spec_p_min": "--spec-draft-p-min"},
}


def spec_settings(args: argparse.Namespace, gguf: Path) -> tuple[dict[str, Any], str]:
    """hydrad's speculation parameters and llama-server's arguments for ``--spec``: the same kind and sizes,
    each size given to both (llama-server's defaults are not relied on)."""
    params = dict(SPEC_KINDS[args.spec])
    if args.spec == "draft-simple":
        draft = Path(args.draft_model).resolve() if args.draft_model else gguf
        params.update(spec_draft_model=str(draft), spec_n_max=args.draft_n_max)
    flags = SPEC_FLAGS[args.spec]
    ref = f"--spec-type {args.spec} " + " ".join(f"{flags[k]} {shlex.quote(str(v))}" for k, v in params.items()
                                                 if k in flags)
    return params, ref


def bench_model(alias: str, args: argparse.Namespace, settings: ServerSettings, binary: str | None,
                workloads: list[Workload], log: Callable[[str], None]) -> dict[str, Any]:
    name, gguf = resolve_model(alias)
    if not gguf.exists():
        raise SystemExit(f"bench: {gguf} is missing (scripts/setup fetches the default models)")
    tok = Tokenizer(gguf)
    maker = PromptMaker(tok, args.seed)
    prompts_cache: dict[tuple[str, int, str], list[str]] = {}

    def prompts(w: Workload, run: int, side: str) -> list[str]:
        key = (w.key, 0 if w.cached else run, side)
        if key not in prompts_cache:
            make = functools.partial(maker.copying, ask=ASKS[w.copy]) if w.copy else maker.make
            prompts_cache[key] = [make(w.n_prompt) for _ in range(w.streams)]
        return prompts_cache[key]

    result: dict[str, Any] = {"model": alias, "gguf": gguf.name, "size_bytes": gguf.stat().st_size, "runs": {}}
    with tempfile.TemporaryDirectory(prefix="hydra-bench-") as tmp:
        work = Path(tmp)
        (work / "hydrad").mkdir()
        hyd = Hydrad(work / "hydrad", settings, args.env_lib, args.hydrad_config)
        ref: LlamaServer | None = None
        try:
            log(f"[{alias}] starting hydrad")
            hyd.start()
            hyd.load(name)
            log(f"[{alias}] hydrad READY after {hyd.timings['boot_to_ready_ms']:.0f} ms; "
                f"model load {hyd.timings['load_seconds']:.2f} s")
            servers: list[Server] = [hyd]
            if binary is not None:
                (work / "llama-server").mkdir()
                ref = LlamaServer(work / "llama-server", binary, settings, gguf, shlex.split(args.llama_server_args))
                log(f"[{alias}] starting llama-server")
                ref.start()
                log(f"[{alias}] llama-server healthy after {ref.timings['start_to_healthy_ms']:.0f} ms")
                servers.append(ref)
            # untimed warm-up on each: one stream, and every slot at once
            for srv in servers:
                run_workload(srv.url, Workload("warm", 64, 16, 1), [maker.make(64)], args.seed)
                run_workload(srv.url, Workload("warm", 32, 4, settings.n_parallel),
                             [maker.make(32) for _ in range(settings.n_parallel)], args.seed)
            if settings.n_parallel >= BATCHING.streams:
                result["batching"] = {}
                for srv in servers:
                    b = batching_speedup(srv.url, [maker.make(BATCHING.n_prompt) for _ in range(BATCHING.streams)],
                                         args.seed)
                    result["batching"][srv.name] = b
                    log(f"[{alias}] {srv.name} {b['streams']} streams: one after another {b['sequential_s']:.2f} s, "
                        f"at once {b['concurrent_s']:.2f} s (batching speedup {b['speedup']:.2f}×)")
            for w in workloads:
                result["runs"][w.key] = {srv.name: [] for srv in servers}

            def timed_run(srv: Server, w: Workload, ps: list[str]) -> dict[str, Any]:
                """One run on one server, redone (after waiting for quiet) when other work intruded."""
                guard = CpuGuard(lambda: [srv.proc.pid] if srv.proc else [])
                m: dict[str, Any] = {}
                attempt = aborted = 0
                while True:
                    before = guard.wait_quiet(args.max_foreign, args.quiet_wait, log)
                    watch = guard.watcher(args.abort_foreign) if args.abort_foreign > 0 and aborted < 20 else None
                    steps0 = step_counters(srv.url)
                    try:
                        with heap.paused():
                            m, foreign = guard.measure(functools.partial(run_workload, srv.url, w, ps, args.seed, watch))
                    except Disturbed:
                        aborted += 1
                        log(f"[{alias}] {srv.name} {w.label}: other processes took over "
                            f"{args.abort_foreign:.0%} of the CPUs; run abandoned, trying again")
                        continue
                    attempt += 1
                    if steps0 is not None:
                        steps1 = step_counters(srv.url)
                        m["step_profile"] = step_profile(steps0, steps1)
                        if steps1 and "decodes" in steps0 and "decodes" in steps1:
                            m["decode_calls"] = steps1["decodes"] - steps0["decodes"]
                    m.update(foreign_cpu_before=round(before, 4), foreign_cpu=round(foreign, 4), attempt=attempt,
                             abandoned=aborted)
                    if foreign <= args.max_foreign or attempt > args.retries:
                        if foreign > args.max_foreign:
                            log(f"[{alias}] {srv.name} {w.label}: other processes took {foreign:.0%} of the CPUs "
                                "during the run; keeping it (flagged, left out of the medians)")
                        return m
                    log(f"[{alias}] {srv.name} {w.label}: other processes took {foreign:.0%} of the CPUs "
                        "during the run; running it again")
            profile = None
            if args.profile:
                p = Path(args.profile)
                profile = p.with_name(f"{p.stem}-{alias}{p.suffix}") if len(args.models.split(",")) > 1 else p
            assert hyd.proc is not None
            with py_spy(hyd.proc.pid, profile):
                for run in range(args.runs):
                    for w in workloads:
                        for srv in servers:  # hydrad, then llama-server: one at a time
                            if w.cached:  # untimed: the prompt into its slot (another workload may have used it)
                                run_workload(srv.url, w, prompts(w, run, srv.name), args.seed)
                            m = timed_run(srv, w, prompts(w, run, srv.name))
                            result["runs"][w.key][srv.name].append(m)
                        parts = []
                        for srv in servers:
                            m = result["runs"][w.key][srv.name][-1]
                            main = "aggregate_tps" if w.streams > 1 else ("ttft_ms" if w.n_gen == 1 else "decode_tps")
                            parts.append(f"{srv.name} {main}={m[main]:.1f}")
                        log(f"[{alias}] run {run + 1}/{args.runs} {w.label}: " + ", ".join(parts))
        finally:
            hyd.stop()
            if ref is not None:
                ref.stop()
            tok.close()
    result["startup"] = {"hydrad": hyd.timings, **({"llama-server": ref.timings} if ref else {})}
    if ref is not None:
        result["llama_server_argv"] = [display_path(a) for a in ref.argv]
    result["summary"] = summarize(result, workloads, args.max_foreign)
    kept = [m for w in workloads for runs in result["runs"][w.key].values() for m in runs]
    counted = [m["foreign_cpu"] for m in kept if m["foreign_cpu"] <= args.max_foreign]
    result["contention"] = {"max_foreign_cpu": max(counted, default=0.0),
                            "redone": sum(m["attempt"] - 1 + m.get("abandoned", 0) for m in kept),
                            "flagged": sum(1 for m in kept if m["foreign_cpu"] > args.max_foreign)}
    return result


# ----- output -------------------------------------------------------------------------------


def _fmt(v: float | None, digits: int = 1) -> str:
    if v is None:
        return "–"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    return f"{v:.{digits}f}"


def table(res: dict[str, Any], with_ref: bool) -> str:
    if with_ref:
        lines = ["| workload | metric | hydrad | llama-server | hydrad ÷ llama-server (pairs: min–max) |",
                 "|---|---|---:|---:|---:|"]
    else:
        lines = ["| workload | metric | hydrad |", "|---|---|---:|"]
    for s in res["summary"].values():
        first = True
        for row in s["rows"]:
            label = s["label"] if first else ""
            first = False
            if with_ref:
                ratio = "–" if row["ratio"] is None else f"{row['ratio']:.2f}"
                if row["pair_ratio_min"] is not None:
                    ratio += f" ({row['pair_ratio_min']:.2f}–{row['pair_ratio_max']:.2f})"
                lines.append(f"| {label} | {row['unit']} | {_fmt(row['hydrad'])} | "
                             f"{_fmt(row['llama_server'])} | {ratio} |")
            else:
                lines.append(f"| {label} | {row['unit']} | {_fmt(row['hydrad'])} |")
    return "\n".join(lines)


def spec_table(res: dict[str, Any]) -> str:
    """Each workload's main figure, plain (``res``) and speculating (``res["speculative"]``), on both servers."""
    spec = res["speculative"]
    head = ("| workload | metric | hydrad | hydrad, speculating | × | llama-server | llama-server, speculating | × | "
            "hydrad ÷ llama-server, speculating | accepted / drafted, hydrad / llama-server | answers as plain, "
            "hydrad / llama-server |")
    lines = [head, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]

    def ratio(a: float | None, b: float | None) -> str:
        return f"{b / a:.2f}" if a and b is not None else "–"

    def drafts(key: str, side: str) -> str:
        got = [st["drafts"] for m in spec["runs"].get(key, {}).get(side, []) for st in m["streams"] if st.get("drafts")]
        return f"{sum(a for _, a in got)} of {sum(d for d, _ in got)}" if got else "–"

    def same(key: str, side: str) -> str:
        """Runs whose speculating answers are the plain pass's answers of the same prompts."""
        pairs = list(zip(res["runs"].get(key, {}).get(side, []), spec["runs"].get(key, {}).get(side, [])))
        ok = sum(all(a["text_sha"] == b["text_sha"] for a, b in zip(p["streams"], q["streams"])) for p, q in pairs)
        return f"{ok}/{len(pairs)}" if pairs else "–"

    for key, s in res["summary"].items():
        row, srow = s["rows"][-1], spec["summary"][key]["rows"][-1]  # decode tok/s (or the one figure)
        lines.append(f"| {s['label']} | {row['unit']} | {_fmt(row['hydrad'])} | {_fmt(srow['hydrad'])} | "
                     f"{ratio(row['hydrad'], srow['hydrad'])} | {_fmt(row['llama_server'])} | "
                     f"{_fmt(srow['llama_server'])} | {ratio(row['llama_server'], srow['llama_server'])} | "
                     f"{ratio(srow['llama_server'], srow['hydrad'])} | {drafts(key, 'hydrad')} / "
                     f"{drafts(key, 'llama-server')} | {same(key, 'hydrad')} / {same(key, 'llama-server')} |")
    return "\n".join(lines)


def steps_table(res: dict[str, Any]) -> str:
    """Where hydrad's engine thread spends a step, per workload (medians of the runs)."""
    lines = ["| hydrad, per step (ms, median of runs) | steps | step | submit | overlap | device wait | sample | "
             "between | arrival → slot, median / last stream (ms) | llama_decode calls, hydrad / llama-server |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for s in res["summary"].values():
        p = s.get("hydrad_steps")
        if p:
            admit = "–" if p.get("admit_ms_median") is None else f"{p['admit_ms_median']:.2f} / {p['admit_ms_max']:.2f}"
            lines.append(f"| {s['label']} | {p['steps']:.0f} | " + " | ".join(
                f"{p[k]:.3f}" for k in ("step_ms", *STEP_PARTS)) + f" | {admit} | " + " / ".join(
                "–" if v is None else f"{v:.0f}" for v in p["decode_calls"].values()) + " |")
    if len(lines) == 2:
        return ""
    return "\n".join(lines) + (
        "\n\nParts of a step, on hydrad's engine thread (`hydra_step_seconds_total` in `/metrics`): *submit* builds "
        "the batch and calls `llama_decode` (on a GPU that only queues the work); *overlap* is text work done while "
        "the device computes; *device wait* is the wait for the device; *sample* samples every row and hands the "
        "tokens on; *between* is the gap to the next step while steps follow each other (commands, admission).")


def gaps_table(res: dict[str, Any]) -> str:
    """How evenly each server streams its tokens (medians of the runs): a step that stalls shows in the
    longest gap, however rarely it happens."""
    lines = ["| token gaps (ms, median of runs) | median, hydrad / llama-server | p99 | longest | "
             "longest ÷ median, hydrad / llama-server |", "|---|---:|---:|---:|---:|"]
    for s in res["summary"].values():
        g = s.get("token_gaps") or {}
        h, r = g.get("hydrad") or {}, g.get("llama-server") or {}
        if h.get("median_ms") is None:
            continue

        def ratio(x: dict[str, Any]) -> str:
            return "–" if x.get("max_ms") is None or not x.get("median_ms") else f"{x['max_ms'] / x['median_ms']:.2f}"

        lines.append(f"| {s['label']} | " + " | ".join(f"{_fmt(h.get(k), 2)} / {_fmt(r.get(k), 2)}"
                                                       for k in ("median_ms", "p99_ms", "max_ms"))
                     + f" | {ratio(h)} / {ratio(r)} |")
    return "\n".join(lines) if len(lines) > 2 else ""


def lag_table(res: dict[str, Any]) -> str:
    """The time to the first token split by what the servers report (medians of the runs' median streams)."""
    lines = ["| TTFT, server side (ms) | client TTFT, hydrad / llama-server | prompt_ms, hydrad / llama-server | "
             "hydrad: arrival → engine thread | → slot (tokenized) | first token → HTTP handler | server TTFT |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for _key, s in res["summary"].items():
        lag = s.get("server_ms") or {}
        h, r = lag.get("hydrad", {}), lag.get("llama-server", {})
        if h.get("server_ttft_ms") is None:
            continue
        ttft = {row["metric"]: row for row in s["rows"]}.get("ttft_ms", {})
        lines.append(f"| {s['label']} | {_fmt(ttft.get('hydrad'))} / {_fmt(ttft.get('llama_server'))} | "
                     f"{_fmt(h.get('prompt_ms'))} / {_fmt(r.get('prompt_ms'))} | {_fmt(h.get('to_engine_ms'))} | "
                     f"{_fmt(h.get('admit_ms'))} | {_fmt(h.get('first_token_handoff_ms'))} | "
                     f"{_fmt(h.get('server_ttft_ms'))} |")
    return "\n".join(lines) if len(lines) > 2 else ""


def startup_table(res: dict[str, Any]) -> str:
    st = res["startup"]
    h = st["hydrad"]
    lines = ["| | |", "|---|---:|",
             f"| hydrad: start → READY=1 (no model) | {h['boot_to_ready_ms']:.0f} ms |",
             f"| hydrad: model load (`/control/loads/{{id}}` seconds) | {h['load_seconds']:.2f} s |",
             f"| hydrad: configure → `/health` 200 | {h['configure_to_healthy_ms']:.0f} ms |"]
    if "llama-server" in st:
        lines.append(f"| llama-server: start → `/health` 200 (with model) | "
                     f"{st['llama-server']['start_to_healthy_ms']:.0f} ms |")
    for name, b in (res.get("batching") or {}).items():
        lines.append(f"| {name}: batching speedup ({b['streams']} streams one after another ÷ at once) | "
                     f"{b['speedup']:.2f}× |")
    return "\n".join(lines)


def machine() -> dict[str, Any]:
    info: dict[str, Any] = {"cpu": platform.processor() or platform.machine(), "nproc": os.cpu_count()}
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
    with contextlib.suppress(OSError, ValueError):
        mem = {k: v for k, v in (ln.split(":", 1) for ln in Path("/proc/meminfo").read_text().splitlines())}
        info["mem_total_gib"] = round(int(mem["MemTotal"].split()[0]) / 2**20, 1)
        info["mem_available_gib"] = round(int(mem["MemAvailable"].split()[0]) / 2**20, 1)
    info["nproc"] = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    if shutil.which("nvidia-smi"):
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
                                  "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=20).stdout.strip()
            if out:
                info["gpus"] = out.splitlines()
    return info


def describe_machine(m: dict[str, Any]) -> str:
    s = f"{m['cpu']}, {m['nproc']} cores (nproc)"
    if "mem_available_gib" in m:
        s += f", {m['mem_available_gib']} GiB free of {m['mem_total_gib']} GiB"
    if m.get("gpus"):
        s += "; GPUs: " + "; ".join(m["gpus"])
    return s


def markdown_section(report: dict[str, Any]) -> str:
    s = report["settings"]
    with_ref = report["llama_server"] is not None
    kind = "GPU" if report["machine"].get("gpus") and s["gpu_layers"] != 0 else "CPU"
    title = "hydrad" + (" vs llama-server" if with_ref else " only")
    out = [f"## {report['date']}: {kind}, {title}", "",
           f"Command: `{report['command']}`", "",
           f"Machine: {describe_machine(report['machine'])}.", "",
           f"Settings{' (both servers)' if with_ref else ''}: n_ctx {s['n_ctx']}, n_batch {s['n_batch']}, "
           f"n_ubatch {s['n_ubatch']}, n_parallel {s['n_parallel']}, kv_unified {str(s['kv_unified']).lower()}, "
           f"threads {s['threads']}, flash_attn {s['flash_attn']}, gpu layers {s['gpu_layers']}; "
           f"{report['runs']} {'paired ' if with_ref else ''}runs, "
           "medians; `temperature 0`, `ignore_eos`, prompt caching off, fresh prompt prefix per request"
           + (" (but (k): one prompt, cached)" if "k" in report.get("workloads", []) else "") + ".", "",
           f"hydrad: commit {report.get('hydrad_commit', 'unknown')}.", ""]
    if s.get("hydrad_params"):
        out += [f"hydrad's own parameters: `{json.dumps(s['hydrad_params'])}`.", ""]
    if report.get("hydrad_config"):
        out += [f"hydrad's engine YAML also had: `{json.dumps(report['hydrad_config'])}`.", ""]
    if report.get("env_lib"):
        out += [f"hydrad ran with `LLAMA_CPP_LIB_PATH={report['env_lib']}`.", ""]
    if with_ref:
        out += [f"llama-server: `{report['llama_server']}` ({report.get('llama_server_build', '')}).", ""]
    for res in report["results"]:
        c = res["contention"]
        steps, lag, gaps = steps_table(res), lag_table(res), gaps_table(res)
        out += [f"### {res['model']} ({res['gguf']})", "", table(res, with_ref), "",
                *([steps, ""] if steps else []), *([lag, ""] if lag else []), *([gaps, ""] if gaps else []),
                startup_table(res), "",
                f"Other processes' share of the CPUs during a counted run: at most {c['max_foreign_cpu']:.1%}; "
                f"runs redone because of other load: {c['redone']}; still over the limit after "
                f"{report.get('retries', 5)} retries, so left out of the medians: {c['flagged']}.", ""]
        if with_ref and res.get("llama_server_argv"):
            out += [f"llama-server flags: `{' '.join(res['llama_server_argv'][1:])}`", ""]
    return "\n".join(out) + "\n"


def display_path(text: str) -> str:
    """A path as the report shows it: relative inside the repository, ``~/`` under the home
    directory, otherwise only its file name (machine-specific locations stay out of the docs)."""
    if "=" in text and text.startswith("--"):
        opt, _, val = text.partition("=")
        return f"{opt}={display_path(val)}"
    if not text.startswith("/"):
        return text
    p = Path(text)
    with contextlib.suppress(ValueError):
        return str(p.resolve().relative_to(REPO)) or "."
    with contextlib.suppress(ValueError):
        return "~/" + str(p.relative_to(Path.home()))
    return p.name


def git_describe() -> str:
    """The commit of the hydrad under test, with a mark when the working tree differs from it."""
    try:
        head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no",
                                "--", "hydrad"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (head or "unknown") + (" with uncommitted changes under hydrad/" if dirty else "")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=DEFAULT_MODELS, help=f"comma-separated registry aliases or GGUF paths "
                    f"(default: {DEFAULT_MODELS})")
    ap.add_argument("--runs", type=int, default=5, help="paired runs per workload (default: 5)")
    ap.add_argument("--workloads", default="a,b,c,d", help="which of a,b,c,d,e (default: a,b,c,d)")
    ap.add_argument("--threads", type=int, default=usable_cpus(),
                    help="CPU threads for both servers (generation and batch; default: every CPU this process "
                         "may use, as hydrad's own default: its affinity, capped by a cgroup CPU quota)")
    ap.add_argument("--n-ctx", type=int, default=8192, help="context size of both servers (default: 8192)")
    ap.add_argument("--n-batch", type=int, default=2048, help="logical batch, -b (default: 2048)")
    ap.add_argument("--n-ubatch", type=int, default=512, help="physical batch, -ub (default: 512)")
    ap.add_argument("--n-parallel", type=int, default=8, help="slots, -np (default: 8; workload b needs 8)")
    ap.add_argument("--kv-unified", action=argparse.BooleanOptionalAction, default=True,
                    help="one KV pool for all slots on both servers (default: on, hydrad's default)")
    ap.add_argument("--flash-attn", choices=("auto", "on", "off"), default="auto",
                    help="flash attention (default: auto)")
    ap.add_argument("--gpu-layers", type=int, default=-1, help="layers to offload on both; -1 = all (default)")
    ap.add_argument("--seed", type=int, default=1234, help="sampling seed sent with every request, and prompt seed")
    ap.add_argument("--llama-server", metavar="PATH", help="llama-server binary (default: scripts/build_llama_server)")
    ap.add_argument("--llama-server-args", default="", metavar="ARGS", help="extra llama-server arguments (one string)")
    ap.add_argument("--hydrad-params", type=json.loads, default={}, metavar="JSON",
                    help='extra runtime parameters for hydrad alone, e.g. \'{"text_overlap": "off"}\'')
    ap.add_argument("--hydrad-config", type=json.loads, default={}, metavar="JSON",
                    help='extra engine YAML for hydrad, e.g. \'{"switch_interval_ms": 0.05}\'')
    ap.add_argument("--hydrad-only", action="store_true", help="skip llama-server; report hydrad alone")
    ap.add_argument("--spec", choices=tuple(SPEC_KINDS), metavar="TYPE",
                    help="run the workloads again with both servers speculating: llama-server --spec-type TYPE "
                         "(ngram-simple, ngram-mod or draft-simple), hydrad the same kind at llama-server's sizes "
                         "(ngram-simple: n-gram 12, 48 drafted; ngram-mod: n-gram 24, 48 to 64 drafted; "
                         "draft-simple: --draft-model, --draft-n-max drafted, both servers told) unless "
                         "--hydrad-params sets them; a table compares the two passes")
    ap.add_argument("--draft-model", metavar="GGUF", help="the draft model of --spec draft-simple (default: the "
                    "benchmarked model itself, which drafts for itself: the same vocabulary, most drafts accepted)")
    ap.add_argument("--draft-n-max", type=int, default=8, metavar="N",
                    help="tokens drafted per step by --spec draft-simple, on both servers (default: 8)")
    ap.add_argument("--max-foreign", type=float, default=0.05, metavar="SHARE",
                    help="redo a run when other processes used more than this share of all CPUs during it "
                         "(default: 0.05; with few cores even a little other load slows llama.cpp's "
                         "spinning worker threads a lot)")
    ap.add_argument("--quiet-wait", type=float, default=300, metavar="S",
                    help="before each run, wait up to S seconds for other processes to go quiet (default: 300)")
    ap.add_argument("--retries", type=int, default=5, help="times a disturbed run is redone (default: 5)")
    ap.add_argument("--abort-foreign", type=float, default=0.20, metavar="SHARE",
                    help="abandon a run at once (and redo it) when other processes take more than this share "
                         "of the CPUs over one second of it; 0 = never (default: 0.20)")
    ap.add_argument("--env-lib", metavar="PATH", help="run hydrad with LLAMA_CPP_LIB_PATH=PATH (e.g. a CUDA build)")
    ap.add_argument("--profile", metavar="FILE", help="sample hydrad with py-spy during the timed runs "
                    "(.svg flamegraph, .json speedscope, .txt collapsed stacks)")
    ap.add_argument("--check", type=float, nargs="?", const=0.02, default=None, metavar="SLACK",
                    help="exit 1 when a pair-median ratio misses parity with llama-server by more than SLACK "
                         "(default 0.02: throughput ≥ 0.98×, times ≤ 1.02×); needs llama-server")
    ap.add_argument("--json", metavar="FILE", help="write every measurement as JSON")
    ap.add_argument("--markdown", action="store_true", help="print a section for docs/benchmarks.md (it does not write the file)")
    args = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the finally blocks: stop the servers

    keys = [k.strip() for k in args.workloads.split(",") if k.strip()]
    bad = [k for k in keys if k not in WORKLOADS]
    if bad or not keys:
        ap.error(f"--workloads: unknown {','.join(bad) or '(none)'}; choose from {','.join(WORKLOADS)}")
    if args.runs < 1:
        ap.error("--runs must be at least 1")
    workloads = [WORKLOADS[k] for k in keys]
    need_slots = max(w.streams for w in workloads)
    if args.n_parallel < need_slots:
        ap.error(f"--n-parallel {args.n_parallel} is below the {need_slots} streams of the chosen workloads")
    per_seq = args.n_ctx if args.kv_unified else args.n_ctx // args.n_parallel
    for w in workloads:
        if w.n_prompt + w.n_gen >= per_seq or w.streams * (w.n_prompt + w.n_gen) > args.n_ctx:
            ap.error(f"--n-ctx {args.n_ctx} is too small for workload {w.label}")
    if args.check is not None and args.hydrad_only:
        ap.error("--check compares with llama-server: drop --hydrad-only")
    settings = ServerSettings(args.n_ctx, args.n_batch, args.n_ubatch, args.n_parallel, args.kv_unified,
                              args.threads, args.flash_attn, args.gpu_layers, args.hydrad_params)
    binary = None if args.hydrad_only else llama_server_binary(args.llama_server)
    t_start = time.monotonic()

    def log(msg: str) -> None:
        print(f"bench: {time.monotonic() - t_start:7.1f}s {msg}", file=sys.stderr, flush=True)

    command = "scripts/bench_engine.py " + " ".join(
        shlex.quote(display_path(a)) for a in (sys.argv[1:] if argv is None else argv))
    report: dict[str, Any] = {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"), "command": command,
        "machine": machine(), "settings": asdict(settings), "runs": args.runs, "workloads": keys,
        "hydrad_config": args.hydrad_config,
        "llama_server": None, "env_lib": display_path(args.env_lib) if args.env_lib else None, "results": [],
        "hydrad_commit": git_describe(), "retries": args.retries, "max_foreign": args.max_foreign,
    }
    if binary is not None:
        bp = Path(binary)
        report["llama_server"] = f"{bp.parent.name}/{bp.name}"
        info = bp.parent / "BUILD-INFO"
        if info.exists():
            report["llama_server_build"] = "build " + bp.parent.name + " of " + info.read_text().splitlines()[0]
    for alias in [m.strip() for m in args.models.split(",") if m.strip()]:
        res = bench_model(alias, args, settings, binary, workloads, log)
        report["results"].append(res)
        lag, gaps = lag_table(res), gaps_table(res)
        print(f"\n{res['model']}\n" + table(res, binary is not None) + "\n\n" + (lag + "\n\n" if lag else "")
              + (gaps + "\n\n" if gaps else "") + startup_table(res) + "\n", flush=True)
        if args.spec:
            spec_params, ref_args = spec_settings(args, resolve_model(alias)[1])
            spec_params.update(args.hydrad_params)
            spec_args = argparse.Namespace(**{**vars(args), "hydrad_params": spec_params, "llama_server_args": (
                f"{ref_args} {args.llama_server_args}".strip())})
            log(f"[{alias}] again, speculating ({args.spec})")
            res["speculative"] = bench_model(alias, spec_args, replace(settings, hydrad_params=spec_params), binary,
                                             workloads, log)
            res["speculative"]["hydrad_params"] = spec_params
            print(f"\n{res['model']}, plain and speculating ({args.spec})\n" + spec_table(res) + "\n", flush=True)
    log("done")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
        log(f"wrote {args.json}")
    if args.markdown:
        print("\n" + markdown_section(report), flush=True)
    if args.check is not None:
        failed = check_goals(report, args.check)
        for line in failed:
            print(f"bench: below goal: {line}", file=sys.stderr)
        log(f"--check: {len(failed)} ratio(s) below goal (slack {args.check:.2f})")
        return 1 if failed else 0
    return 0


def check_goals(report: dict[str, Any], slack: float) -> list[str]:
    """The pair-median ratios that miss parity by more than ``slack``: throughput ÷ llama-server below
    ``1 - slack``, or times (TTFT) above ``1 + slack``. A regression guard, not a statistic: it reads
    the medians of the alternating pairs, which ride out most of the noise of a shared machine."""
    failed = []
    for res in report["results"]:
        for _key, s in res.get("summary", {}).items():
            for row in s["rows"]:
                r = row["pair_ratio_median"]
                if r is None:
                    continue
                bad = r < 1 - slack if row["higher_is_better"] else r > 1 + slack
                if bad:
                    failed.append(f"{res['model']} {s['label']} {row['unit']}: {r:.3f}")
    return failed


if __name__ == "__main__":
    sys.exit(main())
