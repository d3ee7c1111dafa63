"""ggml backend devices and ggml-RPC through ctypes on llama-cpp-python's bundled libraries.

llama-cpp-python exposes neither device lists nor the RPC helpers, so this module binds the
few functions we need from ``libggml`` and ``libggml-rpc``: enumerate devices, run llama.cpp's
own ggml RPC server in-process (so a peer engine can compute on this engine's devices), and,
on the client side, register a remote RPC endpoint as a device.
"""

from __future__ import annotations

import ctypes
import os
import socket
import stat
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from hydrad.engine import llama

_libs: dict[str, ctypes.CDLL] = {}
_lock = threading.Lock()

DEV_TYPES = {0: "cpu", 1: "gpu", 2: "igpu", 3: "accel"}


def _lib_dir() -> Path:
    override = os.environ.get("LLAMA_CPP_LIB_PATH")
    if override:
        return Path(override)
    mod = llama.lib()
    return Path(mod.__file__).resolve().parent / "lib"


def _load(name: str) -> ctypes.CDLL:
    with _lock:
        if name not in _libs:
            llama.lib()  # libllama first: it pulls in libggml with the backends registered
            _libs[name] = ctypes.CDLL(str(_lib_dir() / f"lib{name}.so"), mode=ctypes.RTLD_GLOBAL)
            _bind(name, _libs[name])
    return _libs[name]


def _bind(name: str, lib: ctypes.CDLL) -> None:
    vp, sz, cp = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p
    sigs: dict[str, tuple[Any, list[Any]]] = {}
    if name == "ggml":
        sigs = {
            "ggml_backend_dev_count": (sz, []),
            "ggml_backend_dev_get": (vp, [sz]),
            "ggml_backend_dev_name": (cp, [vp]),
            "ggml_backend_dev_description": (cp, [vp]),
            "ggml_backend_dev_type": (ctypes.c_int, [vp]),
            "ggml_backend_dev_memory": (None, [vp, ctypes.POINTER(sz), ctypes.POINTER(sz)]),
            "ggml_backend_reg_dev_count": (sz, [vp]),
            "ggml_backend_reg_dev_get": (vp, [vp, sz]),
            "ggml_backend_dev_buffer_type": (vp, [vp]),
            "ggml_backend_dev_by_name": (vp, [cp]),
        }
    elif name == "ggml-cpu":
        sigs = {"ggml_backend_cpu_buffer_type": (vp, [])}
    elif name == "ggml-base":
        sigs = {
            "ggml_blck_size": (ctypes.c_int64, [ctypes.c_int]),
            "ggml_type_size": (sz, [ctypes.c_int]),
            "ggml_backend_buft_name": (cp, [vp]),
        }
    elif name == "ggml-rpc":
        sigs = {
            "ggml_backend_rpc_start_server": (None, [cp, cp, sz, sz, ctypes.POINTER(vp)]),
            "ggml_backend_rpc_add_server": (vp, [cp]),
        }
    for fn, (res, args) in sigs.items():
        f = getattr(lib, fn)
        f.restype, f.argtypes = res, args


@dataclass(frozen=True)
class Device:
    handle: int
    name: str
    description: str
    kind: str
    memory_free: int
    memory_total: int

    def public(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "type": self.kind,
                "memory_free": self.memory_free, "memory_total": self.memory_total}


def _device(handle: int) -> Device:
    g = _load("ggml")
    free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
    g.ggml_backend_dev_memory(handle, ctypes.byref(free), ctypes.byref(total))
    return Device(handle, (g.ggml_backend_dev_name(handle) or b"").decode(),
                  (g.ggml_backend_dev_description(handle) or b"").decode(),
                  DEV_TYPES.get(g.ggml_backend_dev_type(handle), "other"), free.value, total.value)


def devices() -> list[Device]:
    g = _load("ggml")
    return [_device(g.ggml_backend_dev_get(i)) for i in range(g.ggml_backend_dev_count())]


