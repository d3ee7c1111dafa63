"""The console's widgets; each renders part of a :class:`tui.state.PoolState` and does no I/O."""

from tui.widgets.banner import Banner
from tui.widgets.detail import EngineDetail
from tui.widgets.engines import EnginesTable
from tui.widgets.loads import LoadBar, LoadsPanel
from tui.widgets.logs import EventLog, RouteLog
from tui.widgets.profiles import ConfirmSwitch, ProfilePicker, ProfilesPanel

__all__ = ["Banner", "ConfirmSwitch", "EngineDetail", "EnginesTable", "EventLog", "LoadBar", "LoadsPanel",
           "ProfilePicker", "ProfilesPanel", "RouteLog"]
