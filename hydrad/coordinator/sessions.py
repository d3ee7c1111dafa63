"""Sessions that outlive their engine: each session's last turn kept in the Store, restored anywhere.

A session (request field ``session_id`` or header ``X-Session-Id``) lives in one engine slot's KV.
When that engine dies, restarts, reloads or drains, the KV is gone and the next turn would prefill
the whole conversation again. The keeper closes that gap:

* **after every turn** of a session (DONE names the slot, how many tokens its KV holds and their
  digest), it reads the slot's state over the engine's merged port (STATE_GET) and puts it in the
  Store, on a worker thread, off the request path. The state's own token list must hash to DONE's
  digest, else the slot has moved on to another request and nothing is kept. Only the newest turn
  of a session is queued (a turn finishing while the previous one is still being read replaces it);
* **before a turn** that routing sends to an engine which does not hold the session (its engine
  is gone, or routing chose another), it puts the kept state into an idle slot of the chosen
  engine (STATE_PUT, which refuses an incompatible state before any byte moves) and pins the
  request to that slot: the engine reuses the KV and prefills only the new messages. Any failure
  (no idle slot, another model, a corrupt chunk, a timeout) just means an ordinary turn: the
  request never fails because of the keeper;
* the index (session → object) is kept beside the Store, one small file per session written
  atomically, so a restarted coordinator still finds its sessions.

One owner: the keeper's index is touched on the event loop only; the worker thread does I/O and
hands results back through ``call_soon_threadsafe``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import xxhash
from pydantic import BaseModel, ConfigDict, Field

from hydrad.common.logs import log_event
from hydrad.common.tokenfile import read_token
from hydrad.coordinator.affinity import Affinity, Latest
from hydrad.coordinator.kvmove import Moved, Placements, stream_slot
from hydrad.coordinator.records import EngineRecord
from hydrad.store import Store, StoreError, StoreSettings
from hydrad.store.files import atomic_write
from hydrad.wire import events
from hydrad.wire import messages as M
from hydrad.wire.kvdigest import tokens_digest
from hydrad.wire.rpcclient import RpcClient, RpcError

log = logging.getLogger("hydra.coordinator.sessions")


def default_store_dir() -> Path | None:
    """Under systemd the coordinator's RuntimeDirectory= (tmpfs, the service's own, kept across
    restarts by RuntimeDirectoryPreserve=restart), else None: the pool's directory (hydrad/store/settings.py)."""
    run = os.environ.get("RUNTIME_DIRECTORY")
    return Path(run.split(":")[0]) / "store" if run else None


class SessionSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    keep: bool = Field(True, description="Keep each session's last turn in the Store and restore it on whichever "
                                         "engine serves the next turn when its own engine lost it.")
    store: StoreSettings = Field(default_factory=lambda: StoreSettings(dir=default_store_dir()),
                                 description="The Store the sessions are kept in (default dir: the service's "
                                             "runtime directory under systemd, else the pool's directory, "
                                             "<root>/hydra-store/<pool>).")
    engine_token_file: Path | None = Field(None, description="File holding the engines' control token (their "
                                                             "rpc.token_file), for STATE_GET/STATE_PUT on engines "
                                                             "that require one.")
    io_timeout_s: float = Field(30.0, gt=0, le=3600, description="Longest wait on an engine's merged port while "
                                                                 "keeping or restoring a session.")
    restore_timeout_s: float = Field(10.0, gt=0, le=3600, description="Longest a turn waits for its session's "
                                                                      "restore; past it the turn prefills as usual.")
    max_sessions: int = Field(10_000, ge=1, le=10_000_000, description="Sessions kept; the least recently "
                                                                       "used is forgotten first.")


@dataclass
class Kept:
    key: str
    n_tokens: int
    model: str
    at: float
    engine: str = ""  # where the turn's KV still lives (the slot DONE named), for a move engine to engine
    slot: int | None = None
    kv_hash: str = ""


@dataclass
class Restored:
    slot: int
    n_tokens: int
    seconds: float


