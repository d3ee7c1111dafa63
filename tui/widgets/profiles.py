"""Profiles: the list (active marked), the chooser and the confirmation before a switch."""

from __future__ import annotations

from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Label, OptionList, Static
from textual.widgets.option_list import Option

from tui.state import ProfileInfo


class ProfilesPanel(Static):
    """Every profile the coordinator knows, the active one marked ●, and the switch under way or the last one."""

    DEFAULT_CSS = """
    ProfilesPanel {
        border: round $primary-darken-2;
        border-title-color: $text-muted;
        height: 100%;
        padding: 0 1;
        overflow-y: auto;
    }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__("", id=id)
        self.border_title = "Profiles (p)"

    def show(self, info: ProfileInfo) -> None:
        t = Text()
        if not info.profiles:
            t.append("(none known yet)", style="dim")
        for name, desc in info.profiles.items():
            active = name == info.active
            t.append("● " if active else "  ", style="bold green")
            t.append(name, style="bold" if active else "")
            if desc:
                t.append(f"  {desc}", style="dim")
            t.append("\n")
        if info.state == "switching":
            engines = ", ".join(info.switch_engines) or "…"
            t.append(f"switching to {info.switching_to or info.active}: {engines}\n", style="bold yellow")
        elif info.last_switch:
            ls = info.last_switch
            ok = ls.get("ok")
            secs = ls.get("seconds")
            took = f" in {secs:.1f} s" if isinstance(secs, (int, float)) else ""
            if ok:
                t.append(f"last switch: {ls.get('profile')} ok{took}\n", style="green")
            else:
                failed = ", ".join(ls.get("failed") or []) or "?"
                t.append(f"last switch: {ls.get('profile')} FAILED ({failed}){took}\n", style="red")
        t.rstrip()
        self.update(t)


class ProfilePicker(ModalScreen[str | None]):
    """Choose a profile to switch the pool to; dismisses with its name, or None."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "cancel", "Cancel"),
    ]
    """
    | Key(s) | Description |
    | :- | :- |
    | escape | Close without choosing. |
    | enter | Choose the highlighted profile (the option list's own binding). |
    """

    DEFAULT_CSS = """
    ProfilePicker {
        align: center middle;
    }
    ProfilePicker > Vertical {
        width: 64;
        height: auto;
        max-height: 80%;
        border: thick $primary;
        background: $surface;
        padding: 0 1;
    }
    ProfilePicker .hint {
        color: $text-muted;
    }
    ProfilePicker OptionList {
        height: auto;
        max-height: 16;
    }
    """

    def __init__(self, profiles: dict[str, str], active: str | None) -> None:
        super().__init__()
        self.profiles = profiles
        self.active = active

    def compose(self) -> ComposeResult:
        options = []
        for name, desc in self.profiles.items():
            mark = "● " if name == self.active else "  "
            label = Text(mark + name, style="bold" if name == self.active else "")
            if desc:
                label.append(f"  {desc}", style="dim")
            options.append(Option(label, id=name))
        with Vertical():
            yield Label("Switch the pool to which profile?")
            yield Label("enter: choose · esc: cancel", classes="hint")
            yield OptionList(*options, id="profiles")

    def on_mount(self) -> None:
        ol = self.query_one(OptionList)
        names = list(self.profiles)
        others = [i for i, n in enumerate(names) if n != self.active]
        ol.highlighted = others[0] if others else 0
        ol.focus()

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        self.dismiss(event.option.id)

    def action_cancel(self) -> None:
        self.dismiss(None)


class ConfirmSwitch(ModalScreen[bool]):
    """"Switch pool to X? this reloads N engines" — dismisses with True to go ahead."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("y", "confirm", "Switch"),
        Binding("n,escape", "cancel", "Cancel"),
    ]
    """
    | Key(s) | Description |
    | :- | :- |
    | y | Switch. |
    | n, escape | Do not switch. |
    """

    DEFAULT_CSS = """
    ConfirmSwitch {
        align: center middle;
    }
    ConfirmSwitch > Vertical {
        width: 64;
        height: auto;
        border: thick $warning;
        background: $surface;
        padding: 1 2;
    }
    ConfirmSwitch #question {
        text-style: bold;
        margin-bottom: 1;
    }
    ConfirmSwitch Horizontal {
        height: auto;
        align: center middle;
    }
    ConfirmSwitch Button {
        margin: 0 2;
    }
    """

    def __init__(self, profile: str, engines: list[str], *, exact: bool = True, note: str = "") -> None:
        super().__init__()
        self.profile = profile
        self.engines = engines
        self.exact = exact  # False: an upper bound (every live engine), the exact set is unknown here
        self.note = note

    @property
    def question(self) -> str:
        n = len(self.engines)
        return (f"Switch pool to {self.profile}? This reloads {'' if self.exact else 'up to '}"
                f"{n} engine{'s' if n != 1 else ''}.")

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(self.question, id="question")
            if self.engines:
                yield Label("engines: " + ", ".join(self.engines))
            if self.note:
                yield Label(self.note, classes="note")
            with Horizontal():
                yield Button("Switch (y)", variant="warning", id="yes")
                yield Button("Cancel (n)", variant="primary", id="no")

    def on_mount(self) -> None:
        self.query_one("#no", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.dismiss(event.button.id == "yes")

    def action_confirm(self) -> None:
        self.dismiss(True)

    def action_cancel(self) -> None:
        self.dismiss(False)
