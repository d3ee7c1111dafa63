"""The engine core's own state: the snapshot every view renders from, the methods that change it,
and the one awaitable "load ended". A real core without a model (no llama.cpp work)."""

from __future__ import annotations

import asyncio
import threading

from hydrad.engine.core import EngineCore
from hydrad.engine.loader import LoadRecord
from hydrad.engine.snapshot import EngineSnapshot, ModelSummary, status_text


def test_load_record_wait_returns_once_the_load_has_ended() -> None:
    async def scenario() -> tuple[bool, str, str]:
        rec = LoadRecord(1, "m")
        waiter = asyncio.create_task(rec.wait())
        await asyncio.sleep(0.05)
        pending = not waiter.done()

        def end() -> None:
            rec.phase = "aborted"
            rec.end()

        threading.Thread(target=end).start()
        ended = await asyncio.wait_for(waiter, 5)
        again = await asyncio.wait_for(rec.wait(), 1)  # an ended load answers at once
        return pending, ended.phase, again.phase

    pending, phase, again = asyncio.run(scenario())
    assert pending and phase == again == "aborted"


def test_the_snapshot_follows_the_core_and_only_its_methods_change_it() -> None:
    async def scenario() -> list[EngineSnapshot]:
        core = EngineCore(max_queue=7, device="0")
        seen = [core.snapshot()]
        core.start(asyncio.get_running_loop())
        seen.append(core.snapshot())
        core.record_error("boom")
        seen.append(core.snapshot())
        core.stop_admitting()
        seen.append(core.snapshot())
        core.stop()
        await asyncio.to_thread(core.join, 10)
        seen.append(core.snapshot())
        return seen

    before, started, errored, stopping, stopped = asyncio.run(scenario())
    assert (before.stage, before.alive) == ("starting", False)
    assert (started.stage, started.alive, started.admitting) == ("idle", True, True)
    assert started.slots == {"busy": 0, "total": 0, "queued": 0} and started.max_queue == 7
    assert started.device == "0" and started.model is None and started.load_id is None
    assert errored.last_error == "boom" and started.last_error is None  # each snapshot is frozen
    assert (stopping.stage, stopping.admitting) == ("stopping", False)
    assert not stopped.alive


def test_status_text() -> None:
    model = ModelSummary(id="gemma3-270m", path="/m.gguf", arch="gemma3", desc="", n_params=1, size_bytes=1,
                         n_layer=1, n_embd=1, n_head_kv=1, n_ctx_train=1, n_vocab=1, fingerprint="f", family="k",
                         generation="g", loaded_at=0.0, n_ctx=4096, n_parallel=4, n_ctx_slot=4096)
    assert status_text(EngineSnapshot(stage="idle")) == "idle"
    loading = EngineSnapshot(stage="reloading", progress=0.5, model=model, slots_busy=1, slots_total=4)
    assert status_text(loading) == "reloading 50% model=gemma3-270m slots=1/4"
    assert status_text(loading, with_progress=False) == "reloading model=gemma3-270m slots=1/4"
    assert status_text(EngineSnapshot(stage="ready", progress=1.0)) == "ready"  # progress only while loading
