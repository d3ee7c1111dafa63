"""The kept KV-snapshot buffer: reused only once every view of the last snapshot is gone."""

from __future__ import annotations

import gc

import numpy as np

from hydrad.engine.statebuf import StateBuffers, headroom


def test_a_dropped_snapshot_buffer_is_reused_and_a_live_one_never() -> None:
    pool = StateBuffers()
    first = pool.take(1 << 20)
    first[:] = 1
    address = first.ctypes.data
    frames = [memoryview(first)[i:i + 4096] for i in range(0, 1 << 16, 4096)]  # a transfer in progress
    del first
    second = pool.take(1 << 20)  # the first is still being read: a new buffer
    assert second.ctypes.data != address and pool.reused == 0
    del frames
    gc.collect()
    third = pool.take(1 << 20)  # now the first buffer is free again
    assert third.ctypes.data == address and pool.reused == 1 and len(third) == 1 << 20
    smaller = StateBuffers()
    a = smaller.take(1000)
    del a
    b = smaller.take(400)  # more than twice too big: not kept for it
    assert smaller.reused == 0 and len(b) == 400
    del second, third, b


def test_kept_memory_is_bounded_and_expires() -> None:
    pool = StateBuffers(keep_max=1 << 16, idle_s=5.0)
    big = pool.take(1 << 17)  # above keep_max: never kept
    del big
    assert pool.kept_bytes == 0
    small = pool.take(1 << 15)
    del small
    assert pool.kept_bytes == headroom(1 << 15) == (1 << 15) + (1 << 13)  # room for a slightly longer next state
    pool.trim()  # still fresh
    assert pool.kept_bytes == headroom(1 << 15)
    pool.trim(now=float("inf"))
    assert pool.kept_bytes == 0
    again = pool.take(1 << 15)
    assert isinstance(again, np.ndarray) and pool.reused == 0
    del again
    pool.clear()
    assert pool.kept_bytes == 0
