#!/usr/bin/env python3
"""Benchmark KV state transfer on the merged RPC port, and migration against re-prefill.

Two real hydrad engines serving the same model (SmolLM2-135M by default) are started on
loopback, each with ``n_ctx`` 16384 and ``n_parallel`` 2. Then:

1. **STATE_GET / STATE_PUT throughput.** Engine A prefills a prompt of about 4K tokens into
   slot 0. Its state is read with STATE_GET (request sent → STATE_END received) and written into
   engine B's slot 0 with STATE_PUT (request sent → OK received, the engine's restore included),
   ``--runs`` times each after one untimed warm-up. Next to them, the ceiling: the same number of
   bytes (the state's own bytes) copied over a plain loopback TCP connection between two threads
   of this process, sent in pieces of the engine's chunk size and received into a 1 MiB buffer,
   as the RPC client does. The ratio state ÷ ceiling says what the protocol costs on top of TCP.

2. **Migration vs re-prefill.** For sessions of about 1K, 2K and 4K tokens (the exact count is the
   ``usage.prompt_tokens`` of the prefill): A prefills the prompt into slot 0; the slot migrates to
   B's slot 1 (``hydrad.wire.rpcclient.migrate``, A → B directly); then B prefills the same prompt from
   scratch into slot 0 (whose cache holds an unrelated prompt: every prompt starts with its own
   random number, so at most the BOS token is reused). Re-prefill time is reported both as the
   engine's ``timings.prompt_ms`` and as the client's wall clock for the request (``max_tokens``
   1). Every migration is checked: a request on B's slot 1 with the same prompt must find
   ``cached_tokens ≥ n - 1``. ``--migrate-runs`` runs per size, each with a fresh prompt.

All tables show medians. ``--json FILE`` writes every sample; ``--markdown`` prints a dated
"KV state and migration" section (command, machine, tables) for docs/benchmarks.md (it does not
write the file).

Example::

    .venv/bin/python scripts/bench_state.py --runs 7 --migrate-runs 3 --markdown
"""

from __future__ import annotations

if __name__ == "__main__":  # run as scripts/NAME: under the checkout's .venv when there is one
    import _venv
    _venv.reexec()

import argparse
import datetime as dt
import json
import os
import platform
import random
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import httpx
import yaml

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from hydrad.wire.rpcclient import RpcClient, migrate  # noqa: E402

REGISTRY = REPO / "etc" / "hydra" / "models.yaml"
SECTION = "KV state and migration"
RECV_BUFFER = 1 << 20  # what RpcClient receives into

WORDS = ("amber anchor apple arrow autumn badger bamboo basket beacon birch blanket breeze bridge "
         "cactus candle canyon carpet castle cedar cherry cinder cliff clover cobalt comet copper "
         "coral cotton crater cricket crystal dagger desert dolphin dragon eagle ember falcon feather "
         "fern fig forest fountain galaxy garden garnet ginger glacier granite harbor hazel helmet "
         "honey island ivory jasmine jungle kettle lagoon lantern lemon lilac lotus maple marble "
         "meadow meteor mirror monsoon mosaic needle nectar oasis ocean olive onyx orchard otter "
         "paddle parrot pebble pepper pillar planet plum prairie quartz quill rabbit raven reef "
         "ribbon river saddle salmon sapphire scarlet shadow silver spruce squirrel summit thistle "
         "thunder timber topaz tulip tundra valley velvet violet walnut willow window winter "
         "yarrow zephyr").split()
VERBS = "counted found painted carried measured named moved traded sorted hid mended weighed".split()


