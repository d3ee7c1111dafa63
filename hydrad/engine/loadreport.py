"""What llama.cpp said about one model load, read from its own log lines: the observed effect of
the load parameters (load mode, kv overrides used or refused, tensors an override placed, buffer
sizes), which the engine reports beside what was asked for."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

_LOAD_MODE_LINE = re.compile(r"\(load_mode = ([^)]+)\)")
_KV_USED = re.compile(r"Using metadata override \(\s*(\w+)\) '([^']*)' = (.*)$")
_KV_BAD = re.compile(r"Bad metadata override type for key '([^']*)', expected (\S+) but got (\S+)")
_OVERRIDDEN = re.compile(r"^tensor (\S+) \(.*\) buffer type overridden to (\S+)$")
_BUFFER = re.compile(r"(\S+) model buffer size = +([\d.]+) MiB")


@dataclass
class LoadReport:
    """What llama.cpp said about one model load, read from its own log lines (every level, the loader
    thread's only): the observed effect of the load parameters, not what was asked for."""

    load_mode: str | None = None  # as llama.cpp resolved it: mmap, none, mlock, mmap+mlock, dio
    kv_applied: dict[str, str] = field(default_factory=dict)  # key -> the value llama.cpp used
    kv_refused: dict[str, str] = field(default_factory=dict)  # key -> why llama.cpp did not use it
    overridden: dict[str, str] = field(default_factory=dict)  # tensor -> the buffer type an override gave it
    buffers: dict[str, int] = field(default_factory=dict)  # buffer type -> bytes of weights in it

    @classmethod
    def parse(cls, text: str) -> "LoadReport":
        rep = cls()
        for line in text.splitlines():
            line = line.strip()
            if (m := _LOAD_MODE_LINE.search(line)) is not None:
                rep.load_mode = m.group(1)
            elif (m := _KV_USED.search(line)) is not None:
                rep.kv_applied[m.group(2)] = m.group(3).strip()
            elif (m := _KV_BAD.search(line)) is not None:
                rep.kv_refused[m.group(1)] = f"llama.cpp reads it as {m.group(2)}, the override is {m.group(3)}"
            elif (m := _OVERRIDDEN.search(line)) is not None:
                rep.overridden[m.group(1)] = m.group(2)
            elif (m := _BUFFER.search(line)) is not None:
                rep.buffers[m.group(1)] = rep.buffers.get(m.group(1), 0) + round(float(m.group(2)) * (1 << 20))
        return rep

    def public(self) -> dict[str, Any]:
        counts: dict[str, int] = {}
        for buft in self.overridden.values():
            counts[buft] = counts.get(buft, 0) + 1
        return {"load_mode": self.load_mode, "buffers": dict(self.buffers), "overridden_tensors": counts,
                "kv_overrides": dict(self.kv_applied)}
