"""The engine's COMBINE role, as every view reports it: solo, head, peer, or both.

Two owners hold the facts: the installed generation's placement says whom this engine borrows
devices from (head), and the ggml-RPC relay knows who holds buffers on this engine's devices
(peer). Neither is copied here; :meth:`Pairing.view` reads both when a view asks, so
``/health``, INFO and the bus heartbeat agree without anything kept in step.
"""

from __future__ import annotations

from typing import Any, Callable

from hydrad.engine.snapshot import EngineSnapshot


class Pairing:
    def __init__(self) -> None:
        self._lending: Callable[[], dict[str, Any]] | None = None

    def lend_through(self, relay_view: Callable[[], dict[str, Any]]) -> None:
        """Where the relay's view comes from (set once the merged port is up)."""
        self._lending = relay_view

    def borrowers(self) -> list[dict[str, Any]]:
        """Heads computing on this engine's devices: ggml-RPC peers that hold buffers here, and a peer
        handed to llama.cpp's server whole (``direct``: its buffers are not seen, its connection is)."""
        if self._lending is None:
            return []
        try:
            peers = self._lending().get("peers") or []
        except Exception:  # a view must never fail because the relay is going away
            return []
        return [p for p in peers if p.get("buffers") or p.get("direct")]

    def view(self, snap: EngineSnapshot) -> dict[str, Any]:
        placement = snap.model.placement if snap.model is not None else None
        lenders = [p["endpoint"] for p in (placement or {}).get("peers", [])]
        borrowers = self.borrowers()
        role = "+".join(r for r, on in (("head", lenders), ("peer", borrowers)) if on) or "solo"
        return {"mode": "combine" if role != "solo" else "solo", "role": role,
                "peers": lenders, "serving": [{"peer": b["peer"], "buffers": b["buffers"], **({"direct": True} if b.get("direct") else {})}
                            for b in borrowers],
                "placement": placement, "standby": snap.standby}