class SessionKeeper:
    def __init__(self, settings: SessionSettings, engines: Mapping[str, EngineRecord],
                 publish: Callable[..., None] | None = None, places: Affinity | None = None) -> None:
        """``places``: the coordinator's one record of where sessions' KV lives (the front door's
        :class:`~hydrad.coordinator.affinity.Affinity`); the keeper owns only what the Store keeps."""
        self.settings = settings
        self.places = places if places is not None else Affinity()
        self.engines = engines
        self.publish = publish or (lambda *a, **k: None)
        self.store = Store(settings.store)
        self.token = read_token(settings.engine_token_file) if settings.engine_token_file else None
        self._index: OrderedDict[str, Kept] = OrderedDict()
        # session -> newest turn waiting to be kept: (engine, DONE, its tenant's Store owner and quota)
        self._pending: dict[str, tuple[str, events.Done | M.Done, str, int]] = {}
        self._running: set[str] = set()
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="hydra-sessions")
        self.placements = Placements()  # shared with the front door's split: one placement per engine at a time
        self._loop: asyncio.AbstractEventLoop | None = None
        self.stats = {"kept": 0, "keep_skipped": 0, "keep_failed": 0, "restored": 0, "restore_failed": 0,
                      "moved": 0}
        self._dir = self.store.dir / "sessions"
        self._dir.mkdir(exist_ok=True)
        self._load_index()

    # ----- the index, kept beside the store ---------------------------------------------------

    @staticmethod
    def _file_name(session: str) -> str:
        return xxhash.xxh3_64_hexdigest(session.encode()) + ".json"

    def _load_index(self) -> None:
        rows = []
        for f in self._dir.glob("*.json"):
            try:
                d = json.loads(f.read_bytes())
                rows.append((float(d["at"]), str(d["session"]), Kept(str(d["key"]), int(d["n_tokens"]),
                                                                     str(d.get("model") or ""), float(d["at"]))))
            except (OSError, ValueError, KeyError, TypeError):
                log_event(log, logging.WARNING, "unreadable session index entry ignored", file=f.name)
        for _, session, kept in sorted(rows, key=lambda r: r[0]):
            self._index[session] = kept
        if rows:
            log_event(log, logging.INFO, "sessions found in the store", sessions=len(rows), dir=str(self.store.dir))

    def _write_entry(self, session: str, kept: Kept | None) -> None:
        path = self._dir / self._file_name(session)
        if kept is None:
            path.unlink(missing_ok=True)
            return
        body = json.dumps({"session": session, "key": kept.key, "n_tokens": kept.n_tokens, "model": kept.model,
                           "at": kept.at}).encode()
        atomic_write(path, body, self.store.dir / "tmp", fsync=self.settings.store.fsync)

    def kept_tokens(self, session: str, model: str | None) -> int:
        """Tokens of ``session`` kept for ``model`` (routing counts them as lukewarm), else 0."""
        kept = self._index.get(session)
        return kept.n_tokens if kept is not None and model is not None and kept.model == model else 0

    def has(self, session: str | None) -> bool:
        """The session has a turn kept in the Store."""
        return bool(session) and session in self._index

    def knows(self, session: str | None) -> bool:
        """The session has a turn kept, or a newest turn whose KV may still be in its slot."""
        return session is not None and session != "" and (session in self._index
                                                            or self.places.latest(session) is not None)

    def public(self) -> dict[str, Any]:
        return {"sessions": len(self._index), "queued": len(self._pending), **self.stats}

    # ----- after a turn: keep it --------------------------------------------------------------

    def after_turn(self, session: str | None, engine: str, done: events.Done | M.Done | None,
                   owner: str = "", quota: int = 0) -> None:
        """A session's turn finished on ``engine``: queue a snapshot of its slot (newest turn wins)."""
        if not session or done is None or done.slot is None or not done.kv_hash:
            return
        self.places.turn_ended(session, engine, done.slot, done.kv_hash, done.model)
        self._loop = asyncio.get_running_loop()
        self._pending[session] = (engine, done, owner, quota)
        if session not in self._running:
            self._start(session)

    def _start(self, session: str) -> None:
        engine, done, owner, quota = self._pending.pop(session)
        rec = self.engines.get(engine)
        if rec is None or not rec.alive or not rec.info.rpc:
            self.stats["keep_skipped"] += 1
            return
        self._running.add(session)
        fut = self._pool.submit(self._keep, session, engine, rec.info.rpc, done, owner, quota)
        fut.add_done_callback(lambda f: self._loop.call_soon_threadsafe(self._kept, session, engine, f))  # type: ignore[union-attr]

    def _keep(self, session: str, engine: str, address: str, done: events.Done | M.Done, owner: str = "",
              quota: int = 0) -> tuple[str, Kept | None, Kept | None]:
        """Worker thread: STATE_GET the slot, check it still holds the turn, put it in the store as the
        tenant's object (``owner``, held to its ``quota``)."""
        t0 = time.monotonic()
        with RpcClient(address, self.token, timeout=self.settings.io_timeout_s) as c:
            for attempt in range(3):  # a slot busy right after DONE may be the next turn of this very session
                try:
                    meta, data = c.state_get_bytes(int(done.slot))  # type: ignore[arg-type]
                    break
                except RpcError as exc:
                    if exc.code != "conflict":
                        raise
                    if attempt == 2:  # still busy: that turn's own DONE queues a newer keep
                        return "busy", None, None
                    time.sleep(0.05)
        tokens = meta.get("tokens") or []
        if len(tokens) != done.kv_tokens or tokens_digest(tokens) != done.kv_hash:
            return "moved", None, None
        key = self.store.put(meta, data, owner=owner, quota=quota)
        kept = Kept(key, len(tokens), done.model, time.time(), engine, done.slot, done.kv_hash)  # model: the alias served
        self._write_entry(session, kept)
        log_event(log, logging.DEBUG, "session kept", session=session, tokens=len(tokens), bytes=len(data),
                  seconds=round(time.monotonic() - t0, 4))
        return "kept", kept, None

    def _kept(self, session: str, engine: str, fut: Any) -> None:
        self._running.discard(session)
        try:
            outcome, kept, _ = fut.result()
        except (OSError, RpcError, StoreError, ValueError) as exc:
            self.stats["keep_failed"] += 1
            log_event(log, logging.WARNING, "session not kept", session=session, engine=engine, error=str(exc))
            outcome, kept = "failed", None
        except Exception as exc:  # never let a keeper bug reach the event loop
            self.stats["keep_failed"] += 1
            log.exception("session keeper failed: %s", exc)
            outcome, kept = "failed", None
        if outcome in ("moved", "busy"):
            self.stats["keep_skipped"] += 1
        if kept is not None:
            self.stats["kept"] += 1
            old = self._index.pop(session, None)
            self._index[session] = kept
            self._drop_unused(old, kept)
            while len(self._index) > self.settings.max_sessions:
                gone, entry = self._index.popitem(last=False)
                self._pool.submit(self._write_entry, gone, None)
                self._drop_unused(entry, None)
            self.publish("session.kept", session=session, engine=engine, tokens=kept.n_tokens)
        if session in self._pending:
            self._start(session)

    def _drop_unused(self, old: Kept | None, new: Kept | None) -> None:
        """The previous turn's object, unless another session (or this one's new turn) uses it."""
        if old is None or (new is not None and old.key == new.key):
            return
        if any(k.key == old.key for k in self._index.values()):
            return
        self._pool.submit(self._delete, old.key)

    def _delete(self, key: str) -> None:
        try:
            self.store.delete(key)
        except (OSError, StoreError) as exc:
            log_event(log, logging.WARNING, "old session object not deleted", key=key, error=str(exc))

    # ----- before a turn: restore it ----------------------------------------------------------

    async def restore(self, session: str, engine: str) -> Restored | None:
        """Put the session's kept state into an idle slot of ``engine``; the slot, or None (then the
        turn simply prefills). Bounded by ``restore_timeout_s``."""
        kept = self._index.get(session)
        rec = self.engines.get(engine)
        if kept is None or rec is None or not rec.info.rpc:
            return None
        self._index.move_to_end(session)
        loop = asyncio.get_running_loop()
        try:
            async with self.placements.lock(engine):
                fut = loop.run_in_executor(self._pool, self._restore, rec.info.rpc, kept)
                restored = await asyncio.wait_for(asyncio.shield(fut), self.settings.restore_timeout_s)
        except asyncio.TimeoutError:
            self.stats["restore_failed"] += 1
            log_event(log, logging.WARNING, "session restore too slow; the turn prefills", session=session,
                      engine=engine, timeout_s=self.settings.restore_timeout_s)
            return None
        except StoreError as exc:  # evicted, or a chunk found damaged (and removed): it cannot come back
            self.stats["restore_failed"] += 1
            log_event(log, logging.WARNING, "kept session unusable; forgotten, the turn prefills", session=session,
                      engine=engine, error=str(exc))
            if self._index.get(session) is kept:
                self.forget(session)
            return None
        except (OSError, RpcError, ValueError) as exc:
            self.stats["restore_failed"] += 1
            log_event(log, logging.INFO, "session not restored; the turn prefills", session=session, engine=engine,
                      error=str(exc))
            return None
        if restored is None:
            self.stats["restore_failed"] += 1
            log_event(log, logging.INFO, "session not restored: no idle slot", session=session, engine=engine)
            return None
        self.stats["restored"] += 1
        self.places.placed(session, engine, restored.slot, kept.kv_hash, kept.model, foreign=self.token is None,
                           pin=False)
        log_event(log, logging.INFO, "session restored", session=session, engine=engine, slot=restored.slot,
                  tokens=restored.n_tokens, seconds=round(restored.seconds, 4))
        self.publish("session.restored", session=session, engine=engine, slot=restored.slot,
                     tokens=restored.n_tokens, seconds=round(restored.seconds, 4))
        return restored

    def _restore(self, address: str, kept: Kept) -> Restored | None:
        t0 = time.monotonic()
        meta, data = self.store.get(kept.key)
        with RpcClient(address, self.token, timeout=self.settings.io_timeout_s) as c:
            slots = c.info().get("slots") or []
            # an empty idle slot first, then the idle one holding the least (its KV is the cheapest to lose)
            idle = sorted((s for s in slots if not s.get("busy")), key=lambda s: (s.get("n_tokens") or 0, s["id"]))
            for s in idle:
                try:
                    r = c.state_put(int(s["id"]), meta, data)
                except RpcError as exc:
                    if exc.code == "conflict":  # taken meanwhile: the next idle one
                        continue
                    raise
                return Restored(int(r.get("slot", s["id"])), int(r.get("n_tokens", kept.n_tokens)),
                                time.monotonic() - t0)
        return None

    # ----- engine to engine: before an engine reloads or stops --------------------------------

    def model_of(self, session: str) -> str | None:
        at, kept = self.places.latest(session), self._index.get(session)
        return at.model if at is not None else kept.model if kept is not None else None

    async def move(self, session: str, dst: str) -> Moved | None:
        """Stream the session's KV from the slot it was left in straight into an idle slot of ``dst``
        (merged ports, no Store in between), checked against the turn's digest; the next turn on
        ``dst`` is pinned to that slot (:meth:`pinned`). None when the KV is no longer there."""
        at = self.places.latest(session)
        src = self.engines.get(at.engine) if at is not None else None
        target = self.engines.get(dst)
        if at is None or src is None or not src.info.rpc or target is None or not target.info.rpc:
            return None
        if src.status.model != at.model:  # the engine reloaded another model since: the slot's KV is gone
            return None
        loop = asyncio.get_running_loop()
        try:
            async with self.placements.lock(dst):
                moved = await asyncio.wait_for(asyncio.shield(loop.run_in_executor(
                    self._pool, self._move, src.info.rpc, at, target.info.rpc)), self.settings.io_timeout_s)
        except RpcError as exc:
            if exc.code == "conflict":  # a turn of it runs there now; the next turn moves what that one leaves
                log_event(log, logging.INFO, "session not moved yet: a turn of it is running",
                          session=session, src=at.engine, dst=dst)
            else:
                log_event(log, logging.WARNING, "session not moved; its next turn restores it from the store",
                          session=session, src=at.engine, dst=dst, error=str(exc))
            return None
        except (asyncio.TimeoutError, OSError, ValueError) as exc:
            log_event(log, logging.WARNING, "session not moved; its next turn restores it from the store",
                      session=session, src=at.engine, dst=dst, error=str(exc) or "timeout")
            return None
        if moved is None:
            return None
        self.places.placed(session, dst, moved.slot, at.kv_hash, at.model, foreign=self.token is None, pin=True)
        kept = self._index.get(session)
        if kept is not None and kept.kv_hash == at.kv_hash:
            kept.engine, kept.slot = dst, moved.slot
        self.stats["moved"] += 1
        log_event(log, logging.INFO, "session moved", session=session, dst=dst, slot=moved.slot,
                  tokens=moved.n_tokens, seconds=round(moved.seconds, 4))
        self.publish("session.moved", session=session, dst=dst, slot=moved.slot, tokens=moved.n_tokens,
                     seconds=round(moved.seconds, 4))
        return moved

    def _move(self, src: str, at: Latest, dst: str) -> Moved | None:
        return stream_slot(src, at.slot, dst, self.token, self.settings.io_timeout_s, digest=at.kv_hash)

    def forget(self, session: str) -> None:
        self.places.forget_latest(session)
        kept = self._index.pop(session, None)
        self._pool.submit(self._write_entry, session, None)
        self._drop_unused(kept, None)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


__all__ = ["Kept", "Restored", "SessionKeeper", "SessionSettings", "default_store_dir"]
