"""scripts/sample_blocked.py: which of a process's named threads sit in which system call, and how long.

Against real child processes: a thread that sleeps is seen in clock_nanosleep for as long as it sleeps,
and a thread that maps and unmaps memory is seen waiting in mmap/munmap while another thread of its
process maps a model file with MAP_POPULATE, as a mapped llama.cpp load does (the lock that pre-faulting
holds; docs/benchmarks.md, "A load beside a serving context"), and a thread waiting for the interpreter
lock is seen in futex with the lock's word in the interpreter's own mapping. The engine names its threads for this
(hydrad.common.osthread), checked on a real engine.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from hydrad.common.osthread import name_os_thread

ROOT = Path(__file__).resolve().parents[2]
SAMPLER = ROOT / "scripts" / "sample_blocked.py"

# What every child below starts with: a thread of a given OS name that repeats one step, and timed
# windows of an action in the main thread, printed as JSON for the test to set beside what was sampled.
PROLOGUE = """
import ctypes, json, os, random, sys, threading, time
sys.path.insert(0, sys.argv[1])
from hydrad.common.osthread import name_os_thread
def named(name, step):
    def run():
        name_os_thread(name)
        while True:
            step()
    threading.Thread(target=run, daemon=True).start()
def windows_of(action, n, undo=lambda result: None):
    out = []
    for _ in range(n):
        t0 = time.monotonic()
        result = action()
        out.append((t0, time.monotonic()))
        undo(result)
        time.sleep(0.1)
    print(json.dumps(out), flush=True)
"""

SLEEPER = PROLOGUE + """
def sleep_then_run():
    time.sleep(0.06)
    t = time.monotonic()
    while time.monotonic() - t < 0.01:  # running between the sleeps, for the sampler to see
        pass
named("hydrad-sleeper", sleep_then_run)
print("ready", flush=True)
time.sleep(60)
"""

MAPPER = PROLOGUE + """
libc = ctypes.CDLL(None)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
named("hydrad-mapper", lambda: libc.munmap(libc.mmap(None, 1 << 20, 3, 0x22, -1, 0), 1 << 20))
fd = os.open(sys.argv[2], os.O_RDONLY)
size = os.fstat(fd).st_size
with open(sys.argv[2], "rb") as f:
    while f.read(1 << 24):
        pass
