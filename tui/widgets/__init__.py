"""The console's widgets and screens; each renders part of a :class:`tui.model.PoolModel` (the engine screen
fetches through a function the app gives it, in a thread worker)."""

from tui.widgets.banner import Banner
from tui.widgets.detail import EngineDetail
from tui.widgets.engine_screen import EngineDetails, EngineScreen
from tui.widgets.engines import EnginesTable
from tui.widgets.help import HelpScreen
from tui.widgets.loads import LoadBar, LoadsPanel
from tui.widgets.logs import EventLog, RouteLog
from tui.widgets.profiles import ConfirmSwitch, ProfilePicker, ProfilesPanel, SwitchProgress

__all__ = ["Banner", "ConfirmSwitch", "EngineDetail", "EngineDetails", "EngineScreen", "EnginesTable", "EventLog",
           "HelpScreen", "LoadBar", "LoadsPanel", "ProfilePicker", "ProfilesPanel", "RouteLog", "SwitchProgress"]
