"""The help screen (``?`` or F1): every key of the console, and what the screen shows."""

from __future__ import annotations

from typing import ClassVar

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

KEYS: tuple[tuple[str, str], ...] = (
    ("↑ ↓", "select an engine (its details show in the Engine pane)"),
    ("enter", "open the selected engine: slots, parameters with their source, its events"),
    ("esc", "back from the engine screen; close a dialog"),
    ("r", "fetch the admin API now (on the engine screen: fetch the engine now)"),
    ("p", "switch profile: choose one (what it loads where), confirm the exact plan (y/n), follow it"),
    ("? F1", "this help"),
    ("q", "quit"),
)

NOTES: tuple[tuple[str, str], ...] = (
    ("DEAD", "the engine stopped answering; its row stays so you see what is missing"),
    ("■ □", "a busy / a free slot"),
    ("0.4s!", "heartbeat age; a ! means older than 5 s"),
    ("Loads", "per engine: phase, percent, elapsed and ETA (from the progress rate so far); "
              "on top, the profile switch: engines done of total, elapsed"),
    ("Banner", "the coordinator or its event stream cannot be reached; both are retried"),
)


def help_text() -> Group:
    def grid(rows: tuple[tuple[str, str], ...]) -> Table:
        table = Table.grid(padding=(0, 2))
        table.add_column(style="bold", no_wrap=True)
        table.add_column()
        for key, what in rows:
            table.add_row(key, what)
        return table

    return Group(Text("Keys", style="bold underline"), grid(KEYS), Text(""),
                 Text("Reading the screen", style="bold underline"), grid(NOTES))


class HelpScreen(ModalScreen[None]):
    """Bindings and a legend; any of esc, q, ? or F1 closes it."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,q,question_mark,f1", "close", "Close"),
    ]
    """
    | Key(s) | Description |
    | :- | :- |
    | escape, q, ?, f1 | Close the help. |
    """

    DEFAULT_CSS = """
    HelpScreen {
        align: center middle;
    }
    HelpScreen > VerticalScroll {
        width: 90;
        max-width: 100%;
        height: auto;
        max-height: 100%;
        border: thick $primary;
        background: $surface;
        padding: 0 1;
    }
    """

    def compose(self) -> ComposeResult:
        with VerticalScroll() as box:
            box.border_title = "Help (esc to close)"
            yield Static(help_text(), id="help")

    def action_close(self) -> None:
        self.dismiss(None)
