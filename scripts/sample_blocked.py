#!/usr/bin/env python3
"""Which threads of a process sit in which system call, and for how long: a sampler of
``/proc/PID/task/*/syscall``, for finding what holds up the engine's step thread during a model load.

Every ``--interval-ms`` it reads, for each thread whose OS name starts with one of ``--names`` (the
engine names its threads: hydrad-engine, hydrad-loader-N, hydrad-reaper), the system call the thread is
in, or that it runs. A stretch of consecutive samples in the same call that lasts ``--min-ms`` or
longer is written as one JSON line on stdout:

    {"tid": 1234, "name": "hydrad-engine", "call": "mmap", "nr": 9, "start": 5123.456, "end": 5123.502,
     "ms": 46.0, "wchan": "rwsem_down_write_slowpath"}

A wait in ``futex`` also says which lock: ``uaddr`` is the futex word's address (the call's first
argument at the stretch's first sample) and ``futex_in`` the mapping it lies in, from
``/proc/PID/maps``: the interpreter's own (``libpython3.12.so.1.0``, or the ``python`` executable
when it is linked statically) holds the interpreter lock, so a step thread waiting there waits for
Python. Any other lock lives where its maker allocated it: ``[heap]`` or ``anon`` (an anonymous mapping:
a thread's own malloc arena, where the locks of Python's ``threading`` made on that thread live too), or a
library's own data (``libcuda.so.1``: the driver's static locks).

A thread that runs, in user space or in the kernel (a ``MAP_POPULATE`` pre-faulting its file, say), is
"running" and not written: what is written is where a thread waited. ``start`` and ``end`` are
``time.monotonic()`` seconds, the clock every process of the machine shares, so
a benchmark can set the stretches beside its own stamps. A stretch is known to within one interval at
each end. ``wchan`` is where in the kernel the thread waited at the stretch's first sample. Runs until
the process ends or this one is told to stop (SIGTERM, SIGINT).

Reading another process's ``syscall`` files needs the right to trace it (the same user with ptrace
allowed, or root). x86-64 call numbers are named; others are written as ``syscall N``.

    python3 scripts/sample_blocked.py --pid "$(pgrep -f hydrad.cli.hydrad)" --min-ms 2
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, TextIO

# x86-64 numbers of the calls a serving thread can wait in
CALLS = {0: "read", 1: "write", 3: "close", 7: "poll", 9: "mmap", 10: "mprotect", 11: "munmap", 12: "brk",
         16: "ioctl", 17: "pread64", 23: "select", 25: "mremap", 28: "madvise", 35: "nanosleep", 44: "sendto",
         45: "recvfrom", 46: "sendmsg", 47: "recvmsg", 56: "clone", 72: "fcntl", 202: "futex",
         230: "clock_nanosleep", 232: "epoll_wait", 257: "openat", 271: "ppoll", 281: "epoll_pwait",
         435: "clone3", 441: "epoll_pwait2"}
FUTEX = 202
RESCAN_S = 0.05  # how often the list of threads (and their names) is read again: loaders come and go


@dataclass
class Stretch:
    """One thread's consecutive samples in one state: a call number, or -2 while it runs."""

    tid: int
    name: str
    nr: int
    start: float
    last: float
    wchan: str
    arg0: int = 0  # the call's first argument at the first sample (a futex's address)


def read_state(task: Path) -> tuple[int, int] | None:
    """The call the thread is in (its number) and the call's first argument; -2 while it runs, -1 when
    it waits outside a call; None when the thread is gone."""
    try:
        text = (task / "syscall").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    if text.startswith("running"):
        return -2, 0
    fields = text.split()
    try:
        return int(fields[0]), int(fields[1], 16) if len(fields) > 1 else 0
    except (ValueError, IndexError):
        return -1, 0


def mapping_of(pid: int, addr: int) -> str:
    """The name of the mapping of ``pid`` that holds ``addr``: a file's base name, ``[heap]``, ``[stack]``,
    ``anon`` for an anonymous one, ``?`` when none does (or the map can no longer be read)."""
    try:
        with open(f"/proc/{pid}/maps") as f:
            for line in f:
                span, _, rest = line.partition(" ")
                lo, _, hi = span.partition("-")
                if int(lo, 16) <= addr < int(hi, 16):
                    parts = rest.split(None, 4)
                    path = parts[4].strip() if len(parts) > 4 else ""
                    return "anon" if not path else path if path.startswith("[") else Path(path).name
    except (OSError, ValueError):
        pass
    return "?"


