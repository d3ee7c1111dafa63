"""scripts/gil_holders.py: which thread of a process holds the interpreter lock, and in what code.

Against a real child process sampled by py-spy from outside: a thread that sorts a large list in one
C call after another holds the lock nearly all the time, and the summary puts it first, in the line
that sorts; a thread that only sleeps holds it for no share of the time. The parser is also checked on py-spy's raw
lines as they come (a numbered thread counted with its siblings).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import pytest

from tests.support.scripts import load_script

gh = load_script("gil_holders")

CHILD = textwrap.dedent("""
    import random, sys, threading, time
    data = [random.random() for _ in range(400_000)]

    def hog():
        while True:
            sorted(data)  # one C call, the lock held throughout

    def idle():
        while True:
            time.sleep(0.01)

    threading.Thread(target=hog, name="hog-1", daemon=True).start()
    threading.Thread(target=idle, name="sleeper", daemon=True).start()
    print("ready", flush=True)
    time.sleep(60)
""")


def test_the_parser_counts_each_thread_family_and_its_lines() -> None:
    raw = "\n".join([
        "thread (6345): hydrad-loader-1;Thread.run (threading.py:982);settle (hydrad/common/heap.py:34) 13",
        "thread (6349): hydrad-loader-3;Thread.run (threading.py:982);settle (hydrad/common/heap.py:34) 7",
        "thread (0x7f3a): hydrad-loader-3;Thread.run (threading.py:982);_skip_strings (gguf_meta.py:80) 5",
        "thread (6327): hydrad-engine;EngineCore._turns (hydrad/engine/core.py:337) 4",
        "not a sample line",
    ])
    got = gh.summarize(raw, rate=1000)
    assert list(got) == ["hydrad-loader", "hydrad-engine"]
    assert got["hydrad-loader"]["ms"] == 25.0
    assert got["hydrad-loader"]["top"][0] == ["settle (hydrad/common/heap.py:34)", 20.0]
    assert got["hydrad-engine"] == {"ms": 4.0, "top": [["EngineCore._turns (hydrad/engine/core.py:337)", 4.0]]}
    assert gh.summarize(raw, rate=500)["hydrad-engine"]["ms"] == 8.0  # each sample is 1000/rate ms


@pytest.mark.serial  # who holds the lock, sampled for 2.5 s: alone
def test_a_thread_holding_the_lock_in_one_c_call_is_found_in_it() -> None:
    if gh.py_spy() is None:
        pytest.skip("py-spy is not installed (the test extras)")
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        rec = gh.Recording(child.pid)
        time.sleep(2.5)
        got = rec.stop()
        if not got:
            pytest.skip("py-spy could not attach to a child (needs root or ptrace allowed)")
    finally:
        child.kill()
        child.wait()
    # the sleeper takes the lock only to go back to sleep, 100 times a second: a sample may catch it there
    # (one 1 ms sample in a CI run), never for a share of the time
    assert got.get("sleeper", {"ms": 0.0})["ms"] <= 0.02 * got["hog"]["ms"], got
    assert next(iter(got)) == "hog", got  # first: the one that held it longest
    assert got["hog"]["ms"] > 1000, got  # of 2.5 s
    assert got["hog"]["top"][0][0].startswith("hog ("), got
