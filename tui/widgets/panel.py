"""The bordered, titled, scrolling text panel the main screen's side panels share."""

from __future__ import annotations

from textual.widgets import Static


class TextPanel(Static):
    """A Static with the side panels' rounded border and title; subclasses render into it."""

    DEFAULT_CSS = """
    TextPanel {
        border: round $primary-darken-2;
        border-title-color: $text-muted;
        height: 100%;
        padding: 0 1;
        overflow-y: auto;
    }
    """

    def __init__(self, title: str, *, id: str | None = None) -> None:
        super().__init__("", id=id)
        self.border_title = title