def read_wchan(task: Path) -> str:
    try:
        return (task / "wchan").read_text().strip() or "?"
    except OSError:
        return "?"


def threads(pid: int, names: tuple[str, ...]) -> dict[int, tuple[Path, str]]:
    """The threads of ``pid`` whose OS name starts with one of ``names`` (all when ``names`` is empty)."""
    out: dict[int, tuple[Path, str]] = {}
    root = Path(f"/proc/{pid}/task")
    try:
        tids = os.listdir(root)
    except FileNotFoundError:
        return out
    for tid in tids:
        task = root / tid
        try:
            name = (task / "comm").read_text().strip()
        except OSError:
            continue
        if not names or name.startswith(names):
            out[int(tid)] = (task, name)
    return out


def sample(pid: int, names: tuple[str, ...], interval_s: float, min_s: float,
           stop: list[bool]) -> Iterator[dict[str, object]]:
    """Yield each stretch of one call that lasted ``min_s`` or more, until ``pid`` ends or ``stop[0]``."""
    open_: dict[int, Stretch] = {}
    watched: dict[int, tuple[Path, str]] = {}
    rescan_at = 0.0

    def close(st: Stretch) -> dict[str, object] | None:
        if st.nr < 0 or st.last - st.start < min_s:
            return None
        out: dict[str, object] = {
            "tid": st.tid, "name": st.name, "call": CALLS.get(st.nr, f"syscall {st.nr}"), "nr": st.nr,
            "start": round(st.start, 6), "end": round(st.last, 6), "ms": round((st.last - st.start) * 1000, 2),
            "wchan": st.wchan}
        if st.nr == FUTEX:  # read only for what is written: a CUDA process's map runs to thousands of lines
            out.update(uaddr=hex(st.arg0), futex_in=mapping_of(pid, st.arg0))
        return out

    while not stop[0]:
        now = time.monotonic()
        if now >= rescan_at:
            watched = threads(pid, names)
            rescan_at = now + RESCAN_S
            if not watched and not Path(f"/proc/{pid}").exists():
                break
        for tid, (task, name) in list(watched.items()):
            state = read_state(task)
            t = time.monotonic()
            st = open_.get(tid)
            if st is not None and state is not None and state[0] == st.nr:
                st.last = t
                continue
            if st is not None:
                done = close(st)
                if done:
                    yield done
                del open_[tid]
            if state is None:
                watched.pop(tid, None)
                continue
            nr, arg0 = state
            open_[tid] = Stretch(tid, name, nr, t, t, read_wchan(task) if nr >= 0 else "", arg0)
        time.sleep(interval_s)
    for st in open_.values():
        done = close(st)
        if done:
            yield done


def main(argv: list[str] | None = None, out: TextIO = sys.stdout) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pid", type=int, required=True, help="the process to watch")
    ap.add_argument("--names", default="hydrad-", help="comma-separated prefixes of the OS thread names to watch "
                    "(default hydrad-: the engine's own threads); empty: every thread")
    ap.add_argument("--interval-ms", type=float, default=0.5, help="time between samples (default 0.5)")
    ap.add_argument("--min-ms", type=float, default=2.0, help="shortest stretch in one call written (default 2)")
    args = ap.parse_args(argv)
    if not Path(f"/proc/{args.pid}").exists():
        print(f"sample_blocked: no process {args.pid}", file=sys.stderr)
        return 2
    try:
        Path(f"/proc/{args.pid}/syscall").read_text()
    except PermissionError:
        print(f"sample_blocked: may not read /proc/{args.pid}/syscall: tracing that process needs root or the "
              "same user with ptrace allowed", file=sys.stderr)
        return 2
    except OSError:
        pass  # the process is ending; the loop below sees it go
    names = tuple(n for n in args.names.split(",") if n)
    stop = [False]

    def on_signal(_sig: int, _frame: object) -> None:
        stop[0] = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        for line in sample(args.pid, names, args.interval_ms / 1000, args.min_ms / 1000, stop):
            out.write(json.dumps(line) + "\n")
            out.flush()
    except BrokenPipeError:  # the reader went away (e.g. | head): nothing left to say
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
