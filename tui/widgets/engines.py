"""The engines table: one row per engine, dead ones dimmed red, loads with their percentage."""

from __future__ import annotations

from typing import ClassVar

from rich.text import Text
from textual.binding import Binding, BindingType
from textual.message import Message
from textual.widgets import DataTable

from tui.state import EngineRow, PoolState, fmt_age, fmt_gpu, fmt_tps, fmt_vram

COLUMNS: tuple[tuple[str, str], ...] = (
    ("engine", "Engine"), ("gpu", "GPU"), ("vram", "VRAM"), ("stage", "Stage"), ("model", "Model"),
    ("mode", "Mode"), ("slots", "Slots"), ("queue", "Queue"), ("decode", "Dec t/s"), ("hb", "HB"),
)

STAGE_STYLES = {"ready": "bold green", "reloading": "yellow", "loading_model": "yellow", "warming": "yellow",
                "idle": "cyan", "starting": "cyan", "stopping": "magenta"}


class EnginesTable(DataTable[Text]):
    """The pool's engines, sorted by name; the highlighted row is the selected engine.

    Dead engines (an ``engine.down`` event, or ``alive: false`` from the admin API) keep their
    row, dimmed red with the stage ``DEAD``, so an operator sees what is missing.
    """

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("up", "cursor_up", "Prev engine", key_display="↑"),
        Binding("down", "cursor_down", "Next engine", key_display="↓"),
    ]
    """
    | Key(s) | Description |
    | :- | :- |
    | up | Select the engine above. |
    | down | Select the engine below. |
    """

    DEFAULT_CSS = """
    EnginesTable {
        height: auto;
        max-height: 14;
        border: round $primary-darken-2;
        border-title-color: $text-muted;
    }
    EnginesTable:focus {
        border: round $primary;
    }
    """

    class EngineSelected(Message):
        """The highlighted engine changed (``name`` is None when the table is empty)."""

        def __init__(self, name: str | None) -> None:
            super().__init__()
            self.name = name

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id, cursor_type="row", zebra_stripes=False)
        self.border_title = "Engines"
        self._order: list[str] = []

    def on_mount(self) -> None:
        for key, label in COLUMNS:
            self.add_column(label, key=key)

    @property
    def selected(self) -> str | None:
        if not self._order or not 0 <= self.cursor_row < len(self._order):
            return None
        return self._order[self.cursor_row]

    def cells(self, state: PoolState, row: EngineRow) -> dict[str, Text]:
        """The row's cells as they are shown (the tests read these)."""
        dead = not row.alive
        if dead:
            stage = Text("DEAD", style="bold red")
        elif row.loading:
            pct = "" if row.progress is None else f" {row.progress * 100:.0f}%"
            stage = Text(f"{row.stage}{pct}", style=STAGE_STYLES.get(row.stage, ""))
        else:
            stage = Text(row.stage, style=STAGE_STYLES.get(row.stage, ""))
        model = row.model or "-"
        if row.loading_model and row.loading_model != row.model and (row.loading or row.configuring):
            model = f"{row.model or ''}→{row.loading_model}"
        slots = f"{row.slots_busy}/{row.slots_total}" if row.slots_total else "-"
        queue = str(row.queued) if row.slots_total else "-"
        age = state.heartbeat_age(row)
        out = {
            "engine": Text(row.name, style="bold"),
            "gpu": Text(fmt_gpu(row)),
            "vram": Text(fmt_vram(row)),
            "stage": stage,
            "model": Text(model),
            "mode": Text(state.mode_label(row)),
            "slots": Text(slots, style="bold" if row.slots_busy else ""),
            "queue": Text(queue, style="yellow" if row.queued else ""),
            "decode": Text(fmt_tps(row.decode_tps)),
            "hb": Text(fmt_age(age), style="red" if age is not None and age > 5 and row.alive else ""),
        }
        if dead:
            for key, text in out.items():
                if key != "stage":
                    text.stylize("dim red")
        return out

    def show(self, state: PoolState) -> None:
        """Bring the rows in line with ``state`` and keep the selection on the same engine."""
        rows = state.sorted_engines()
        names = [r.name for r in rows]
        before = self.selected
        if names != self._order:
            self.clear()
            self._order = names
            for r in rows:
                cells = self.cells(state, r)
                self.add_row(*(cells[k] for k, _ in COLUMNS), key=r.name)
            if names:
                self.move_cursor(row=names.index(before) if before in names else 0)
            if self.selected != before:
                self.post_message(self.EngineSelected(self.selected))
            return
        for r in rows:
            for key, text in self.cells(state, r).items():
                self.update_cell(r.name, key, text, update_width=True)

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        event.stop()
        self.post_message(self.EngineSelected(self.selected))
