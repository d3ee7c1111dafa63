"""The console's profile switch, from the key to the end: pick a profile, fetch the coordinator's
plan and confirm it, POST the switch in a thread worker, follow it in :class:`SwitchProgress`
and say how it ended. A mixin of :class:`tui.app.HydraConsole`, whose state and messages it uses."""

from __future__ import annotations

from typing import Any

from textual import work
from textual.message import Message
from textual.screen import ModalScreen

from tui.feed import AdminError
from tui.model import switch_reasons
from tui.widgets import ConfirmSwitch, ProfilePicker, SwitchProgress


class ProfileSwitching:
    """``p``: the switch flow, and the handlers of the app's ``PlanReady`` and ``SwitchAnswer`` messages.

    It uses the app's ``pool``, ``admin``, ``switch_view``, ``_render``, ``_notice`` and
    ``_refresh_wanted``; only :class:`~tui.app.HydraConsole` mixes it in.
    """

    pool: Any
    admin: Any
    switch_view: SwitchProgress | None
    refresh_on_events: bool
    _refresh_wanted: bool

    def action_switch_profile(self) -> None:
        """Pick a profile, confirm, then POST /admin/profile in a thread worker."""
        info = self.pool.profile
        if info.state == "switching":
            self._notice(f"A switch to {info.switching_to or info.active} is under way; wait for it to finish.",
                         "warning")
            return
        if isinstance(self.screen, ModalScreen):
            return
        if not info.profiles:
            self._notice("No profiles known yet: the admin API has not answered.", "warning")
            return
        self.push_screen(ProfilePicker(info.profiles, info.active, info.plans), self._profile_picked)

    def _profile_picked(self, name: str | None) -> None:
        if name:
            self._fetch_plan(name, self.pool.seq)  # the confirmation shows the plan as of now

    @work(thread=True, group="plan", exit_on_error=False)
    def _fetch_plan(self, name: str, since: int) -> None:
        try:
            doc = self.admin.profile()
        except Exception as exc:  # AdminError or a broken answer: confirm with the plan known so far
            self.post_message(self.PlanReady(name, None, str(exc), since=since))
        else:
            self.post_message(self.PlanReady(name, doc, since=since))

    def on_hydra_console_switch_answer(self, msg: Message) -> None:
        view = self.switch_view
        if msg.error is not None:
            self._notice(f"Switch to {msg.profile} refused: {msg.error}", "error")
            if view is not None and view.profile == msg.profile and view.phase == "asking":
                view.refused(msg.error)
            return
        if view is not None and view.profile == msg.profile:
            view.accepted()
        self._notice(f"Switching the pool to {msg.profile}…", "information")
        self._refresh_wanted = self._refresh_wanted or self.refresh_on_events

    def on_hydra_console_plan_ready(self, msg: Message) -> None:
        if msg.doc is not None:
            self.pool.apply_profile(msg.doc, since=msg.since)
            self._render({"profile"})
        if isinstance(self.screen, ModalScreen):
            return  # something else was opened meanwhile
        name = msg.profile
        plan = self.pool.profile.plans.get(name)
        engines, exact = self.pool.reload_estimate(name)
        note = ""
        if msg.error is not None:
            note = f"(plan as of the last refresh: {msg.error})"
        elif not exact:
            note = "(engines that already match it are left alone)"
        self.push_screen(ConfirmSwitch(name, engines, exact=exact, note=note, plan=plan),
                         lambda ok: self._confirmed(name, plan) if ok else None)

    def _confirmed(self, name: str, plan: dict[str, Any] | None) -> None:
        view = SwitchProgress(name, plan)
        self.switch_view = view
        self.push_screen(view, lambda _: self._progress_closed(view))
        view.update_view(self.pool)
        self._post_switch(name)

    def _progress_closed(self, view: SwitchProgress) -> None:
        if self.switch_view is view:
            self.switch_view = None

    @work(thread=True, group="switch", exit_on_error=False)
    def _post_switch(self, name: str) -> None:
        try:
            result = self.admin.switch(name)
        except AdminError as exc:
            self.post_message(self.SwitchAnswer(name, None, str(exc)))
        except Exception as exc:
            self.post_message(self.SwitchAnswer(name, None, f"{type(exc).__name__}: {exc}"))
        else:
            self.post_message(self.SwitchAnswer(name, result))

    def _switch_done(self, data: dict[str, Any]) -> None:
        secs = data.get("seconds")
        reasons = switch_reasons(self.pool.profile.last_switch)
        view = self.switch_view
        if view is not None and view.profile == data.get("profile"):
            view.finished(bool(data.get("ok")), secs if isinstance(secs, (int, float)) else None, reasons)
        if data.get("ok"):
            took = f" in {secs:.1f} s" if isinstance(secs, (int, float)) else ""
            self._notice(f"Profile {data.get('profile')} is active{took}.", "information")
        else:
            failed = ", ".join(data.get("failed") or []) or "?"
            why = "; ".join(f"{e}: {r}" for e, r in reasons.items() if r != "failed")
            self._notice(f"Switch to {data.get('profile')} failed on: {failed}" + (f" ({why})" if why else
                         " (see the event log)") + ".", "error")
