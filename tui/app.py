"""hydra-console: watch and steer a Hydra pool from a terminal.

    hydra-console [--coordinator tcp://HOST:9501] [--admin http://HOST:9000] [--refresh 2]

Live state comes from the coordinator's PUB socket (a ZeroMQ SUB reader in a thread worker
posts batches of events as Textual messages); heartbeat figures (slots, queue, tok/s, VRAM)
and the initial state come from the admin API, fetched in a thread worker at start, after
events that change them, on ``r`` and every ``--refresh`` seconds. An engine's own screen
(``enter``) reads that engine's ``/slots`` and ``/control/config``; a profile switch (``p``)
shows the coordinator's plan, then follows the switch to its end. Nothing blocking ever runs
on the UI's event loop, and nothing the coordinator does (or fails to do) ends the console:
an unreachable coordinator is a banner, retried until it answers.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from typing import Any, Callable, ClassVar, Protocol

from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal
from textual.message import Message
from textual.screen import ModalScreen
from textual import events as tevents
from textual.widgets import Footer, Header
from textual.worker import get_current_worker

from hydrad.common import tokenfile
from tui.feed import (CONNECTED, DISCONNECTED, AdminClient, AdminError, EngineClient, EventReader, FeedEvent,
                      engine_base_url)
from tui.model import PoolModel, summarize
from tui.format import describe_event
from tui.switching import ProfileSwitching
from tui.widgets.logs import short_req
from tui.widgets import (Banner, EngineDetail, EngineDetails, EngineScreen, EnginesTable, EventLog, HelpScreen,
                         LoadsPanel, ProfilesPanel, RouteLog, SwitchProgress)

NARROW_BELOW = 110  # columns: below, the Profiles pane gives its room to the others (p still lists profiles)

DEFAULT_ADMIN = "http://127.0.0.1:9000"  # etc/hydra/dev/coordinator.yaml: http.port
DEFAULT_EVENTS = "tcp://127.0.0.1:9501"  # etc/hydra/dev/coordinator.yaml: events
# profile.progress repeats engine.progress for the engines a switch reloads; session.kept comes with every turn
QUIET_TOPICS = frozenset({"profile.progress", "session.kept"})
REFRESH_TOPICS = frozenset({"engine.up", "engine.down", "engine.stage", "route", "profile.engine", "profile.done"})


class Admin(Protocol):
    """What the console needs of the admin API (:class:`tui.feed.AdminClient`; a fake in unit tests)."""

    def engines(self) -> dict[str, Any]: ...
    def profile(self) -> dict[str, Any]: ...
    def switch(self, name: str) -> dict[str, Any]: ...


class EngineApi(Protocol):
    """What the engine screen needs of an engine's own HTTP API (:class:`tui.feed.EngineClient`)."""

    def config(self, base_url: str) -> dict[str, Any]: ...
    def slots(self, base_url: str) -> list[dict[str, Any]]: ...


