"""Two scrolling logs: routing decisions (from ``route`` events) and every other event."""

from __future__ import annotations

from collections import deque

from rich.text import Text
from textual.widgets import RichLog

from tui.model import RouteEntry
from tui.format import fmt_clock

LOG_LINES = 500


class _PaneLog(RichLog):
    DEFAULT_CSS = """
    _PaneLog {
        border: round $primary-darken-2;
        border-title-color: $text-muted;
        height: 100%;
        overflow-x: hidden;
        scrollbar-size-vertical: 1;
    }
    """

    def __init__(self, title: str, *, id: str | None = None, max_lines: int = LOG_LINES) -> None:
        super().__init__(id=id, max_lines=max_lines, wrap=True, markup=False, min_width=20)
        self.border_title = title
        self.entries: deque[str] = deque(maxlen=max_lines)  # plain text of what was written, for tests

    def add(self, line: Text) -> None:
        self.entries.append(line.plain)
        self.write(line)


def short_req(req: str) -> str:
    """Request ids are long (``chatcmpl-`` + 32 hex digits); 8 characters tell them apart on screen."""
    req = req.removeprefix("chatcmpl-")
    return req if len(req) <= 12 else req[:8]


class RouteLog(_PaneLog):
    """The last routing decisions: time, request, chosen engine, step (affinity/cost/none) and reason."""

    DEFAULT_CSS = """
    RouteLog { }
    """

    def __init__(self, *, id: str | None = None, max_lines: int = 200) -> None:
        super().__init__("Routing", id=id, max_lines=max_lines)

    def add_route(self, r: RouteEntry) -> None:
        line = Text(fmt_clock(r.ts) + " ", style="dim")
        line.append(short_req(r.req))
        if r.attempt > 1:
            line.append(f" (try {r.attempt})", style="yellow")
        line.append(" → ")
        if r.engine:
            line.append(r.engine, style="bold green")
        else:
            line.append("none", style="bold red")
        line.append(f" [{r.step}]", style="cyan")
        if r.model:
            line.append(f" {r.model}")
        line.append(f"  {r.reason}", style="dim" if r.engine else "red")
        self.add(line)


class EventLog(_PaneLog):
    """Pool events (engines up/down, stages, loads, profile switches) and the console's own notes."""

    DEFAULT_CSS = """
    EventLog { }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__("Events", id=id)

    def add_event(self, ts: float, topic: str, text: str) -> None:
        style = "red" if topic in ("engine.down",) or "FAILED" in text else \
            "green" if topic in ("engine.up", "profile.done") else ""
        line = Text(fmt_clock(ts) + " ", style="dim")
        line.append(text, style=style)
        self.add(line)
