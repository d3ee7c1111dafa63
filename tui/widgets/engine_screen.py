"""One engine in full (Enter on the engines table): its slots, its effective parameters with the
layer and tier each comes from, and its recent events.

The slots and parameters come from the engine itself (``GET /slots``, ``GET /control/config`` at
the HTTP address the admin API lists), fetched by a thread worker when the screen opens, every
few seconds while it is shown, and on ``r``; everything else is the console's
:class:`~tui.model.PoolModel`, re-rendered by the app as it changes.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any, Callable, ClassVar

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Header, Static

from tui.model import EngineRow, PoolModel
from tui.format import fmt_bytes, fmt_clock, fmt_gpu, fmt_load, fmt_tps

SOURCE_ORDER = {"runtime": 0, "yaml": 1, "model": 2, "default": 3}


@dataclass
class EngineDetails:
    """What one fetch from the engine's own HTTP API gave (an error text where a part failed)."""

    url: str | None
    config: dict[str, Any] | None = None
    config_error: str | None = None
    slots: list[dict[str, Any]] | None = None
    slots_error: str | None = None
    fetched_at: float = 0.0


Fetcher = Callable[[str], EngineDetails]  # engine name → details; blocking, run in a thread worker


def _value(v: Any) -> str:
    text = v if isinstance(v, str) else json.dumps(v)
    return text if len(text) <= 40 else text[:39] + "…"


