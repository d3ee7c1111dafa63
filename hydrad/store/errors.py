"""The store's errors: one base class, so callers (the CLI, later the coordinator) catch one type."""

from __future__ import annotations


class StoreError(Exception):
    """The store refused an operation (unknown object, too large for the cap, bad directory)."""


class CorruptChunk(StoreError):
    """A chunk's bytes no longer hash to its name, or the chunk is missing: the object is refused
    rather than handing an engine a KV state that is silently wrong."""

    def __init__(self, chunk: str, why: str, key: str | None = None) -> None:
        self.chunk, self.why, self.key = chunk, why, key
        where = f" of object {key}" if key else ""
        super().__init__(f"chunk {chunk}{where} is {why}; the object is refused")