# ----- engines ------------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class BenchEngine:
    """One hydrad subprocess with its own YAML config and log, as tests/support/engine.py starts them."""

    def __init__(self, workdir: Path, name: str, model: str, defaults: dict[str, Any], models_dir: Path) -> None:
        self.name = name
        self.port = free_port()
        self.rpc_port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.rpc = f"127.0.0.1:{self.rpc_port}"
        self.config = workdir / f"{name}.yaml"
        self.config.write_text(yaml.safe_dump({
            "name": name, "http": {"host": "127.0.0.1", "port": self.port}, "rpc": {"port": self.rpc_port},
            "models_dir": str(models_dir), "registry": str(REGISTRY), "drain_timeout_s": 10,
            "defaults": {"model": model, **defaults},
        }))
        self.log_path = workdir / f"{name}.log"
        self._log = open(self.log_path, "wb")
        env = {k: v for k, v in os.environ.items() if k != "NOTIFY_SOCKET"}
        env["PYTHONUNBUFFERED"] = "1"
        self.proc = subprocess.Popen([sys.executable, "-m", "hydrad.cli.hydrad", "--config", str(self.config)],
                                     stdout=self._log, stderr=subprocess.STDOUT, env=env, cwd=str(REPO))
        self.http = httpx.Client(base_url=self.url, timeout=600)

    def log_tail(self, n: int = 30) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])

    def wait_ready(self, timeout: float = 300.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"engine {self.name} exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                if self.http.get("/health").status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"engine {self.name} not ready within {timeout:.0f}s:\n{self.log_tail()}")

    def complete(self, prompt: str, slot: int, max_tokens: int = 1) -> tuple[dict[str, Any], float]:
        """A pinned completion; returns the response and its wall-clock seconds."""
        body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "id_slot": slot}
        t0 = time.perf_counter()
        r = self.http.post("/v1/completions", json=body)
        wall = time.perf_counter() - t0
        if r.status_code != 200:
            raise RuntimeError(f"engine {self.name}: /v1/completions answered {r.status_code}: {r.text[:300]}")
        return r.json(), wall

    def slot_tokens(self, slot: int) -> int:
        return int(self.http.get("/slots").json()[slot]["n_tokens"])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.http.close()
        self._log.close()


# ----- prompts ------------------------------------------------------------------------------

class PromptMaker:
    """Prompts of random sentences, each opening with its own random number (no shared prefix).

    Sizes are steered by a tokens-per-sentence rate measured once on an engine; the exact token
    count of every prompt is what the engine reports in ``usage.prompt_tokens``.
    """

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.per_sentence = 16.0
        self.overhead = 8.0

    def _sentence(self, i: int) -> str:
        w = self.rng.sample(WORDS, 4)
        return (f"Item {i}: the {w[0]} {self.rng.choice(VERBS)} {self.rng.randrange(2, 999)} {w[1]}s "
                f"beside the {w[2]} and the {w[3]}.")

    def text(self, sentences: int) -> str:
        head = f"{self.rng.randrange(10**8, 10**9)} ledger {self.rng.randrange(10**5, 10**6)}."
        return " ".join([head] + [self._sentence(i) for i in range(sentences)])

    def calibrate(self, engine: BenchEngine) -> None:
        small, large = 8, 48
        counts = []
        for n in (small, large):
            resp, _ = engine.complete(self.text(n), slot=0)
            counts.append(int(resp["usage"]["prompt_tokens"]))
        self.per_sentence = (counts[1] - counts[0]) / (large - small)
        self.overhead = counts[0] - small * self.per_sentence

    def make(self, n_tokens: int) -> str:
        return self.text(max(1, round((n_tokens - self.overhead) / self.per_sentence)))


# ----- other work on the machine -----------------------------------------------------------

class CpuMonitor:
    """How busy the machine is with work other than this benchmark (its own process and the engines).

    ``foreign`` between two snapshots is the share of all CPUs (0..1) that other processes used,
    from /proc/stat minus the CPU time of our processes. On a shared machine prefill times move
    with it, so each re-prefill records it, and ``wait_quiet`` holds a measurement back while
    other work takes more than ``max_foreign`` of the machine.
    """

    def __init__(self, pids: list[int]) -> None:
        self.pids = [os.getpid(), *pids]
        self.available = Path("/proc/stat").exists()

    def snapshot(self) -> tuple[int, int, int]:
        """(busy jiffies of the machine, all jiffies, jiffies of our processes)."""
        if not self.available:
            return 0, 0, 0
        f = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
        busy = f[0] + f[1] + f[2] + f[5] + f[6] + f[7]  # user nice system irq softirq steal
        total = busy + f[3] + f[4]  # + idle iowait
        ours = 0
        for pid in self.pids:
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                ours += int(fields[11]) + int(fields[12])  # utime stime, all threads
            except (OSError, IndexError, ValueError):
                pass
        return busy, total, ours

    @staticmethod
    def foreign(before: tuple[int, int, int], after: tuple[int, int, int]) -> float:
        d_total = after[1] - before[1]
        if d_total <= 0:
            return 0.0
        return max(0.0, (after[0] - before[0]) - (after[2] - before[2])) / d_total

    def wait_quiet(self, max_foreign: float, max_wait: float, say: Callable[[str], None]) -> float:
        """Sample 1 s at a time until other work is below ``max_foreign`` or ``max_wait`` has passed."""
        if not self.available:
            return 0.0
        deadline = time.monotonic() + max_wait
        while True:
            before = self.snapshot()
            time.sleep(1.0)
            load = self.foreign(before, self.snapshot())
            if load <= max_foreign or time.monotonic() >= deadline:
                return load
            say(f"other work uses {load:.0%} of the machine; waiting for quiet")


