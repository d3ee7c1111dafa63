"""Profiles: the list (active marked), the chooser and the confirmation before a switch."""

from __future__ import annotations

from typing import Any, ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Label, OptionList, Static
from textual.widgets.option_list import Option

from tui.model import PoolModel, ProfileInfo, switch_reasons
from tui.format import fmt_load, fmt_secs, fmt_switch
from tui.widgets.panel import TextPanel


def entry_text(engine: str, entry: dict[str, Any], entries: dict[str, dict[str, Any]]) -> str:
    """``dev-a smollm2-135m``, ``5060ti gemma3-270m COMBINE+p100``, ``p100 PEER→5060ti``."""
    mode = str(entry.get("mode") or "SOLO").upper()
    if mode == "PEER":
        heads = [n for n, e in entries.items() if e.get("peer") == engine]
        return f"{engine} PEER→{heads[0]}" if heads else f"{engine} PEER"
    text = f"{engine} {entry.get('model') or '-'}"
    if mode == "COMBINE":
        text += f" COMBINE+{entry.get('peer') or '?'}"
    return text


def plan_summary(plan: dict[str, Any]) -> str:
    """One line: what a switch to the profile would do now."""
    reload = plan.get("reload") or {}
    parts = [f"reloads {', '.join(sorted(reload))}" if reload else "nothing to reload"]
    if plan.get("absent"):
        parts.append(f"absent {', '.join(plan['absent'])}")
    if plan.get("errors"):
        parts.append(f"cannot place {', '.join(sorted(plan['errors']))}")
    return "now: " + "; ".join(parts)


def plan_lines(plan: dict[str, Any]) -> list[str]:
    """The exact plan, one line per engine it touches, then what it leaves alone or cannot do."""
    lines = []
    for engine, step in sorted((plan.get("reload") or {}).items()):
        mode = str(step.get("mode") or "SOLO").upper()
        how = mode + (f"+{step.get('peer')}" if mode == "COMBINE" and step.get("peer") else "")
        if step.get("model_changes", step.get("from") != step.get("to")):
            lines.append(f"reload {engine}: {step.get('from') or '(no model)'} → {step.get('to') or '(none: PEER)'}"
                         f" ({how})")
        else:
            lines.append(f"reconfigure {engine}: {step.get('to') or '(no model)'} stays, parameters change ({how})")
    if plan.get("unchanged"):
        lines.append(f"unchanged: {', '.join(plan['unchanged'])}")
    if plan.get("absent"):
        lines.append(f"absent (configured when they register): {', '.join(plan['absent'])}")
    for engine, why in sorted((plan.get("errors") or {}).items()):
        lines.append(f"cannot place {engine}: {why}")
    return lines


class ProfilesPanel(TextPanel):
    """Every profile the coordinator knows, the active one marked ●, and the switch under way or the last one."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__("Profiles (p)", id=id)

    def show(self, info: ProfileInfo, pool: PoolModel | None = None) -> None:
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
            done, total = info.progress()
            t.append(f"switching to {info.switching_to or info.active}: {engines} ({done}/{total} done)\n",
                     style="bold yellow")
        elif info.last_switch:
            ls = info.last_switch
            ok = ls.get("ok")
            secs = ls.get("seconds")
            took = f" in {secs:.1f} s" if isinstance(secs, (int, float)) else ""
            if ok:
                t.append(f"last switch: {ls.get('profile')} ok{took}\n", style="green")
            else:
                reasons = switch_reasons(ls)
                failed = "; ".join(f"{e}: {why}" for e, why in reasons.items()) or "?"
                t.append(f"last switch: {ls.get('profile')} FAILED{took} ({failed})\n", style="red")
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
    | up/down | Move the highlight; it opens on the active profile. |
    | enter | Choose the highlighted profile (the option list's own binding). |
    """

    DEFAULT_CSS = """
    ProfilePicker {
        align: center middle;
    }
    ProfilePicker > Vertical {
        width: 76;
        max-width: 100%;
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
        max-height: 18;
    }
    """

    def __init__(self, profiles: dict[str, str], active: str | None,
                 plans: dict[str, dict[str, Any]] | None = None) -> None:
        super().__init__()
        self.profiles = profiles
        self.active = active
        self.plans = plans or {}
        self.labels: dict[str, str] = {}  # profile → its option's plain text (the tests read these)

    def compose(self) -> ComposeResult:
        options = []
        for name, desc in self.profiles.items():
            mark = "● " if name == self.active else "  "
            label = Text(mark + name, style="bold" if name == self.active else "")
            if desc:
                label.append(f"  {desc}", style="dim")
            plan = self.plans.get(name)
            if plan is not None:
                entries = plan.get("engines") or {}
                where = " · ".join(entry_text(e, entry, entries) for e, entry in entries.items()
                                   if isinstance(entry, dict)) or "(no engines)"
                label.append(f"\n    {where}")
                label.append(f"\n    {plan_summary(plan)}", style="dim")
            self.labels[name] = label.plain
            options.append(Option(label, id=name))
        with Vertical():
            yield Label("Switch the pool to which profile? (what each loads where)")
            yield Label("enter: choose · esc: cancel", classes="hint")
            yield OptionList(*options, id="profiles")

    def on_mount(self) -> None:
        # Opens on the active profile (the first when none is known), so the list shows where the
        # pool stands and up/down move from there to the neighbours.
        ol = self.query_one(OptionList)
        names = list(self.profiles)
        ol.highlighted = names.index(self.active) if self.active in names else 0
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
        width: 76;
        max-width: 100%;
        height: auto;
        max-height: 100%;
        border: thick $warning;
        background: $surface;
        padding: 1 2;
    }
    ConfirmSwitch #question {
        text-style: bold;
        margin-bottom: 1;
    }
    ConfirmSwitch #plan {
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

    def __init__(self, profile: str, engines: list[str], *, exact: bool = True, note: str = "",
                 plan: dict[str, Any] | None = None) -> None:
        """``plan``: the coordinator's plan for the switch (``GET /admin/profile`` "plans"); it makes
        the engine list exact and is shown line by line."""
        super().__init__()
        self.profile = profile
        self.plan = plan
        if plan is not None:
            engines, exact = sorted(plan.get("reload") or {}), True
        self.engines = engines
        self.exact = exact  # False: an upper bound (every live engine), the exact set is unknown here
        self.note = note
        self.plan_lines = plan_lines(plan) if plan is not None else []

    @property
    def question(self) -> str:
        n = len(self.engines)
        return (f"Switch pool to {self.profile}? This reloads {'' if self.exact else 'up to '}"
                f"{n} engine{'s' if n != 1 else ''}.")

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(self.question, id="question")
            if self.plan_lines:
                yield Label("\n".join(self.plan_lines), id="plan")
            elif self.engines:
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


