"""A one-line banner for a coordinator the console cannot reach (hidden while all is well)."""

from __future__ import annotations

from textual.widgets import Static


class Banner(Static):
    """Shows a problem in reverse red across the screen; ``clear_problem()`` hides it again."""

    DEFAULT_CSS = """
    Banner {
        display: none;
        height: auto;
        padding: 0 1;
        background: $error;
        color: $text;
        text-style: bold;
    }
    Banner.-warning {
        background: $warning;
        color: $background;
    }
    Banner.-shown {
        display: block;
    }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__("", id=id)
        self.text = ""

    def show_problem(self, text: str, *, warning: bool = False) -> None:
        if text != self.text or not self.has_class("-shown"):
            self.text = text
            self.update(text)
        self.set_class(warning, "-warning")
        self.add_class("-shown")

    def clear_problem(self) -> None:
        self.text = ""
        self.remove_class("-shown", "-warning")

    @property
    def shown(self) -> bool:
        return self.has_class("-shown")