class HydraConsole(ProfileSwitching, App[None]):
    """Engines, loads, profiles and routing of one coordinator's pool."""

    TITLE = "Hydra console"
    ENABLE_COMMAND_PALETTE = False
    # screen classes by terminal size: the layout adapts down to 80×24
    HORIZONTAL_BREAKPOINTS: ClassVar[list[tuple[int, str]] | None] = [(0, "-narrow"), (NARROW_BELOW, "-wide")]
    VERTICAL_BREAKPOINTS: ClassVar[list[tuple[int, str]] | None] = [(0, "-short"), (32, "-tall")]

    CSS = """
    #middle {
        height: 10;
    }
    #middle > EngineDetail {
        width: 2fr;
    }
    #middle > LoadsPanel {
        width: 1fr;
    }
    #middle > ProfilesPanel {
        width: 1fr;
    }
    #logs {
        height: 1fr;
        min-height: 5;
    }
    #logs > RouteLog {
        width: 1fr;
    }
    #logs > EventLog {
        width: 1fr;
    }
    Screen.-narrow #middle > ProfilesPanel {
        display: none;
    }
    Screen.-narrow #middle > LoadsPanel {
        width: 1fr;
    }
    Screen.-narrow #middle > EngineDetail {
        width: 1fr;
    }
    Screen.-short #middle {
        height: 8;
    }
    Screen.-short EnginesTable {
        max-height: 8;
    }
    """

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("q", "quit", "Quit"),
        Binding("p", "switch_profile", "Profile"),
        Binding("r", "refresh", "Refresh"),
        Binding("question_mark", "help", "Help", key_display="?"),
        Binding("f1", "help", "Help", show=False),
    ]
    """
    | Key(s) | Description |
    | :- | :- |
    | q | Quit. |
    | p | Choose a profile and switch the pool to it (after a confirmation showing the exact plan). |
    | r | Fetch the admin API now. |
    | ?, f1 | Help: every key, and how to read the screen. |
    | up/down, enter | Select an engine, open its screen (the engines table's bindings). |
    """

    class PoolEvents(Message):
        """A batch of events from the PUB socket (posted by the reader thread)."""

        def __init__(self, events: list[FeedEvent]) -> None:
            super().__init__()
            self.events = events

    class FeedState(Message):
        """The event stream connected, dropped or keeps failing to connect."""

        def __init__(self, state: str, detail: str) -> None:
            super().__init__()
            self.state = state
            self.detail = detail

    class AdminSnapshot(Message):
        """The admin API's answer (``error`` set when it gave none); ``since``: events applied before asking."""

        def __init__(self, engines: dict[str, Any] | None, profile: dict[str, Any] | None,
                     error: str | None = None, since: int | None = None) -> None:
            super().__init__()
            self.engines = engines
            self.profile = profile
            self.error = error
            self.since = since

    class PlanReady(Message):
        """A fresh plan for the chosen profile (from ``GET /admin/profile``), before the confirmation."""

        def __init__(self, profile: str, doc: dict[str, Any] | None, error: str | None = None,
                     since: int | None = None) -> None:
            super().__init__()
            self.profile = profile
            self.doc = doc
            self.error = error
            self.since = since

    class SwitchAnswer(Message):
        """The answer to ``POST /admin/profile`` (the switch itself goes on; its progress comes as events)."""

        def __init__(self, profile: str, result: dict[str, Any] | None, error: str | None = None) -> None:
            super().__init__()
            self.profile = profile
            self.result = result
            self.error = error

    def __init__(self, *, admin_url: str = DEFAULT_ADMIN, events: str | None = DEFAULT_EVENTS,
                 admin: Admin | None = None, refresh_s: float = 2.0, curve_server_key: str | None = None,
                 clock: Callable[[], float] = time.monotonic, refresh_on_events: bool = True,
                 engine_api: EngineApi | None = None, toast_s: float = 4.0, events_token: str | None = None) -> None:
        """``events=None`` runs without a SUB reader (unit tests post :class:`PoolEvents` themselves);
        ``events_token``: what the SUB reader presents (default: ``$HYDRA_EVENTS_TOKEN``, the file
        ``$HYDRA_EVENTS_TOKEN_FILE`` names, else the admin token from the environment);
        ``clock`` drives heartbeat ages (a fixed one makes snapshots reproducible);
        ``refresh_on_events`` fetches the admin API soon after events that change its figures
        (a route changes slots, an engine coming up brings its GPU and slots) and after a switch
        is accepted; ``engine_api`` reads an engine's own ``/control/config`` and ``/slots`` for
        its screen (a fake in unit tests); ``toast_s`` is how long a notification stays (an error's
        twice as long; snapshot tests pin it long, so a slow machine cannot let one expire before
        the screenshot)."""
        super().__init__()
        self.admin_url = admin_url
        self.events_endpoint = events
        timeout = min(5.0, max(1.0, refresh_s * 2))
        self.admin: Admin = admin if admin is not None else AdminClient(admin_url, timeout=timeout)
        self.engine_api: EngineApi = engine_api if engine_api is not None else EngineClient(timeout=timeout)
        self.refresh_s = refresh_s
        self.curve_server_key = curve_server_key
        if events_token is None:
            try:
                events_token = tokenfile.events_token_from_env()
            except tokenfile.TokenError:
                events_token = None  # the feed then says that no token was presented
        self.events_token = events_token
        self.refresh_on_events = refresh_on_events
        self.toast_s = toast_s
        self.pool = PoolModel(clock=clock)
        self.notices: list[tuple[str, str]] = []  # (severity, text) of every notification, newest last
        self.snapshots = 0  # admin snapshots applied
        self.admin_error: str | None = None
        self.feed_state = "connecting" if events else "off"
        self.feed_detail = ""
        self._refreshing = False
        self._refresh_wanted = False
        self._last_refresh = -1e9
        self._last_paint = 0.0
        self.switch_view: SwitchProgress | None = None  # the progress dialog of the switch started here
        # the widgets, made here so that messages arriving before they are mounted find them
        self.banner = Banner(id="banner")
        self.table = EnginesTable(id="engines")
        self.detail = EngineDetail(id="detail")
        self.loads = LoadsPanel(id="loads")
        self.profiles_panel = ProfilesPanel(id="profiles")
        self.route_log = RouteLog(id="routes")
        self.event_log = EventLog(id="events")

    # ----- layout ------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield Header(show_clock=False, icon="≋")
        yield self.banner
        yield self.table
        with Horizontal(id="middle"):
            yield self.detail
            yield self.loads
            yield self.profiles_panel
        with Horizontal(id="logs"):
            yield self.route_log
            yield self.event_log
        yield Footer()

    def on_mount(self) -> None:
        events = f" · events {self.events_endpoint}" if self.events_endpoint else ""
        self.sub_title = f"admin {self.admin_url}{events}"
        self.table.focus()
        self.table.fit_width(self.size.width)
        self._render({"engines", "profile"})
        self._start_refresh()
        self.set_interval(0.5, self._tick)
        if self.events_endpoint:
            self._read_events(self.events_endpoint)

    def on_resize(self, event: tevents.Resize) -> None:
        self.table.fit_width(event.size.width)

    def on_unmount(self) -> None:
        for client in (self.admin, self.engine_api):
            close = getattr(client, "close", None)
            if callable(close):
                with contextlib.suppress(Exception):
                    close()

    # ----- workers (all blocking I/O is here, off the UI loop) ---------------------------------

    @work(thread=True, group="events", exit_on_error=False)
    def _read_events(self, endpoint: str) -> None:
        worker = get_current_worker()
        while not worker.is_cancelled:
            reader = EventReader(endpoint, curve_server_key=self.curve_server_key, token=self.events_token)
            try:
                reader.run(on_events=lambda batch: self.post_message(self.PoolEvents(batch)),
                           on_state=lambda state, detail: self.post_message(self.FeedState(state, detail)),
                           should_stop=lambda: worker.is_cancelled)
            except Exception as exc:  # a bad endpoint string, a CURVE key of the wrong length...
                self.post_message(self.FeedState(DISCONNECTED, f"{endpoint}: {exc}"))
                deadline = time.monotonic() + max(2.0, self.refresh_s)
                while time.monotonic() < deadline and not worker.is_cancelled:
                    time.sleep(0.1)

    @work(thread=True, group="admin", exit_on_error=False)
    def _fetch_admin(self, since: int) -> None:
        try:
            engines = self.admin.engines()
            profile = self.admin.profile()
        except AdminError as exc:
            self.post_message(self.AdminSnapshot(None, None, str(exc)))
        except Exception as exc:  # whatever a broken answer raises, the console goes on
            self.post_message(self.AdminSnapshot(None, None, f"{type(exc).__name__}: {exc}"))
        else:
            self.post_message(self.AdminSnapshot(engines, profile, since=since))

    def fetch_engine(self, name: str) -> EngineDetails:
        """Blocking (the engine screen runs it in a thread worker): the engine's parameters and slots."""
        row = self.pool.engines.get(name)
        url = engine_base_url(row.http if row is not None else None, self.admin_url)
        if url is None:
            why = "the coordinator lists no HTTP address for this engine"
            return EngineDetails(None, config_error=why, slots_error=why)
        details = EngineDetails(url)
        try:
            details.config = self.engine_api.config(url)
        except Exception as exc:  # AdminError carries the reason (403: control_allow_from)
            details.config_error = str(exc) if isinstance(exc, AdminError) else f"{type(exc).__name__}: {exc}"
        try:
            details.slots = self.engine_api.slots(url)
        except Exception as exc:
            details.slots_error = str(exc) if isinstance(exc, AdminError) else f"{type(exc).__name__}: {exc}"
        return details

    def _start_refresh(self) -> None:
        if self._refreshing:
            self._refresh_wanted = True
            return
        self._refreshing, self._refresh_wanted = True, False
        self._last_refresh = time.monotonic()
        self._fetch_admin(self.pool.seq)

    def _tick(self) -> None:
        now = time.monotonic()
        if not self._refreshing and (self._refresh_wanted or now - self._last_refresh >= self.refresh_s):
            self._start_refresh()
        if now - self._last_paint >= 1.0:  # heartbeat ages move with time
            self._render({"engines"})

    # ----- messages from the workers -----------------------------------------------------

    def on_hydra_console_admin_snapshot(self, msg: AdminSnapshot) -> None:
        self._refreshing = False
        if msg.error is not None:
            if self.admin_error is None:
                self.event_log.add_event(time.time(), "console", f"admin API unreachable: {msg.error}")
            self.admin_error = msg.error
            self._update_banner()
            self._render({"engines"})  # the header says DISCONNECTED
            return
        if self.admin_error is not None:
            self.event_log.add_event(time.time(), "console", f"admin API {self.admin_url} answers again")
        self.admin_error = None
        changed: set[str] = set()
        if msg.engines is not None:
            changed |= self.pool.apply_engines(msg.engines, since=msg.since)
        if msg.profile is not None:
            changed |= self.pool.apply_profile(msg.profile, since=msg.since)
        self.snapshots += 1
        self._render(changed)
        self._update_banner()

    def on_hydra_console_pool_events(self, msg: PoolEvents) -> None:
        changed: set[str] = set()
        routes = self.route_log
        log = self.event_log
        pool = self.pool
        for ev in msg.events:
            changed |= pool.apply_event(ev.topic, ev.data, ev.ts)
            engine = ev.data.get("engine")
            if ev.topic == "route":
                r = pool.routes[-1]
                routes.add_route(r)
                if isinstance(engine, str):
                    pool.note(engine, ev.ts, f"route {short_req(r.req)} [{r.step}] {r.model or '-'}: {r.reason}")
            elif ev.topic not in QUIET_TOPICS:
                line = describe_event(ev.topic, ev.data)
                log.add_event(ev.ts, ev.topic, line)
                if isinstance(engine, str):
                    pool.note(engine, ev.ts, line)
            if ev.topic in REFRESH_TOPICS and self.refresh_on_events:
                self._refresh_wanted = True
            view = self.switch_view
            if ev.topic == "profile.start" and view is not None and ev.data.get("profile") == view.profile:
                view.started([str(e) for e in ev.data.get("engines") or []])
            if ev.topic == "profile.done":
                self._switch_done(ev.data)
        self._render(changed)

    def on_hydra_console_feed_state(self, msg: FeedState) -> None:
        if msg.state != self.feed_state:
            self.event_log.add_event(time.time(), "console", f"events: {msg.detail}")
            if msg.state == CONNECTED and self.refresh_on_events:
                self._refresh_wanted = True  # events may have been missed while away
        self.feed_state, self.feed_detail = msg.state, msg.detail
        self._update_banner()

    def on_engines_table_engine_selected(self, msg: EnginesTable.EngineSelected) -> None:
        self.detail.show(self.pool, msg.name)

    def on_engines_table_engine_opened(self, msg: EnginesTable.EngineOpened) -> None:
        if isinstance(self.screen, (ModalScreen, EngineScreen)):
            return
        self.push_screen(EngineScreen(msg.name, self.pool, self.fetch_engine, every_s=max(1.0, min(self.refresh_s, 5))))

    # ----- actions -----------------------------------------------------------------------

    def action_refresh(self) -> None:
        """Fetch the admin API now."""
        self._start_refresh()

    def action_help(self) -> None:
        """Show every key and how to read the screen."""
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen())

    # ----- rendering ---------------------------------------------------------------------

    def _render(self, changed: set[str]) -> None:
        if "engines" in changed:
            self._last_paint = time.monotonic()
            table = self.table
            table.show(self.pool)
            self.loads.show(self.pool)
            self.detail.show(self.pool, table.selected)
            alive, dead, loading = summarize(self.pool.engines.values())
            active = self.pool.profile.active or "-"
            parts = [f"profile {active}", f"{alive} up"]
            if self.admin_error is not None:
                parts.insert(0, "DISCONNECTED")
            if dead:
                parts.append(f"{dead} dead")
            if loading:
                parts.append(f"{loading} loading")
            self.sub_title = " · ".join(parts)
        if "profile" in changed or "engines" in changed:
            self.profiles_panel.show(self.pool.profile, self.pool)
        for screen in self.screen_stack[1:]:
            if isinstance(screen, EngineScreen):
                screen.show(self.pool)
            elif isinstance(screen, SwitchProgress):
                screen.update_view(self.pool)

    def _update_banner(self) -> None:
        banner = self.banner
        if self.admin_error is not None:
            text = f"⚠ Coordinator unreachable: {self.admin_error}. Retrying every {self.refresh_s:g} s"
            if self.events_endpoint and self.feed_state != CONNECTED:
                text += f"; events {self.events_endpoint} not connected"
            banner.show_problem(text + ". Figures shown may be stale.")
        elif self.events_endpoint and self.feed_state == DISCONNECTED:
            banner.show_problem(f"⚠ Event stream down ({self.feed_detail}): live updates paused, "
                                f"admin data every {self.refresh_s:g} s.", warning=True)
        else:
            banner.clear_problem()

    def _notice(self, text: str, severity: str) -> None:
        self.notices.append((severity, text))
        self.notify(text, severity=severity,  # type: ignore[arg-type]
                    timeout=self.toast_s * (2 if severity == "error" else 1))