class SwitchProgress(ModalScreen[None]):
    """A switch the console started: its plan, each engine's load, and how it ended (or why it was refused).

    Closing it (esc) leaves the switch running; its progress stays in the Loads pane."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,enter", "close", "Close"),
    ]
    """
    | Key(s) | Description |
    | :- | :- |
    | escape, enter | Close (the switch goes on; the Loads pane keeps showing it). |
    """

    DEFAULT_CSS = """
    SwitchProgress {
        align: center middle;
    }
    SwitchProgress > Vertical {
        width: 76;
        max-width: 100%;
        height: auto;
        max-height: 100%;
        border: thick $primary;
        background: $surface;
        padding: 0 1;
    }
    SwitchProgress #title {
        text-style: bold;
    }
    SwitchProgress #outcome {
        text-style: bold;
        margin-top: 1;
    }
    SwitchProgress .hint {
        color: $text-muted;
    }
    """

    def __init__(self, profile: str, plan: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.profile = profile
        self.plan = plan
        self.phase = "asking"  # asking | running | done | failed | refused
        self.outcome = ""
        self.lines: list[str] = []  # the engine lines shown (the tests read these)
        self.engines_seen: list[str] = []  # the engines of the switch, once it started
        self.overall = "asking the coordinator…"
        self._title = Label(f"Switching the pool to {profile}", id="title")
        self._overall = Label(self.overall, id="overall")
        self._engines = Static("", id="engines")
        self._outcome = Label("", id="outcome")

    def compose(self) -> ComposeResult:
        with Vertical():
            yield self._title
            yield self._overall
            yield self._engines
            yield self._outcome
            yield Label("esc: close (the switch goes on)", classes="hint")

    def on_mount(self) -> None:
        self._outcome.display = False

    def started(self, engines: list[str]) -> None:
        """The coordinator announced the switch (``profile.start``) with the engines it reloads."""
        self.engines_seen = list(engines)
        self.accepted()

    def accepted(self) -> None:
        if self.phase == "asking":
            self.phase = "running"
            self.overall = "accepted; waiting for the engines…"
            self._overall.update(self.overall)

    def refused(self, error: str) -> None:
        self.phase = "refused"
        self.outcome = f"REFUSED: {error}"
        self.overall = "nothing was changed"
        self._overall.update(self.overall)
        self._show_outcome()

    def finished(self, ok: bool, seconds: float | None, reasons: dict[str, str]) -> None:
        took = f" in {fmt_secs(seconds)}" if seconds is not None else ""
        if ok:
            self.phase, self.outcome = "done", f"Done: profile {self.profile} is active{took}."
        else:
            why = "; ".join(f"{e}: {r}" for e, r in reasons.items()) or "see the event log"
            self.phase, self.outcome = "failed", f"FAILED{took}: {why}"
        self._show_outcome()

    def _show_outcome(self) -> None:
        self._outcome.update(self.outcome)
        self._outcome.display = True
        self.query_one(".hint", Label).update("esc: close")

    def update_view(self, pool: PoolModel) -> None:
        """Engine lines from the switch under way (its engines) or the plan (before it starts)."""
        p = pool.profile
        running = p.state == "switching" and p.switching_to == self.profile
        if running:
            self.phase = "running" if self.phase == "asking" else self.phase
            self.overall = fmt_switch(pool) or self.overall
            engines = self.engines_seen = list(p.switch_engines)
            done = p.switch_done
        else:
            engines = self.engines_seen or sorted((self.plan or {}).get("reload") or {})
            done = p.switch_done if self.phase in ("done", "failed") else {}
            if self.phase in ("done", "failed"):
                n = len(engines)
                self.overall = f"{sum(1 for e in engines if e in done)}/{n} engine{'s' if n != 1 else ''} done"
        lines = []
        for e in engines:
            res = done.get(e)
            row = pool.engines.get(e)
            if res is not None:
                took = f" in {fmt_secs(res['seconds'])}" if isinstance(res.get("seconds"), (int, float)) else ""
                lines.append(f"{e}  done{took}" if res.get("ok") else f"{e}  FAILED{took}: {res.get('error') or '?'}")
            elif row is None or not row.alive:
                lines.append(f"{e}  DEAD" if row is not None else f"{e}  (unknown)")
            elif row.in_load:
                lines.append(f"{e}  {row.phase} → {row.loading_model or row.model or '?'}  {fmt_load(pool, row)}")
            else:
                lines.append(f"{e}  {'waiting' if self.phase in ('asking', 'running') else row.stage}")
        if not engines:
            lines.append("no engine needs a reload")
        self.lines = lines
        self._overall.update(self.overall)
        self._engines.update("\n".join(lines))

    def action_close(self) -> None:
        self.dismiss(None)
