"""Fetching a registry model that this engine's ``models_dir`` lacks, from the pool's coordinator
(``GET /models/files/<name>``, ``hydrad.coordinator.modelfiles``), before the load that needs it.

It runs on the load's own thread (``Loader._load_thread``): never on the event loop, never on the
engine thread, and the generation serving meanwhile keeps serving. What it guarantees:

- **resumable**: bytes go to ``.<file>.hydra-part`` beside the final name; a fetch that stopped (the
  engine was killed, the link cut, the load aborted) leaves them, and the next fetch of the model asks
  for the rest only (``Range: bytes=<size of the partial file>-``);
- **verified**: the SHA-256 of the whole file (the partial's bytes read again, then each new byte as it
  arrives) must be the registry entry's before the file gets its final name; a mismatch deletes the
  partial file and fails the load saying which digests differ. Nothing is ever loaded from a name a
  check has not passed;
- **bounded**: connecting takes at most ``fetch.connect_timeout_s``; a transfer that receives nothing
  for ``fetch.stall_timeout_s`` fails the load; an aborted load (a newer configure) stops the transfer
  within one read; the file lands within ``fetch.models_cache_gib`` (``hydrad.engine.modelcache``);
- **reported**: the load record's ``fetch`` (``/control/loads/<id>``, ``/health``, the heartbeat, so the
  coordinator's records and the console) says bytes, total, rate and ETA about four times a second.
"""

from __future__ import annotations

import hashlib
import http.client
import logging
import os
import shutil
import socket
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterable
from urllib.parse import quote, urlsplit

from hydrad.common import tokenfile
from hydrad.common.logs import log_event
from hydrad.common.registry import ResolvedModel
from hydrad.engine.modelcache import GIB, ModelCache, QuotaExceeded, part_path

log = logging.getLogger("hydrad.fetch")

CHUNK = 1 << 20
REPORT_EVERY_S = 0.25


class FetchError(RuntimeError):
    """The file could not be fetched; the message says why and what to do."""


class FetchAborted(RuntimeError):
    """The load the fetch was for was aborted; the partial file stays for the next fetch."""


