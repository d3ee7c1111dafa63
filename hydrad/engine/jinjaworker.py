"""The process chat templates are rendered in (``python -m hydrad.engine.jinjaworker MEMORY_BYTES``),
started and fed by :mod:`hydrad.engine.jinjabox`.

It limits its own address space to ``MEMORY_BYTES`` before it reads anything, so a template that
builds a string of a gigabyte meets a ``MemoryError`` here, not the engine's memory. Requests and
answers are JSON, each preceded by its length (4 bytes, big-endian), on stdin and stdout. A request
is ``{"template", "messages", "tools", "bos", "eos", "max_chars", "kwargs"}``; the answer ``{"text": ...}`` or
``{"error": ...}``. After a ``MemoryError`` it answers and ends (the parent starts another).
"""

from __future__ import annotations

import json
import resource
import sys
from typing import Any, BinaryIO

from hydrad.engine.jinja import TemplateFailed, render


def _read(inp: BinaryIO) -> dict[str, Any] | None:
    head = inp.read(4)
    if len(head) < 4:
        return None
    body = inp.read(int.from_bytes(head, "big"))
    return json.loads(body)


def _write(out: BinaryIO, reply: dict[str, Any]) -> None:
    data = json.dumps(reply, ensure_ascii=False).encode("utf-8", "surrogatepass")
    out.write(len(data).to_bytes(4, "big") + data)
    out.flush()


def main(argv: list[str]) -> int:
    limit = int(argv[1])
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    inp, out = sys.stdin.buffer, sys.stdout.buffer
    while True:
        req = _read(inp)
        if req is None:
            return 0
        try:
            _write(out, {"text": render(req["template"], req["messages"], req["tools"], req["bos"], req["eos"],
                                        req["max_chars"], req.get("kwargs"), req.get("agp", True))})
        except TemplateFailed as exc:
            _write(out, {"error": str(exc)})
        except MemoryError:
            _write(out, {"error": "memory"})
            return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