print("ready", flush=True)
time.sleep(0.3)
# PROT_READ, MAP_SHARED | MAP_POPULATE; the window is the mapping alone, the unmapping follows it
windows_of(lambda: libc.mmap(None, size, 1, 0x01 | 0x08000, fd, 0), int(sys.argv[3]), lambda p: libc.munmap(p, size))
"""

# The main thread holds the interpreter lock in one long C call (a sort: no bytecode, so no hand-over)
# while a named thread that wakes every millisecond needs the lock to go on.
GIL_HOLDER = PROLOGUE + """
named("hydrad-waker", lambda: time.sleep(0.001))
data = [random.random() for _ in range(2_000_000)]
print("ready", flush=True)
time.sleep(0.3)
windows_of(lambda: sorted(data), 3)
time.sleep(60)
"""


def _sample_while(child: subprocess.Popen[str], *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, str(SAMPLER), "--pid", str(child.pid), *args],
                            stdout=subprocess.PIPE, text=True)


def _stretches(sampler: subprocess.Popen[str]) -> list[dict[str, object]]:
    sampler.terminate()
    out, _ = sampler.communicate(timeout=30)
    assert sampler.returncode == 0
    return [json.loads(line) for line in out.splitlines() if line.strip()]


@pytest.mark.serial  # sleeps of tens of milliseconds, sampled: alone
def test_a_named_thread_asleep_is_seen_in_its_call_for_as_long_as_it_sleeps() -> None:
    child = subprocess.Popen([sys.executable, "-c", SLEEPER, str(ROOT)], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        sampler = _sample_while(child, "--names", "hydrad-sleeper", "--min-ms", "20")
        time.sleep(1.0)
        seen = _stretches(sampler)
    finally:
        child.kill()
        child.wait()
    sleeps = [s for s in seen if s["call"] == "clock_nanosleep"]
    assert sleeps, seen
    assert {s["name"] for s in seen} == {"hydrad-sleeper"}  # the main thread (not named) is not watched
    assert all(float(s["ms"]) >= 20 for s in seen)
    # a sleep of 60 ms is seen as about that
    assert any(40 <= float(s["ms"]) <= 130 for s in sleeps), sleeps
    assert all(float(s["end"]) > float(s["start"]) for s in seen)


@pytest.mark.model
def test_another_threads_map_calls_wait_while_a_file_mapping_is_pre_faulted(gemma_path: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", MAPPER, str(ROOT), str(gemma_path), "8"],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        sampler = _sample_while(child, "--names", "hydrad-mapper", "--min-ms", "3", "--interval-ms", "0.2")
        windows = json.loads(child.stdout.readline())
        seen = _stretches(sampler)
    finally:
        child.kill()
        child.wait()
    longest_populate = max(b - a for a, b in windows)
    assert longest_populate > 0.004, f"pre-faulting {gemma_path.name} took {longest_populate * 1000:.1f} ms"
    waits = [s for s in seen if s["call"] in ("mmap", "munmap")]
    inside = [s for s in waits if any(float(s["start"]) < b + 0.002 and float(s["end"]) > a - 0.002
                                      for a, b in windows)]
    assert inside, (windows, seen)  # the mapper waited in a map call while the file was being pre-faulted
    assert all(s["name"] == "hydrad-mapper" for s in seen)


@pytest.mark.serial  # lock holds of tens of milliseconds, sampled: alone
def test_a_wait_for_the_interpreter_lock_is_told_by_the_mapping_of_its_futex() -> None:
    child = subprocess.Popen([sys.executable, "-c", GIL_HOLDER, str(ROOT)], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        sampler = _sample_while(child, "--names", "hydrad-waker", "--min-ms", "20")
        windows = json.loads(child.stdout.readline())
        seen = _stretches(sampler)
        maps = Path(f"/proc/{child.pid}/maps").read_text()
    finally:
        child.kill()
        child.wait()
    assert min(b - a for a, b in windows) > 0.05, windows  # each sort held the lock long enough to see
    futexes = [s for s in seen if s["call"] == "futex"]
    inside = [s for s in futexes if any(float(s["start"]) < b and float(s["end"]) > a for a, b in windows)]
    assert inside, (windows, seen)
    # the futex word is the interpreter's: in libpython, or in the executable when it is linked statically
    interpreter = {Path(ln.split(None, 5)[5]).name for ln in maps.splitlines()
                   if len(ln.split(None, 5)) > 5 and ("libpython" in ln or ln.split(None, 5)[5] == Path(sys.executable).resolve().as_posix())}
    assert interpreter, "no interpreter mapping in the child's map"
    assert {s["futex_in"] for s in inside} <= interpreter, (inside, interpreter)
    assert all(str(s["uaddr"]).startswith("0x") for s in inside)


def test_the_sampler_refuses_a_process_that_is_not_there() -> None:
    out = subprocess.run([sys.executable, str(SAMPLER), "--pid", "999999999"], capture_output=True, text=True,
                         timeout=30)
    assert out.returncode == 2 and "no process 999999999" in out.stderr


def test_name_os_thread_sets_what_proc_shows() -> None:
    got: dict[str, object] = {}

    def run() -> None:
        got["ok"] = name_os_thread()
        got["comm"] = Path(f"/proc/self/task/{threading.get_native_id()}/comm").read_text().strip()

    t = threading.Thread(target=run, name="hydrad-loader-123456")
    t.start()
    t.join()
    assert got == {"ok": True, "comm": "hydrad-loader-1"}  # the kernel keeps 15 bytes


@pytest.mark.model
def test_the_engine_names_its_step_thread(smollm_engine) -> None:  # type: ignore[no-untyped-def]
    names = set()
    for task in Path(f"/proc/{smollm_engine.proc.pid}/task").iterdir():
        try:
            names.add((task / "comm").read_text().strip())
        except OSError:
            pass
    assert "hydrad-engine" in names, names