class ModelFetcher:
    """The engine's one fetcher: where files come from (``fetch.url``, else the coordinator's FILES offer),
    the token it presents (the pool's bus token, read again for each fetch), and the cache it fills."""

    def __init__(self, settings: Any, models_dir: Path, token_path: Callable[[], Path | None]) -> None:
        self.settings = settings  # FetchSettings
        self.models_dir = models_dir
        self.token_path = token_path
        self.offered: str | None = None  # http://host:port from the coordinator's FILES offer
        self.cache = ModelCache(models_dir, int(settings.models_cache_gib * GIB))
        self._lock = threading.Lock()

    def offer(self, url: str) -> None:
        """The bus link heard FILES: fetch from ``url`` unless ``fetch.url`` says otherwise."""
        if self.offered != url:
            log_event(log, logging.INFO, "the coordinator serves model files", url=url)
        self.offered = url

    @property
    def source(self) -> str | None:
        if not self.settings.enabled:
            return None
        return (self.settings.url or self.offered or "").rstrip("/") or None

    @property
    def can_fetch(self) -> bool:
        return self.source is not None

    def _token(self) -> str | None:
        path = self.token_path()
        if path is None:
            return None
        try:
            return tokenfile.read_token(path)
        except tokenfile.TokenError as exc:
            raise FetchError(f"cannot read the bus token the fetch presents: {exc}") from None

    def fetch(self, resolved: ResolvedModel, report: Callable[[dict[str, Any]], None], abort: threading.Event,
              in_use: Iterable[Path]) -> dict[str, Any]:
        """Fetch ``resolved``'s file to its final path (on the calling thread); the figures of the fetch.
        ``FetchError`` with the reason, ``FetchAborted`` when ``abort`` was set."""
        entry = resolved.entry
        source = self.source
        if entry is None or not entry.sha256 or not entry.size_bytes or source is None:
            raise FetchError(f"model '{resolved.id}' is not on disk and cannot be fetched (no source, or its "
                             "registry entry lacks size_bytes and sha256)")
        with self._lock:
            return self._fetch(resolved, entry.size_bytes, entry.sha256, source, report, abort, in_use)

    def _fetch(self, resolved: ResolvedModel, size: int, sha: str, source: str,
               report: Callable[[dict[str, Any]], None], abort: threading.Event,
               in_use: Iterable[Path]) -> dict[str, Any]:
        final = resolved.path
        part = part_path(final)
        t0 = time.monotonic()
        try:
            evicted = self.cache.make_room(size, final, [*in_use, final])
            have = part.stat().st_size if part.exists() else 0
            if have > size:  # not a prefix of this file: start over
                part.unlink()
                have = 0
            free = shutil.disk_usage(self.models_dir).free
        except QuotaExceeded as exc:
            raise FetchError(str(exc)) from None
        except OSError as exc:
            raise FetchError(f"cannot prepare {final.parent} for the fetch: {exc}") from None
        if free < size - have:
            raise FetchError(f"{final.parent} has {free / GIB:.2f} GiB free; {resolved.id} needs "
                             f"{(size - have) / GIB:.2f} GiB more")
        figures: dict[str, Any] = {"source": source, "total": size, "bytes": have, "resumed_from": have,
                                   "transferred": 0, "bps": None, "eta_s": None, "evicted": evicted}
        log_event(log, logging.INFO, "fetching model", model=resolved.id, source=source, bytes=size,
                  resume_from=have, evicted=",".join(evicted) or "-")
        report(dict(figures))
        digest = hashlib.sha256()
        if have:
            self._hash_prefix(part, have, digest, abort)
        if have < size:
            digest = self._transfer(resolved.id, part, have, size, source, digest, figures, report, abort)
        got = digest.hexdigest()
        if got != sha:
            part.unlink(missing_ok=True)
            raise FetchError(f"the fetched file of '{resolved.id}' has SHA-256 {got}, not the registry's {sha}: "
                             f"the source's copy is not the registry's file; the partial file was deleted")
        try:
            os.replace(part, final)
            self.cache.add(final, size)
        except OSError as exc:
            raise FetchError(f"cannot put the fetched file in place as {final}: {exc}") from None
        figures.update(bytes=size, eta_s=0.0, seconds=round(time.monotonic() - t0, 3))
        report(dict(figures))
        log_event(log, logging.INFO, "model fetched", model=resolved.id, bytes=size,
                  transferred=figures["transferred"], seconds=figures["seconds"])
        return figures

    @staticmethod
    def _hash_prefix(part: Path, have: int, digest: Any, abort: threading.Event) -> None:
        with part.open("rb") as f:
            left = have
            while left > 0:
                if abort.is_set():
                    raise FetchAborted("the load was aborted")
                piece = f.read(min(CHUNK * 4, left))
                if not piece:
                    raise FetchError(f"{part} shrank while it was read")
                digest.update(piece)
                left -= len(piece)

    def _transfer(self, model: str, part: Path, have: int, size: int, source: str, digest: Any,
                  figures: dict[str, Any], report: Callable[[dict[str, Any]], None], abort: threading.Event) -> Any:
        """GET the bytes from ``have`` on into ``part``; the digest of the whole file (a new one when the
        source sent the whole file again)."""
        url = urlsplit(source)
        conn_cls = http.client.HTTPSConnection if url.scheme == "https" else http.client.HTTPConnection
        conn = conn_cls(url.hostname or "127.0.0.1", url.port, timeout=self.settings.connect_timeout_s)
        headers = {"Range": f"bytes={have}-", **tokenfile.bearer(self._token())}
        try:
            try:
                conn.request("GET", f"/models/files/{quote(model, safe='')}", headers=headers)
                if conn.sock is not None:
                    conn.sock.settimeout(self.settings.stall_timeout_s)
                resp = conn.getresponse()
            except (OSError, http.client.HTTPException) as exc:
                raise FetchError(f"cannot reach {source} to fetch '{model}': {exc}") from None
            if resp.status == 200 and have:
                have = 0  # the source ignored the range: the whole file comes again
                digest = hashlib.sha256()
            elif resp.status == 206:
                start = (resp.getheader("Content-Range") or "").removeprefix("bytes ").split("-", 1)[0]
                if start != str(have):
                    raise FetchError(f"{source} answered the range from {start or '?'} instead of {have}")
            elif resp.status != 200:
                body = resp.read(2048).decode("utf-8", "replace")
                raise FetchError(f"{source} refused the file of '{model}' ({resp.status}): {body[:500]}")
            self._receive(resp, part, have, size, digest, figures, report, abort, source)
            return digest
        finally:
            conn.close()

    def _receive(self, resp: http.client.HTTPResponse, part: Path, have: int, size: int, digest: Any,
                 figures: dict[str, Any], report: Callable[[dict[str, Any]], None], abort: threading.Event,
                 source: str) -> None:
        done = have
        window: list[tuple[float, int]] = [(time.monotonic(), done)]  # (time, bytes) over the last seconds: the rate
        last_report = 0.0
        with part.open("r+b" if have else "wb") as f:
            f.seek(have)
            f.truncate()
            while done < size:
                if abort.is_set():
                    raise FetchAborted("the load was aborted")
                try:
                    piece = resp.read(min(CHUNK, size - done))
                except socket.timeout:
                    raise FetchError(f"the transfer from {source} stalled: nothing for "
                                     f"{self.settings.stall_timeout_s:g} s (fetch.stall_timeout_s) at "
                                     f"{done}/{size} bytes; the next load resumes it") from None
                except (OSError, http.client.HTTPException) as exc:
                    raise FetchError(f"the transfer from {source} broke at {done}/{size} bytes: {exc}; the next "
                                     "load resumes it") from None
                if not piece:
                    raise FetchError(f"{source} ended the transfer at {done}/{size} bytes; the next load resumes it")
                f.write(piece)
                digest.update(piece)
                done += len(piece)
                figures["transferred"] += len(piece)
                now = time.monotonic()
                if now - last_report >= REPORT_EVERY_S or done >= size:
                    last_report = now
                    window.append((now, done))
                    while len(window) > 2 and now - window[0][0] > 3.0:
                        window.pop(0)
                    dt = now - window[0][0]
                    bps = (done - window[0][1]) / dt if dt > 0 else None
                    figures.update(bytes=done, bps=round(bps) if bps else None,
                                   eta_s=round((size - done) / bps, 1) if bps else None)
                    report(dict(figures))
            f.flush()
            os.fsync(f.fileno())