class EngineScreen(Screen[None]):
    """The selected engine's slots, parameters (value, source layer, tier) and recent events."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "back", "Back"),
        Binding("r", "refetch", "Refetch"),
    ]
    """
    | Key(s) | Description |
    | :- | :- |
    | escape | Back to the pool. |
    | r | Fetch the engine's slots and parameters now. |
    """

    DEFAULT_CSS = """
    EngineScreen #summary {
        height: auto;
        padding: 0 1;
    }
    EngineScreen #body {
        height: 1fr;
    }
    EngineScreen #left {
        width: 1fr;
    }
    EngineScreen #slots-box {
        height: auto;
        max-height: 14;
        border: round $primary-darken-2;
        border-title-color: $text-muted;
    }
    EngineScreen #slots {
        height: auto;
        max-height: 10;
    }
    EngineScreen #sessions {
        height: auto;
        padding: 0 1;
    }
    EngineScreen #events {
        height: 1fr;
        min-height: 4;
        border: round $primary-darken-2;
        border-title-color: $text-muted;
        padding: 0 1;
    }
    EngineScreen #params-box {
        width: 1fr;
        border: round $primary-darken-2;
        border-title-color: $text-muted;
    }
    EngineScreen #params {
        height: 1fr;
    }
    EngineScreen #params-msg {
        height: auto;
        padding: 0 1;
    }
    EngineScreen.-narrow #body {
        layout: vertical;
    }
    EngineScreen.-narrow #left {
        layout: horizontal;
        width: 100%;
        height: 11;
    }
    EngineScreen.-narrow #slots-box {
        width: 1fr;
        height: 100%;
        max-height: 100%;
    }
    EngineScreen.-narrow #events {
        width: 1fr;
        height: 100%;
    }
    EngineScreen.-narrow #params-box {
        width: 100%;
        height: 1fr;
        min-height: 5;
    }
    """

    class Fetched(Message):
        def __init__(self, details: EngineDetails) -> None:
            super().__init__()
            self.details = details

    def __init__(self, engine: str, pool: PoolModel, fetch: Fetcher, *, every_s: float = 2.0) -> None:
        super().__init__()
        self.engine = engine
        self.pool = pool
        self.fetch = fetch
        self.every_s = max(0.5, every_s)
        self.details: EngineDetails | None = None
        self.fetches = 0  # answers received (the tests wait on it)
        self.param_rows: dict[str, tuple[str, str, str]] = {}  # name → (value, source, tier) as shown
        self.slot_rows: list[tuple[str, ...]] = []  # as shown
        self.params_message = ""
        self._tables_ready = False  # on_mount gives the tables their columns, then shows the newest pool
        self._summary = Static("", id="summary")
        self._slots = DataTable[Text](id="slots", cursor_type="none", zebra_stripes=False)
        self._sessions = Static("", id="sessions")
        self._events = Static("", id="events-text")
        self._params = DataTable[Text](id="params", cursor_type="row")
        self._params_msg = Static("fetching GET /control/config…", id="params-msg")

    def compose(self) -> ComposeResult:
        yield Header(show_clock=False, icon="≋")
        yield self._summary
        with Horizontal(id="body"):
            with Vertical(id="left"):
                with Vertical(id="slots-box") as box:
                    box.border_title = "Slots (GET /slots)"
                    yield self._slots
                    yield self._sessions
                with VerticalScroll(id="events") as ev:
                    ev.border_title = "Recent events"
                    yield self._events
            with Vertical(id="params-box") as pb:
                pb.border_title = "Parameters (GET /control/config)"
                yield self._params_msg
                yield self._params
        yield Footer()

    def on_mount(self) -> None:
        self.sub_title = f"engine {self.engine}"
        self._slots.add_column("Slot", key="slot")
        self._slots.add_column("State", key="state")
        self._slots.add_column("KV tok", key="tokens")
        self._slots.add_column("Decoded", key="decoded")
        self._slots.add_column("tok/s", key="tps")
        self._params.add_column("Parameter", key="name")
        self._params.add_column("Value", key="value")
        self._params.add_column("Source", key="source")
        self._params.add_column("Tier", key="tier")
        self._params.display = False
        self._tables_ready = True
        self.show(self.pool)
        self._fetch()
        self.set_interval(self.every_s, self._fetch)
        self._params.focus()

    # ----- fetching --------------------------------------------------------------------

    @work(thread=True, group="engine-detail", exclusive=True, exit_on_error=False)
    def _fetch(self) -> None:
        try:
            details = self.fetch(self.engine)
        except Exception as exc:  # a fetcher bug must not end the console
            details = EngineDetails(None, config_error=f"{type(exc).__name__}: {exc}",
                                    slots_error=f"{type(exc).__name__}: {exc}")
        details.fetched_at = time.time()
        self.post_message(self.Fetched(details))

    def on_engine_screen_fetched(self, msg: Fetched) -> None:
        self.details = msg.details
        self.fetches += 1
        self._show_params(msg.details)
        self.show(self.pool)

    def action_refetch(self) -> None:
        self._fetch()

    def action_back(self) -> None:
        self.dismiss(None)

    # ----- rendering -------------------------------------------------------------------

    def show(self, pool: PoolModel) -> None:
        """Re-render from the pool model (the app calls this as events and snapshots arrive, which may be
        between the screen's push and its mount: then only the model is kept, and on_mount shows it)."""
        self.pool = pool
        if not self._tables_ready:
            return
        row = pool.engines.get(self.engine)
        self._summary.update(self._summary_text(row))
        self._show_slots(row)
        self._show_sessions(row)
        lines = pool.recent.get(self.engine) or ()
        t = Text()
        for ts, line in lines:
            t.append(fmt_clock(ts) + " ", style="dim")
            t.append(line + "\n", style="red" if "DOWN" in line or "FAILED" in line else "")
        t.rstrip()
        self._events.update(t if lines else Text("no events for this engine yet", style="dim"))
        for events in self.query("#events").results(VerticalScroll):  # none once the screen is dismissed and
            events.scroll_end(animate=False)  # a fetch it started still answers

    def _summary_text(self, row: EngineRow | None) -> Text:
        t = Text()
        if row is None:
            t.append(f"{self.engine}: no longer known to the coordinator", style="bold red")
            return t
        t.append(row.name, style="bold")
        if row.alive:
            t.append(f"  {row.stage}", style="bold")
        else:
            t.append("  DEAD", style="bold red")
            t.append(f" ({row.down_reason or 'down'})", style="red")
        t.append(f"  {row.model or '(no model)'}  {self.pool.mode_label(row)}")
        if row.n_ctx:
            t.append(f"  n_ctx {row.n_ctx}")
        t.append("\n")
        vram = f"  VRAM {fmt_bytes(row.vram_used)} of {fmt_bytes(row.vram_total)}" if row.vram_total else ""
        t.append(f"{fmt_gpu(row)}{vram}  decode {fmt_tps(row.decode_tps)} t/s  prefill {fmt_tps(row.prefill_tps)} t/s")
        if row.in_load:
            t.append("\n")
            t.append("load ", style="bold")
            t.append(f"{row.phase} → {row.loading_model or row.model or '?'}  {fmt_load(self.pool, row)}")
        if row.last_error:
            t.append("\n")
            t.append("error ", style="bold red")
            t.append(row.last_error[:200], style="red")
        return t

    def _show_slots(self, row: EngineRow | None) -> None:
        table = self._slots
        table.clear()
        rows: list[tuple[str, ...]] = []
        d = self.details
        if d is not None and d.slots is not None and (row is None or row.alive):
            for sl in d.slots:
                busy = bool(sl.get("is_processing"))
                decoded = sl.get("n_decoded")
                tps = sl.get("decode_tps")
                rows.append((str(sl.get("id", "?")), "busy" if busy else "idle", str(sl.get("n_tokens", "-")),
                             str(decoded) if busy and decoded is not None else "-",
                             fmt_tps(tps) if busy and isinstance(tps, (int, float)) else "-"))
        elif row is not None and row.slots_total:  # the admin API's count only: states without tokens
            for i in range(row.slots_total):
                rows.append((str(i), "busy" if i < row.slots_busy else "idle", "-", "-", "-"))
        self.slot_rows = rows
        for r in rows:
            table.add_row(*(Text(c, style="bold" if c == "busy" else "") for c in r))
        found = self.query("#slots-box")
        if not found:  # the screen is still composing or already being removed: its box comes or goes
            return
        box = found.first(Vertical)
        if d is not None and d.slots_error:
            box.border_subtitle = "counts from the coordinator"
        else:
            box.border_subtitle = ""

    def _show_sessions(self, row: EngineRow | None) -> None:
        t = Text()
        if row is not None:
            t.append(f"busy {row.slots_busy}/{row.slots_total}  queue {row.queued}/{row.max_queue}  "
                     f"in flight {row.inflight}  sessions {row.sessions}")
        seen = self.pool.sessions_seen.get(self.engine) or {}
        if seen:
            recent = sorted(seen, key=lambda s: seen[s], reverse=True)[:6]
            t.append("\nsessions routed here: " + ", ".join(recent))
        self._sessions.update(t)

    def _show_params(self, d: EngineDetails) -> None:
        if d.config is None:
            self.params_message = d.config_error or "no answer"
            if d.url is None:
                self.params_message = d.config_error or "the coordinator lists no HTTP address for this engine"
            self._params_msg.update(Text(self.params_message, style="bold yellow"))
            self._params_msg.display = True
            self._params.display = False
            return
        params = d.config.get("params") or {}
        items = sorted(((n, p) for n, p in params.items() if isinstance(p, dict)),
                       key=lambda kv: (SOURCE_ORDER.get(str(kv[1].get("source")), 9), kv[0]))
        shown: dict[str, tuple[str, str, str]] = {}
        table = self._params
        table.clear()
        for name, p in items:
            cells = (_value(p.get("value")), str(p.get("source") or "?"), str(p.get("tier") or "?"))
            shown[name] = cells
            style = "" if cells[1] == "default" else "bold"
            table.add_row(Text(name, style=style), Text(cells[0], style=style), Text(cells[1]), Text(cells[2]))
        self.param_rows = shown
        model = d.config.get("model") or "(no model)"
        self.params_message = f"{len(shown)} parameters, model {model}, from {d.url}"
        self._params_msg.update(Text(self.params_message, style="dim"))
        self._params_msg.display = True
        self._params.display = True
