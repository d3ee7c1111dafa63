"""Small text helpers the ``hydractl`` commands share: percentages, sizes, rates, aligned tables."""

from __future__ import annotations

from typing import Any


def percent(progress: Any) -> str:
    return f"{float(progress) * 100:.0f}%"


def mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


def gib(n: Any) -> str:
    return f"{int(n) / (1 << 30):.1f} GiB" if isinstance(n, int) else "?"


def throughput(n_bytes: int, seconds: float) -> str:
    return f"{n_bytes / 1e6 / seconds:.0f} MB/s" if seconds > 0 else "- MB/s"


def table(rows: list[tuple[str, ...]]) -> list[str]:
    """Left-aligned columns two spaces apart; the first row is the header."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(f"{cell:<{widths[i]}}" for i, cell in enumerate(r)).rstrip() for r in rows]


def yes(flag: Any) -> str:
    return "yes" if flag else "no"
