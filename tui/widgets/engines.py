"""The engines table: one row per engine, dead ones dimmed red, loads with their percentage."""

from __future__ import annotations

from typing import ClassVar

from rich.text import Text
from textual.binding import Binding, BindingType
from textual.message import Message
from textual.widgets import DataTable

from tui.model import EngineRow, PoolModel
from tui.format import fmt_age, fmt_gpu, fmt_tps, fmt_vram

COLUMNS: tuple[tuple[str, str], ...] = (
    ("engine", "Engine"), ("gpu", "GPU"), ("vram", "VRAM"), ("stage", "Stage"), ("model", "Model"),
    ("mode", "Mode"), ("slots", "Slots"), ("queue", "Queue"), ("decode", "Dec t/s"), ("hb", "HB"),
)

# the columns shown by terminal width: all from FULL_FROM columns; without GPU and queue from
# COMPACT_BELOW (the GPU is in the Engine pane); below that, what tells the engines' states apart
FULL_FROM = 132
COMPACT_BELOW = 100
MEDIUM_COLUMNS = frozenset(k for k, _ in COLUMNS) - {"gpu", "queue"}
COMPACT_COLUMNS = frozenset({"engine", "stage", "model", "slots", "decode", "hb"})
STALE_S = 5.0  # a heartbeat older than this is marked "!"

STAGE_STYLES = {"ready": "bold green", "reloading": "yellow", "loading_model": "yellow", "warming": "yellow",
                "idle": "cyan", "starting": "cyan", "sleeping": "blue", "stopping": "magenta"}


class EnginesTable(DataTable[Text]):
    """The pool's engines, sorted by name; the highlighted row is the selected engine.

    Dead engines (an ``engine.down`` event, or ``alive: false`` from the admin API) keep their
    row, dimmed red with the stage ``DEAD``, so an operator sees what is missing.
    """

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("up", "cursor_up", "Prev engine", key_display="↑", show=False),
        Binding("down", "cursor_down", "Next engine", key_display="↓", show=False),
        Binding("enter", "open_engine", "Details", key_display="⏎"),
    ]
    """
    | Key(s) | Description |
    | :- | :- |
    | up | Select the engine above. |
    | down | Select the engine below. |
    | enter | Open the selected engine's screen (slots, parameters, events). |
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

    class EngineOpened(Message):
        """Enter on an engine: open its screen."""

        def __init__(self, name: str) -> None:
            super().__init__()
            self.name = name

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id, cursor_type="row", zebra_stripes=False)
        self.border_title = "Engines"
        self._order: list[str] = []
        self.keys: list[str] = [k for k, _ in COLUMNS]  # the columns shown
        self._pool: PoolModel | None = None

    def on_mount(self) -> None:
        self._columns()

    def _columns(self) -> None:
        for key, label in COLUMNS:
            if key in self.keys:
                self.add_column(label, key=key)

    def fit_width(self, width: int) -> None:
        """Pick the columns for a terminal ``width`` columns wide (the rows are rebuilt if they change)."""
        wanted = (None if width >= FULL_FROM else MEDIUM_COLUMNS if width >= COMPACT_BELOW else COMPACT_COLUMNS)
        keys = [k for k, _ in COLUMNS if wanted is None or k in wanted]
        if keys == self.keys:
            return
        self.keys = keys
        before = self.selected
        self.clear(columns=True)
        self._columns()
        self._order = []
        if self._pool is not None:
            self.show(self._pool)
            if before in self._order:
                self.move_cursor(row=self._order.index(before))

    def action_open_engine(self) -> None:
        if self.selected is not None:
            self.post_message(self.EngineOpened(self.selected))

    @property
    def selected(self) -> str | None:
        if not self._order or not 0 <= self.cursor_row < len(self._order):
            return None
        return self._order[self.cursor_row]

    def cells(self, pool: PoolModel, row: EngineRow) -> dict[str, Text]:
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
        age = pool.heartbeat_age(row)
        out = {
            "engine": Text(row.name, style="bold"),
            "gpu": Text(fmt_gpu(row)),
            "vram": Text(fmt_vram(row)),
            "stage": stage,
            "model": Text(model),
            "mode": Text(pool.mode_label(row)),
            "slots": Text(slots, style="bold" if row.slots_busy else ""),
            "queue": Text(queue, style="yellow" if row.queued else ""),
            "decode": Text(fmt_tps(row.decode_tps)),
            "hb": Text(fmt_age(age) + "!", style="red") if age is not None and age > STALE_S and row.alive
            else Text(fmt_age(age)),
        }
        if dead:
            for key, text in out.items():
                if key != "stage":
                    text.stylize("dim red")
        return out

    def show(self, pool: PoolModel) -> None:
        """Bring the rows in line with ``pool`` and keep the selection on the same engine."""
        self._pool = pool
        rows = pool.sorted_engines()
        names = [r.name for r in rows]
        before = self.selected
        keys = self.keys
        if names != self._order:
            self.clear()
            self._order = names
            for r in rows:
                cells = self.cells(pool, r)
                self.add_row(*(cells[k] for k in keys), key=r.name)
            if names:
                self.move_cursor(row=names.index(before) if before in names else 0)
            if self.selected != before:
                self.post_message(self.EngineSelected(self.selected))
            return
        for r in rows:
            for key, text in self.cells(pool, r).items():
                if key in keys:
                    self.update_cell(r.name, key, text, update_width=True)

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        """A click on the highlighted row opens it, as Enter does."""
        event.stop()
        self.action_open_engine()

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        event.stop()
        self.post_message(self.EngineSelected(self.selected))
