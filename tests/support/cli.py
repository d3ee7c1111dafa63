"""Reading ``hydractl``'s text output in tests."""

from __future__ import annotations


def field(block: str, name: str) -> str:
    """The value of one ``name  value`` line of a hydractl block."""
    for line in block.splitlines():
        key, _, value = line.partition(" ")
        if key == name:
            return value.strip()
    raise AssertionError(f"no {name!r} line in:\n{block}")