def build_parser() -> argparse.ArgumentParser:
    """hydra-console's command line (also read by scripts/gen_docs for docs/reference/cli.md)."""
    ap = argparse.ArgumentParser(
        prog="hydra-console",
        description="Terminal console of a Hydra pool: engines, loads, profiles, routing decisions.")
    ap.add_argument("--coordinator", default=DEFAULT_EVENTS, metavar="ENDPOINT",
                    help=f"the coordinator's events (PUB) endpoint (default {DEFAULT_EVENTS})")
    ap.add_argument("--admin", default=DEFAULT_ADMIN, metavar="URL",
                    help=f"the coordinator's HTTP address, serving /admin/* (default {DEFAULT_ADMIN}); "
                         "its admin token, when it has one, is read from the file $HYDRA_ADMIN_TOKEN_FILE names")
    ap.add_argument("--refresh", type=float, default=2.0, metavar="SECONDS",
                    help="seconds between admin API fetches (slots, queue, tok/s; default 2)")
    ap.add_argument("--curve-server-key", default=None, metavar="Z85",
                    help="the coordinator's CURVE public key, when its bus and events are encrypted")
    ap.add_argument("--events-token-file", default=None, metavar="FILE",
                    help="file holding the coordinator's events token (default: $HYDRA_EVENTS_TOKEN, the file "
                         "$HYDRA_EVENTS_TOKEN_FILE names, else the admin token from the environment)")
    return ap


def _parse(argv: list[str] | None) -> argparse.Namespace:
    ap = build_parser()
    args = ap.parse_args(argv)
    if not args.coordinator.startswith(("tcp://", "ipc://", "inproc://")):
        ap.error(f"--coordinator {args.coordinator!r}: expected a ZeroMQ endpoint like tcp://127.0.0.1:9501")
    if not args.admin.startswith(("http://", "https://")):
        ap.error(f"--admin {args.admin!r}: expected a URL like http://127.0.0.1:9000")
    if not 0.2 <= args.refresh <= 3600:
        ap.error("--refresh: between 0.2 and 3600 seconds")
    if args.curve_server_key is not None and len(args.curve_server_key) != 40:
        ap.error("--curve-server-key: a Z85 key is 40 characters")
    return args


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    token = None
    if args.events_token_file is not None:
        try:
            token = tokenfile.read_token(args.events_token_file)
        except tokenfile.TokenError as exc:
            print(f"hydra-console: --events-token-file: {exc}", file=sys.stderr)
            return 2
    app = HydraConsole(admin_url=args.admin, events=args.coordinator, refresh_s=args.refresh,
                       curve_server_key=args.curve_server_key, events_token=token)
    app.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
