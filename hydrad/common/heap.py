"""Keeping the cyclic collector's full passes out of the serving path.

CPython's collector walks every tracked object of its oldest generation on a full pass, and a
pass runs whenever enough objects have survived since the last one, inside whatever code
allocates next: on a daemon's event loop that is the middle of some request, often between its
arrival and its handler, where none of the request's own timings can see it. A daemon's
long-lived objects (modules, the web app, pydantic models, a loaded model's Python side) are
tens of thousands: a full pass over an engine took 37–51 ms on the 2-core machine and about
10 ms on the GPU host, where it put 9–16 ms into every other one-token answer of a benchmark
(docs/benchmarks.md, "How to reproduce").

:func:`settle` moves every object alive now into the permanent generation, which no pass walks,
so a full pass only walks what was made since. The price: an object frozen here and later
dropped inside a reference cycle is never collected. So it is called only where what exists is
meant to live on: when a daemon starts its loop, and when a model load has been installed.
A retired generation is freed by reference counting (the llama.cpp side by the reaper): over
four loads of two models, a full collection afterwards found 13 objects in cycles, all ctypes
type records, which llama-cpp-python caches anyway. The requests in flight when a load is
installed are frozen with it; what of theirs ends up in a cycle (a task and its frames) stays
allocated after they end. That is bounded by the requests of one moment, once per load.
"""

from __future__ import annotations

import contextlib
import gc
from typing import Iterator


def settle() -> None:
    """Freeze everything alive now out of the collector's full passes.

    Freezing splices the collector's lists: constant time. Counting what is frozen
    (``gc.get_freeze_count()``) walks the whole permanent generation under the interpreter lock,
    one cache miss per object: 4 ms for an engine's 55,000 on the 2-core machine. Settled after
    every load, that walk was a wait for the serving generation's step thread at the very moment
    a reload installs the new model. So nothing here counts."""
    gc.freeze()


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """No collector pass inside the block, after one just before it: the benchmarks' clients time
    their requests inside it, so a pass over the client's own heap (50 ms on the 2-core machine)
    is never counted as a server's latency."""
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