def serving_devices() -> list[Device]:
    """What a peer may compute on: this engine's GPUs, or its CPU when it has none (as rpc-server does)."""
    local = [d for d in devices() if not d.name.upper().startswith("RPC")]
    gpus = [d for d in local if d.kind in ("gpu", "igpu")]
    return gpus or [d for d in local if d.kind == "cpu"]


def reserve_port(host: str = "127.0.0.1") -> socket.socket:
    """A socket bound to a free port of ``host`` and never listened on, which holds the port for a server
    that binds it later with ``SO_REUSEADDR`` (llama.cpp's RPC server does).

    Picking a port by binding port 0 and closing the probe left the port free until the server's thread
    bound it, and another ``bind(("", 0))`` of this process (the merged port, the HTTP listener) could be
    handed that very port meanwhile: the relay then took its own listener for llama.cpp's and sealed it
    (connections refused). While a bound socket holds the port, the kernel hands it to no ``bind(0)``,
    and a server that sets ``SO_REUSEADDR`` can still bind and listen on it beside this one."""
    s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((host, 0))
    except OSError:
        s.close()
        raise
    return s


class RpcServerThread:
    """llama.cpp's ggml RPC server, running in-process on its own thread (the call never returns).

    ``port`` 0 picks a free port and holds it (:func:`reserve_port`) for the life of the server."""

    def __init__(self, host: str, port: int, cache_dir: Path | None, n_threads: int) -> None:
        self._reservation = reserve_port(host) if port == 0 else None
        if self._reservation is not None:
            port = self._reservation.getsockname()[1]
        self.port = port
        self.endpoint = f"{host}:{port}"
        self.cache_dir = cache_dir
        self.n_threads = n_threads
        self.devices: list[Device] = []
        self.error: str | None = None
        self.tid: int | None = None  # the kernel's id of the thread the server loop runs on
        self._thread = threading.Thread(target=self._run, name="hydrad-ggml-rpc", daemon=True)

    def start(self) -> None:
        if self.cache_dir is not None:
            self.cache_dir.mkdir(parents=True, exist_ok=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def _run(self) -> None:
        try:
            r = _load("ggml-rpc")
            self.devices = serving_devices()
        except Exception as exc:  # no libggml-rpc in this build: the engine runs without peer compute
            self.error = f"ggml RPC server unavailable: {exc}"
            return
        arr = (ctypes.c_void_p * len(self.devices))(*[d.handle for d in self.devices])
        cache = str(self.cache_dir).encode() if self.cache_dir is not None else None
        self.tid = threading.get_native_id()
        r.ggml_backend_rpc_start_server(self.endpoint.encode(), cache, self.n_threads, len(self.devices), arr)


def add_rpc_server(endpoint: str) -> list[int]:
    """Client side: register a remote ggml RPC endpoint; returns its device handles."""
    r = _load("ggml-rpc")
    g = _load("ggml")
    reg = r.ggml_backend_rpc_add_server(endpoint.encode())
    if not reg:
        raise ConnectionError(f"cannot reach ggml RPC server at {endpoint}")
    return [g.ggml_backend_reg_dev_get(reg, i) for i in range(g.ggml_backend_reg_dev_count(reg))]


def buffer_type(dev: int) -> tuple[int, str]:
    """A device's default buffer type and its name (the names ``override_tensors`` speaks of:
    ``CPU``, ``CUDA0``, ``RPC0[host:port]``)."""
    buft = _load("ggml").ggml_backend_dev_buffer_type(dev)
    if not buft:
        raise ValueError("device has no buffer type")
    return int(buft), (_load("ggml-base").ggml_backend_buft_name(buft) or b"").decode()


def device_by_name(name: str) -> Device | None:
    """The device llama.cpp knows by ``name`` (``CUDA0``, ``CPU``; matched without regard to case, as
    ``ggml_backend_dev_by_name`` does), or None: what llama-server's ``--device`` looks names up with."""
    handle = _load("ggml").ggml_backend_dev_by_name(name.encode())
    return _device(handle) if handle else None


def cpu_buffer_type() -> int:
    """The CPU buffer type itself (``ggml_backend_cpu_buffer_type``), the one llama-server gives an
    override to ``CPU`` (``--n-cpu-moe`` included): llama.cpp compares an override's buffer type with it
    to let such a tensor use the CPU's extra buffer types (weight repacking) too."""
    buft = _load("ggml-cpu").ggml_backend_cpu_buffer_type()
    if not buft:
        raise ValueError("the CPU backend has no buffer type")
    return int(buft)


def max_tensor_overrides() -> int:
    """How many tensor buffer type overrides llama.cpp accepts in one load (``llama_max_tensor_buft_overrides``)."""
    f = llama.lib().llama_cpp._lib.llama_max_tensor_buft_overrides
    f.restype, f.argtypes = ctypes.c_size_t, []
    return int(f())


def type_sizes(count: int) -> list[tuple[int, int]]:
    """(block size, bytes per block) of ggml types 0..count-1, for checking tensor extents without ggml."""
    b = _load("ggml-base")
    return [(int(b.ggml_blck_size(t)), int(b.ggml_type_size(t))) for t in range(count)]


def _own_sockets() -> list[tuple[int, socket.socket]]:
    """Every INET stream socket of this process, as (fd, a duplicate to inspect); close the duplicates."""
    out: list[tuple[int, socket.socket]] = []
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            if not stat.S_ISSOCK(os.fstat(fd).st_mode):
                continue
            s = socket.socket(fileno=os.dup(fd))
        except OSError:
            continue
        if s.family in (socket.AF_INET, socket.AF_INET6) and s.type == socket.SOCK_STREAM:
            out.append((fd, s))
        else:
            s.close()
    return out


def _own_socket(match: Callable[[socket.socket], bool]) -> tuple[int, socket.socket] | None:
    """The first INET stream socket of this process that ``match`` accepts, as (fd, a duplicate the caller
    closes), or None; a socket whose inspection fails does not match."""
    found = None
    sockets = _own_sockets()
    try:
        for fd, s in sockets:
            try:
                if found is None and match(s):
                    found = (fd, s)
            except OSError:
                continue
    finally:
        for _, s in sockets:
            if found is None or s is not found[1]:
                s.close()
    return found


def accepted_fd(endpoint: tuple[str, int], client: tuple[str, int]) -> int | None:
    """The descriptor under which this process's server at ``endpoint`` holds the connection from
    ``client`` (the accepted side of a connection this process made to itself), or None."""
    found = _own_socket(lambda s: tuple(s.getsockname()[:2]) == tuple(endpoint)
                        and tuple(s.getpeername()[:2]) == tuple(client))
    if found is None:
        return None
    found[1].close()
    return found[0]


def listening_socket(endpoint: tuple[str, int]) -> socket.socket | None:
    """A duplicate of this process's listening socket at ``endpoint`` (the caller closes it), or None."""
    found = _own_socket(lambda s: tuple(s.getsockname()[:2]) == tuple(endpoint)
                        and bool(s.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)))
    return found[1] if found is not None else None


def seal_server(endpoint: tuple[str, int], keep: tuple[str, int]) -> int:
    """Close llama.cpp's RPC server to everyone but the connection ``keep`` (the relay's own).

    The server only listens on TCP (its transport has no unix-socket endpoint), so any local user
    could reach a loopback port. It serves one client at a time and never accepts again while that
    client stays, so once the relay's connection is being served, the listening socket is shut down
    in place (it lives in this process): the port stops accepting at once, and connections queued
    behind ours are reset. Any other connection already accepted on that port is shut down too.
    Returns how many foreign connections were cut."""
    cut = 0
    sockets = _own_sockets()
    try:
        for _, s in sockets:
            try:
                local = s.getsockname()[:2]
            except OSError:
                continue
            if tuple(local) != tuple(endpoint):
                continue
            listening = s.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
            if not listening:
                try:
                    if tuple(s.getpeername()[:2]) == tuple(keep):
                        continue
                except OSError:
                    continue  # bound but neither listening nor connected: the port's reservation
                cut += 1
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
    finally:
        for _, s in sockets:
            s.close()
    return cut
