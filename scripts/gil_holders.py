#!/usr/bin/env python3
"""Which of a process's threads hold the interpreter lock, and in what code, sampled from outside.

The engine's step thread gives the interpreter lock up around every llama.cpp call and needs it back
after each one; when another thread holds it in one long C call (which the interpreter cannot
interrupt at its switch interval), the step waits, and the sampler of system calls
(scripts/sample_blocked.py) only sees it wait in ``futex`` on the interpreter's own lock. This says
who held it: py-spy samples each thread's Python stack, keeping only the thread that holds the lock
(``--gil``), without stopping the process (``--nonblocking``). Every sample is a millisecond of
holding at the default rate, so a thread's count is its time holding the lock.

It found one: after each load the engine froze its heap and then counted what was frozen, a walk of
every frozen object under the lock, 4 ms on the 2-core machine, at the moment a reload installs the
new model.

    scripts/gil_holders.py --pid PID --seconds 20
    scripts/gil_holders.py --pid PID            # until SIGTERM or SIGINT, then the summary

Prints one JSON object: per thread (numbered ones such as ``hydrad-loader-3`` counted together as
``hydrad-loader``) the milliseconds it held the lock and the code lines it held it in most. Needs
py-spy (in the test extras) and the right to trace the process (root, or ptrace allowed).
"""

from __future__ import annotations

if __name__ == "__main__":  # run as scripts/NAME: under the checkout's .venv when there is one
    import _venv
    _venv.reexec()

import argparse
import collections
import json
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

_LINE = re.compile(r"^thread \((?:0x)?[0-9a-fA-F]+\): (?P<stack>.*) (?P<count>\d+)$")
_NUMBERED = re.compile(r"-\d+$")


def py_spy() -> str | None:
    """The py-spy beside this interpreter (a venv's bin), else the one on PATH."""
    here = Path(sys.executable).with_name("py-spy")
    return str(here) if here.exists() else shutil.which("py-spy")


def summarize(raw: str, rate: int, top: int = 8) -> dict[str, Any]:
    """py-spy's raw (collapsed) output with ``--threads`` to {thread: {"ms", "top": [[frame, ms], ...]}}.

    A line is ``thread (TID): NAME;frame;...;leaf COUNT``. The leaf is where the lock was held (a C
    call is attributed to the Python line that made it)."""
    held: collections.Counter[str] = collections.Counter()
    where: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for line in raw.splitlines():
        m = _LINE.match(line.strip())
        if not m:
            continue
        frames = m["stack"].split(";")
        thread = _NUMBERED.sub("", frames[0]) or "?"
        n = int(m["count"])
        held[thread] += n
        where[thread][frames[-1] if len(frames) > 1 else "(no Python frame)"] += n
    ms = 1000 / rate
    return {t: {"ms": round(n * ms, 1), "top": [[f, round(c * ms, 1)] for f, c in where[t].most_common(top)]}
            for t, n in held.most_common()}


class Recording:
    """py-spy recording a process until stopped; :meth:`stop` returns the summary."""

    def __init__(self, pid: int, rate: int = 1000, seconds: float | None = None) -> None:
        exe = py_spy()
        if exe is None:
            raise SystemExit("py-spy not found: install the test extras (pip install -e '.[test]')")
        self.rate = rate
        self._dir = tempfile.TemporaryDirectory(prefix="gil-holders-")
        self.out = Path(self._dir.name) / "raw.txt"
        argv = [exe, "record", "--pid", str(pid), "--gil", "--threads", "--nonblocking", "--format", "raw",
                "--rate", str(rate), "--output", str(self.out)]
        if seconds is not None:
            argv += ["--duration", str(max(1, round(seconds)))]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

    def stop(self, timeout: float = 60) -> dict[str, Any]:
        """Stop (py-spy writes its output on SIGINT) and summarize; {} when it could not attach."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            _, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _, err = self.proc.communicate()
        try:
            if not self.out.exists():
                print(f"gil_holders: py-spy wrote nothing ({self.proc.returncode}): {err.strip()[-300:]}",
                      file=sys.stderr, flush=True)
                return {}
            return summarize(self.out.read_text(), self.rate)
        finally:
            self._dir.cleanup()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pid", type=int, required=True)
    ap.add_argument("--seconds", type=float, help="how long (default: until SIGTERM or SIGINT)")
    ap.add_argument("--rate", type=int, default=1000, help="samples a second (each one 1000/RATE ms of holding)")
    args = ap.parse_args()
    rec = Recording(args.pid, args.rate, args.seconds)
    stop = {"now": False}

    def _stop(_sig: int, _frame: Any) -> None:
        stop["now"] = True

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    deadline = None if args.seconds is None else time.monotonic() + args.seconds + 5
    while not stop["now"] and rec.proc.poll() is None and (deadline is None or time.monotonic() < deadline):
        time.sleep(0.05)
    print(json.dumps(rec.stop()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
