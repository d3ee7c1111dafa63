"""Details of the selected engine: its slots (busy/total, one cell per slot), queue and figures."""

from __future__ import annotations

import time

from rich.text import Text
from tui.model import EngineRow, PoolModel
from tui.format import fmt_age, fmt_bytes, fmt_gpu, fmt_tps
from tui.widgets.panel import TextPanel


def slot_cells(busy: int, total: int, width: int = 32) -> Text:
    """``■`` per busy slot, ``□`` per free one (summarised past ``width`` slots)."""
    if total <= 0:
        return Text("no slots", style="dim")
    if total > width:
        filled = round(width * busy / total)
        return Text("■" * filled, style="bold yellow") + Text("□" * (width - filled), style="dim")
    return Text("■" * busy, style="bold yellow") + Text("□" * max(0, total - busy), style="dim")


class EngineDetail(TextPanel):
    """Everything the admin API says about one engine, slots first."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__("Engine", id=id)
        self.engine: str | None = None

    def show(self, pool: PoolModel, name: str | None) -> None:
        self.engine = name
        row = pool.engines.get(name) if name else None
        if row is None:
            self.border_title = "Engine"
            self.update(Text("no engine selected", style="dim"))
            return
        self.border_title = f"Engine {row.name}"
        self.update(render_detail(pool, row))


def render_detail(pool: PoolModel, row: EngineRow) -> Text:
    t = Text()
    if not row.alive:
        t.append("DEAD", style="bold red")
        t.append(f"  {row.down_reason or ''}\n", style="red")
    t.append("slots ", style="bold")
    t.append_text(slot_cells(row.slots_busy, row.slots_total))
    if row.slots_total:
        t.append(f"  {row.slots_busy}/{row.slots_total} busy  queue {row.queued}/{row.max_queue}")
    t.append("\n")
    t.append("coord ", style="bold")
    t.append(f"in flight {row.inflight}  sessions {row.sessions}")
    if row.configuring:
        t.append(f"  configuring ({row.configuring})", style="yellow")
    t.append("\n")
    t.append("model ", style="bold")
    t.append(f"{row.model or '-'}")
    t.append(f"  n_ctx {row.n_ctx}" if row.n_ctx else "")
    if row.generation:
        t.append(f"  gen {row.generation[:14]}", style="dim")
    t.append("\n")
    if row.role != "solo" or pool.switch_target(row):  # SOLO is the Mode column's default: no line for it
        t.append("mode  ", style="bold")
        t.append(pool.mode_label(row) + "\n")
    if row.loading_model and row.loading_model != row.model:
        t.append("load  ", style="bold yellow")
        pct = "" if row.progress is None else f" {row.progress * 100:.0f}%"
        t.append(f"{row.loading_model}{pct} ({row.stage})\n")
    t.append("speed ", style="bold")
    t.append(f"prefill {fmt_tps(row.prefill_tps)} t/s  decode {fmt_tps(row.decode_tps)} t/s")
    t.append(f"  last load {row.load_seconds:.1f} s\n" if row.load_seconds else "\n")
    t.append("gpu   ", style="bold")
    vram = f"  VRAM {fmt_bytes(row.vram_used)} of {fmt_bytes(row.vram_total)}" if row.vram_total else ""
    t.append(f"{fmt_gpu(row)} ({row.gpu.get('name', '?')}){vram}\n")
    t.append("addr  ", style="bold")
    up = f"  up {fmt_age(time.time() - row.up_since)}" if row.up_since else ""
    t.append(f"http {row.http or '-'}  rpc {row.rpc or '-'}  pid {row.pid or '-'}  v{row.version or '?'}{up}\n")
    if row.models_on_disk:
        t.append("disk  ", style="bold")
        t.append(", ".join(row.models_on_disk) + "\n")
    lc = row.last_configure
    if lc and lc.get("ok") is False:
        t.append("cfg   ", style="bold red")
        t.append(f"{lc.get('why') or 'configure'} → {lc.get('model') or '-'} failed: {str(lc.get('error'))[:200]}\n",
                 style="red")
    if row.last_error:
        t.append("error ", style="bold red")
        t.append(row.last_error[:300] + "\n", style="red")
    t.rstrip()
    return t