# ----- measurements -------------------------------------------------------------------------

@dataclass
class Throughput:
    n_tokens: int
    bytes: int
    chunk_size: int
    get_s: list[float] = field(default_factory=list)
    get_meta_s: list[float] = field(default_factory=list)  # request → STATE_META (the engine's snapshot)
    put_s: list[float] = field(default_factory=list)
    put_restore_s: list[float] = field(default_factory=list)  # the engine's own restore time
    socket_s: list[float] = field(default_factory=list)
    foreign_cpu: list[float] = field(default_factory=list)  # other processes' share of the machine, per run


@dataclass
class MigrationRun:
    target: int
    n_tokens: int
    bytes: int
    migrate_s: float
    restore_s: float
    reprefill_prompt_ms: float
    reprefill_wall_s: float
    reprefill_cached: int
    verified_cached: int
    foreign_cpu: float  # share of the machine other processes used during the re-prefill


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def socket_copy(data: bytes, chunk: int) -> float:
    """Seconds to move ``data`` over loopback TCP from one thread to another, ``chunk`` bytes per send."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        sender = socket.create_connection(listener.getsockname())
        receiver, _ = listener.accept()
    for s in (sender, receiver):
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    go = threading.Event()
    view = memoryview(data)

    def send() -> None:
        go.wait()
        for off in range(0, len(view), chunk):
            sender.sendall(view[off:off + chunk])

    t = threading.Thread(target=send, daemon=True)
    t.start()
    buf = bytearray(RECV_BUFFER)
    got = 0
    t0 = time.perf_counter()
    go.set()
    while got < len(data):
        n = receiver.recv_into(buf)
        if n == 0:
            raise RuntimeError("loopback copy: sender closed early")
        got += n
    seconds = time.perf_counter() - t0
    t.join()
    sender.close()
    receiver.close()
    return seconds


def measure_throughput(a: BenchEngine, b: BenchEngine, prompts: PromptMaker, n_tokens: int, runs: int,
                       cpu: CpuMonitor, max_foreign: float, quiet_wait: float,
                       say: Callable[[str], None]) -> Throughput:
    resp, wall = a.complete(prompts.make(n_tokens), slot=0)
    n = a.slot_tokens(0)
    say(f"state: A prefilled {resp['usage']['prompt_tokens']} tokens in {wall:.2f}s")
    with RpcClient(a.rpc) as ca, RpcClient(b.rpc) as cb:
        chunk = int(ca.server.get("chunk_size", 2 << 20))
        meta, data = ca.state_get_bytes(0)  # warm-up, and the bytes for STATE_PUT and the ceiling
        cb.state_put(0, meta, data)
        socket_copy(data, chunk)
        res = Throughput(n_tokens=n, bytes=len(data), chunk_size=chunk)
        for i in range(runs):
            cpu.wait_quiet(max_foreign, quiet_wait, say)
            before = cpu.snapshot()
            t0 = time.perf_counter()
            st = ca.state_get(0)
            t_meta = time.perf_counter()
            got = sum(len(c) for c in st.chunks)
            res.get_s.append(time.perf_counter() - t0)
            res.get_meta_s.append(t_meta - t0)
            if got != len(data):
                raise RuntimeError(f"STATE_GET returned {got} bytes, expected {len(data)}")
            t0 = time.perf_counter()
            out = cb.state_put(0, meta, data)
            res.put_s.append(time.perf_counter() - t0)
            res.put_restore_s.append(float(out.get("seconds") or 0.0))
            res.socket_s.append(socket_copy(data, chunk))
            res.foreign_cpu.append(cpu.foreign(before, cpu.snapshot()))
            say(f"state run {i + 1}/{runs}: get {res.get_s[-1] * 1e3:.1f} ms, put {res.put_s[-1] * 1e3:.1f} ms, "
                f"socket {res.socket_s[-1] * 1e3:.1f} ms")
    return res


def measure_migrations(a: BenchEngine, b: BenchEngine, prompts: PromptMaker, sizes: list[int], runs: int,
                       cpu: CpuMonitor, max_foreign: float, quiet_wait: float,
                       say: Callable[[str], None]) -> list[MigrationRun]:
    out: list[MigrationRun] = []
    for target in sizes:
        for i in range(runs):
            prompt = prompts.make(target)
            pre, _ = a.complete(prompt, slot=0)
            n = int(pre["usage"]["prompt_tokens"])
            cpu.wait_quiet(max_foreign, quiet_wait, say)
            t0 = time.perf_counter()
            res = migrate(a.rpc, b.rpc, 0, dst_slot=1)
            migrate_s = time.perf_counter() - t0
            cpu.wait_quiet(max_foreign, quiet_wait, say)
            before = cpu.snapshot()
            again, wall = b.complete(prompt, slot=0)
            foreign = cpu.foreign(before, cpu.snapshot())
            cached = int(again["usage"]["prompt_tokens_details"]["cached_tokens"])
            check, _ = b.complete(prompt, slot=1)
            verified = int(check["usage"]["prompt_tokens_details"]["cached_tokens"])
            if verified < n - 1:
                raise RuntimeError(f"migrated slot reused only {verified} of {n} tokens")
            run = MigrationRun(target=target, n_tokens=n, bytes=int(res["bytes"]), migrate_s=migrate_s,
                               restore_s=float(res.get("seconds") or 0.0),
                               reprefill_prompt_ms=float(again["timings"]["prompt_ms"]), reprefill_wall_s=wall,
                               reprefill_cached=cached, verified_cached=verified, foreign_cpu=foreign)
            out.append(run)
            say(f"migrate {n} tokens, run {i + 1}/{runs}: {migrate_s * 1e3:.1f} ms; re-prefill "
                f"{run.reprefill_prompt_ms:.0f} ms (wall {wall * 1e3:.0f} ms, {cached} cached, "
                f"other work {foreign:.0%} of the machine)")
    return out


# ----- reporting ----------------------------------------------------------------------------

def gbps(n_bytes: int, seconds: float) -> float:
    return n_bytes / seconds / 1e9


def throughput_table(t: Throughput) -> str:
    ceiling = gbps(t.bytes, median(t.socket_s))
    rows = [
        ("STATE_GET (A → client)", median(t.get_s), f"snapshot to first frame {median(t.get_meta_s) * 1e3:.1f} ms"),
        ("STATE_PUT (client → B)", median(t.put_s), f"engine restore {median(t.put_restore_s) * 1e3:.1f} ms"),
        (f"loopback socket copy, 2 threads, {t.chunk_size >> 20} MiB sends (ceiling)", median(t.socket_s), ""),
    ]
    lines = [f"State of a {t.n_tokens}-token slot: {t.bytes} bytes ({t.bytes / 1e6:.1f} MB), "
             f"{t.bytes / t.n_tokens:.0f} bytes per token; medians of {len(t.get_s)} runs; other work used "
             f"{median(t.foreign_cpu):.0%} of the machine (median).", "",
             "| transfer | median ms | GB/s | ÷ ceiling | note |", "|---|---:|---:|---:|---|"]
    for name, s, note in rows:
        rate = gbps(t.bytes, s)
        lines.append(f"| {name} | {s * 1e3:.1f} | {rate:.2f} | {rate / ceiling:.2f} | {note} |")
    return "\n".join(lines)


def migration_table(runs: list[MigrationRun]) -> str:
    lines = ["| session | tokens | state MB | migrate ms | (restore ms) | migrate MB/s | re-prefill ms (prompt_ms) "
             "| re-prefill ms (wall) | other work during re-prefill | migrate ÷ re-prefill (prompt_ms) "
             "| migrate ÷ re-prefill (wall) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for target in sorted({r.target for r in runs}):
        rs = [r for r in runs if r.target == target]
        n = int(median([float(r.n_tokens) for r in rs]))
        mb = median([float(r.bytes) for r in rs]) / 1e6
        mig = median([r.migrate_s for r in rs]) * 1e3
        restore = median([r.restore_s for r in rs]) * 1e3
        pms = median([r.reprefill_prompt_ms for r in rs])
        wall = median([r.reprefill_wall_s for r in rs]) * 1e3
        foreign = median([r.foreign_cpu for r in rs])
        label = f"{target // 1024}K" if target % 1024 == 0 else str(target)
        lines.append(f"| {label} | {n} | {mb:.1f} | {mig:.1f} | {restore:.1f} | {mb / (mig / 1e3):.0f} | {pms:.0f} "
                     f"| {wall:.0f} | {foreign:.0%} | {mig / pms:.3f} | {mig / wall:.3f} |")
    return "\n".join(lines)


def machine() -> dict[str, Any]:
    cpu = platform.processor() or "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem = round(int(line.split()[1]) / (1 << 20), 1)
                break
    except OSError:
        pass
    try:
        import llama_cpp

        llama_version = str(llama_cpp.__version__)
    except Exception:
        llama_version = "?"
    return {"cpu": cpu, "nproc": os.cpu_count(), "mem_gib": mem, "os": platform.platform(),
            "python": platform.python_version(), "llama_cpp_python": llama_version,
            "loadavg": [round(x, 2) for x in os.getloadavg()]}


def command_line(argv: list[str]) -> str:
    """The command as typed, with paths made relative to the repository where they lie inside it."""
    def shown(arg: str) -> str:
        p = Path(arg)
        if p.is_absolute():
            try:
                return str(p.resolve().relative_to(REPO))
            except ValueError:
                return p.name
        return arg

    exe = Path(sys.executable)
    try:
        python = str(exe.relative_to(REPO)) if exe.is_absolute() else str(exe)
    except ValueError:
        python = "python3"
    return shlex.join([python, "scripts/bench_state.py", *[shown(a) for a in argv]])


def markdown_section(args: argparse.Namespace, argv: list[str], mach: dict[str, Any], t: Throughput,
                     runs: list[MigrationRun], when: dt.datetime) -> str:
    sizes = ", ".join(str(s) for s in args.sizes)
    return "\n".join([
        f"## {SECTION} ({when:%Y-%m-%d})", "",
        "```", command_line(argv), "```", "",
        f"Machine: {mach['cpu']}, {mach['nproc']} CPUs (nproc), {mach['mem_gib']} GiB RAM; {mach['os']}; "
        f"Python {mach['python']}, llama-cpp-python {mach['llama_cpp_python']}. Load average at start "
        f"{' / '.join(str(x) for x in mach['loadavg'])}, at the end {' / '.join(str(x) for x in mach['loadavg_end'])} "
        "(1/5/15 min; other work on the machine slows prefill more than the transfers).", "",
        f"Two engines, model `{args.model}`, `n_ctx` {args.n_ctx}, `n_parallel` {args.n_parallel}, "
        f"`n_threads` {args.threads or 'all'}, on loopback; one client in this process.", "",
        "### STATE_GET / STATE_PUT throughput on loopback", "",
        throughput_table(t), "",
        "STATE_GET is timed from the request to STATE_END (the engine's snapshot of the slot, xxh3 on both "
        "sides, framing and the socket); STATE_PUT from the request to OK (CONTINUE round trip, data, digest "
        "check and the engine's restore into the slot). The ceiling moves the same bytes over a plain "
        "loopback connection between two threads, in the same send size, into the same 1 MiB receive buffer.",
        "",
        f"### Migration vs re-prefill (sessions of about {sizes} tokens)", "",
        migration_table(runs), "",
        f"Medians of {args.migrate_runs} runs per size, each with a new prompt. *Migrate*: "
        "`hydrad.wire.rpcclient.migrate` from A's slot 0 to B's slot 1, wall clock (both connections, the "
        "snapshot, the stream and B's restore); *restore* is B's own share. *Re-prefill*: B computes the same "
        "prompt from scratch in another slot (`max_tokens` 1), as the engine's `timings.prompt_ms` and as the "
        "client's wall clock for the request. Each migrated slot was checked to serve the prompt from cache "
        "(`cached_tokens` ≥ n − 1). *Other work*: the share of the machine's CPUs that processes other than "
        f"the benchmark and its engines used during the re-prefill (median); before each timed step the "
        f"benchmark waited up to {args.quiet_wait:.0f} s for that share to fall below {args.max_foreign:.0%}, so "
        "where it is higher the re-prefill is slower than on a quiet machine and the ratio flatters migration.", "",
    ])


# ----- main ---------------------------------------------------------------------------------

def parse_sizes(text: str) -> list[int]:
    try:
        sizes = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated token counts, got {text!r}") from None
    if not sizes or min(sizes) < 16:
        raise argparse.ArgumentTypeError("sizes must be token counts of at least 16")
    return sizes


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m", help="registry alias both engines serve (default smollm2-135m)")
    ap.add_argument("--models-dir", type=Path, default=Path(os.environ.get("HYDRA_MODELS_DIR", REPO / "models")),
                    help="where the GGUF files are (default $HYDRA_MODELS_DIR or ./models)")
    ap.add_argument("--n-ctx", type=int, default=16384, help="engines' n_ctx (default 16384)")
    ap.add_argument("--n-parallel", type=int, default=2, help="engines' n_parallel (default 2)")
    ap.add_argument("--threads", type=int, default=0, help="engines' n_threads; 0 = all cores (default)")
    ap.add_argument("--state-tokens", type=int, default=4096, help="tokens in the throughput slot (default 4096)")
    ap.add_argument("--runs", type=int, default=5, help="timed STATE_GET/PUT/socket runs (default 5, at least 5)")
    ap.add_argument("--sizes", type=parse_sizes, default=[1024, 2048, 4096],
                    help="session sizes for migration vs re-prefill (default 1024,2048,4096)")
    ap.add_argument("--migrate-runs", type=int, default=3, help="runs per session size (default 3, at least 3)")
    ap.add_argument("--max-foreign", type=float, default=0.15, metavar="F",
                    help="hold a timed step back while other processes use more than this share of the "
                         "machine (default 0.15)")
    ap.add_argument("--quiet-wait", type=float, default=120.0, metavar="S",
                    help="longest wait for quiet before a step runs anyway (default 120 s)")
    ap.add_argument("--seed", type=int, default=None, help="prompt seed (default: random)")
    ap.add_argument("--json", type=Path, metavar="FILE", help="write all samples and medians as JSON")
    ap.add_argument("--markdown", action="store_true", help=f"print a '{SECTION}' section for docs/benchmarks.md (it does not write the file)")
    return ap


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    if args.runs < 5 or args.migrate_runs < 3:
        raise SystemExit("bench: --runs must be at least 5 and --migrate-runs at least 3 (medians)")
    per_slot = args.n_ctx // args.n_parallel
    if max([args.state_tokens, *args.sizes]) * 1.05 + 16 >= per_slot:
        raise SystemExit(f"bench: a slot holds about {per_slot} tokens (n_ctx {args.n_ctx} / n_parallel "
                         f"{args.n_parallel}); raise --n-ctx for sessions of {max([args.state_tokens, *args.sizes])}")

    def say(msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    mach = machine()
    when = dt.datetime.now().astimezone()
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    prompts = PromptMaker(seed)
    defaults = {"n_ctx": args.n_ctx, "n_parallel": args.n_parallel, "n_threads": args.threads, "temperature": 0}
    with tempfile.TemporaryDirectory(prefix="bench-state-") as tmp:
        engines: list[BenchEngine] = []
        try:
            for name in ("bench-a", "bench-b"):
                engines.append(BenchEngine(Path(tmp), name, args.model, defaults, args.models_dir))
            for e in engines:
                e.wait_ready()
            a, b = engines
            say(f"engines ready: A rpc {a.rpc}, B rpc {b.rpc}")
            prompts.calibrate(b)
            say(f"prompts: {prompts.per_sentence:.2f} tokens per sentence")
            cpu = CpuMonitor([e.proc.pid for e in engines])
            thr = measure_throughput(a, b, prompts, args.state_tokens, args.runs, cpu, args.max_foreign,
                                     args.quiet_wait, say)
            mig = measure_migrations(a, b, prompts, args.sizes, args.migrate_runs, cpu, args.max_foreign,
                                     args.quiet_wait, say)
        except Exception:
            for e in engines:
                say(f"log tail of {e.name}:\n{e.log_tail()}")
            raise
        finally:
            for e in engines:
                e.stop()

    mach["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    print(throughput_table(thr))
    print()
    print(migration_table(mig))
    if args.json:
        report = {"when": when.isoformat(timespec="seconds"), "command": command_line(argv), "machine": mach,
                  "seed": seed, "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
                  "throughput": {**asdict(thr), "medians": {
                      "get_gbps": gbps(thr.bytes, median(thr.get_s)), "put_gbps": gbps(thr.bytes, median(thr.put_s)),
                      "socket_gbps": gbps(thr.bytes, median(thr.socket_s))}},
                  "migrations": [asdict(r) for r in mig]}
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        say(f"wrote {args.json}")
    if args.markdown:
        print("\n" + markdown_section(args, argv, mach, thr, mig, when), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
