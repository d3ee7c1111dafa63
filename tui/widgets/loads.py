"""Progress bars for engines that are loading or reloading a model."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.widgets import Label, ProgressBar

from tui.state import PoolState


class LoadBar(Vertical):
    """One engine's load: name, stage and target model, and below a bar (pulsing while the progress is unknown)."""

    DEFAULT_CSS = """
    LoadBar {
        height: 2;
    }
    LoadBar > Label {
        width: 100%;
        text-wrap: nowrap;
        text-overflow: ellipsis;
    }
    LoadBar > ProgressBar {
        width: 100%;
    }
    LoadBar > ProgressBar Bar {
        width: 1fr;
    }
    """

    def __init__(self, engine: str) -> None:
        super().__init__()
        self.engine = engine
        self.label = Label(engine)
        self.bar = ProgressBar(total=None, show_eta=False)

    def compose(self) -> ComposeResult:
        yield self.label
        yield self.bar

    def set_load(self, stage: str, model: str | None, progress: float | None) -> None:
        self.label.update(f"{self.engine} {stage} → {model}" if model else f"{self.engine} {stage}")
        if progress is None:
            self.bar.update(total=None)
        else:
            self.bar.update(total=100, progress=round(progress * 100, 1))

    @property
    def percent(self) -> float | None:
        """The bar's value in percent, None while indeterminate."""
        return None if self.bar.total is None else self.bar.progress


class LoadsPanel(VerticalScroll):
    """A bar per engine while it loads; "no loads" otherwise."""

    DEFAULT_CSS = """
    LoadsPanel {
        border: round $primary-darken-2;
        border-title-color: $text-muted;
        height: 100%;
    }
    LoadsPanel > #idle {
        color: $text-muted;
    }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.border_title = "Loads"
        self.bars: dict[str, LoadBar] = {}
        self._idle = Label("no loads", id="idle")

    def compose(self) -> ComposeResult:
        yield self._idle

    def show(self, state: PoolState) -> None:
        want = {}
        for row in state.sorted_engines():
            if row.loading or (row.alive and row.configuring and row.progress is not None):
                want[row.name] = row
        for name in list(self.bars):
            if name not in want:
                self.bars.pop(name).remove()
        for name, row in want.items():
            bar = self.bars.get(name)
            if bar is None:
                bar = self.bars[name] = LoadBar(name)
                after = sorted(n for n in self.bars if n > name)
                if after:
                    self.mount(bar, before=self.bars[after[0]])  # keep the bars in name order
                else:
                    self.mount(bar)
            bar.set_load(row.stage, row.loading_model or row.model, row.progress)
        self._idle.display = not want
