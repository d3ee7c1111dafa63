"""Progress of loads: one bar per engine loading or reloading a model, and the profile switch as a whole."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.widgets import Label, ProgressBar

from tui.model import EngineRow, PoolModel
from tui.format import fmt_load, fmt_switch


class LoadBar(Vertical):
    """One engine's load: name, phase and target model; below, a bar (pulsing while the progress is
    unknown) with percent, elapsed time and the ETA from the rate seen so far."""

    DEFAULT_CSS = """
    LoadBar {
        height: 2;
    }
    LoadBar > Label {
        width: 100%;
        text-wrap: nowrap;
        text-overflow: ellipsis;
    }
    LoadBar > Horizontal {
        height: 1;
    }
    LoadBar ProgressBar {
        width: 1fr;
        min-width: 6;
    }
    LoadBar ProgressBar Bar {
        width: 1fr;
    }
    LoadBar .timing {
        width: auto;
        padding-left: 1;
        text-wrap: nowrap;
    }
    """

    def __init__(self, engine: str) -> None:
        super().__init__()
        self.engine = engine
        self.label = Label(engine)
        self.bar = ProgressBar(total=None, show_eta=False, show_percentage=False)
        self.timing = Label("", classes="timing")
        self.label_text = engine
        self.timing_text = ""

    def compose(self) -> ComposeResult:
        yield self.label
        with Horizontal():
            yield self.bar
            yield self.timing

    def set_load(self, stage: str, model: str | None, progress: float | None, timing: str = "") -> None:
        self.label_text = f"{self.engine} {stage} → {model}" if model else f"{self.engine} {stage}"
        self.timing_text = timing
        self.label.update(self.label_text)
        if progress is None:
            self.bar.update(total=None)
        else:
            self.bar.update(total=100, progress=round(progress * 100, 1))
        self.timing.update(timing)

    @property
    def percent(self) -> float | None:
        """The bar's value in percent, None while indeterminate."""
        return None if self.bar.total is None else self.bar.progress

    @property
    def text(self) -> str:
        """What the bar says, as plain text (the tests read it)."""
        return f"{self.label_text} {self.timing_text}".rstrip()


class LoadsPanel(VerticalScroll):
    """The switch under way (engines done of total, elapsed), then a bar per engine while it loads;
    "no loads" otherwise."""

    DEFAULT_CSS = """
    LoadsPanel {
        border: round $primary-darken-2;
        border-title-color: $text-muted;
        height: 100%;
    }
    LoadsPanel > #idle {
        color: $text-muted;
    }
    LoadsPanel > #switch {
        width: 100%;
        text-style: bold;
        display: none;
    }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.border_title = "Loads"
        self.bars: dict[str, LoadBar] = {}
        self._idle = Label("no loads", id="idle")
        self.switch_line = Label("", id="switch")
        self.switch_text: str | None = None

    def compose(self) -> ComposeResult:
        yield self.switch_line
        yield self._idle

    def show(self, pool: PoolModel) -> None:
        self.switch_text = fmt_switch(pool)
        self.switch_line.update(self.switch_text or "")
        self.switch_line.display = self.switch_text is not None
        want: dict[str, EngineRow] = {}
        for row in pool.sorted_engines():
            if row.loading or (row.alive and row.configuring and (row.progress is not None
                                                                   or pool.profile.state == "switching")):
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
            bar.set_load(row.phase, row.loading_model or row.model, row.progress, fmt_load(pool, row))
        self._idle.display = not want and self.switch_text is None
