"""What the coordinator remembers across restarts: the active profile.

One small JSON file, ``<state_dir>/<name>.state.json`` (``{"active_profile": "swapped",
"saved_at": <unix time>}``), rewritten atomically whenever a switch begins: written to a
temporary file in the same directory, flushed with ``fsync``, renamed over the old one, and
the directory synced, so a crash or power loss leaves either the old name or the new one,
never half a file.

At start the saved name wins over ``default_profile``: a pool switched to ``swapped`` comes
back as ``swapped`` after ``systemctl restart hydra-coordinator``. A file that cannot be read,
is not this format, or names a profile the profiles file no longer has is logged as a warning
and the default applies; the state file can never stop the coordinator from starting.

``state_dir`` (a coordinator setting) defaults to systemd's ``$STATE_DIRECTORY``
(``StateDirectory=hydra`` in the unit: ``/var/lib/hydra``) when set, else
``$XDG_STATE_HOME/hydra``, else ``~/.local/state/hydra``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from hydrad.common.logs import log_event

log = logging.getLogger("hydra.coordinator.state")

FORMAT_KEY = "active_profile"


def default_state_dir(environ: Mapping[str, str] | None = None) -> Path:
    """``$STATE_DIRECTORY`` (first entry; systemd's StateDirectory=), else the XDG state home."""
    env = os.environ if environ is None else environ
    systemd = (env.get("STATE_DIRECTORY") or "").split(":")[0].strip()
    if systemd:
        return Path(systemd)
    xdg = (env.get("XDG_STATE_HOME") or "").strip()
    base = Path(xdg) if xdg and Path(xdg).is_absolute() else Path.home() / ".local" / "state"
    return base / "hydra"


class StateFile:
    """The coordinator's state file; :meth:`load` and :meth:`save` never raise."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.missing = False  # the last load found no file at all (a first start, not a problem)

    @classmethod
    def for_settings(cls, settings: Any, environ: Mapping[str, str] | None = None) -> "StateFile":
        base = settings.state_dir if settings.state_dir is not None else default_state_dir(environ)
        return cls(Path(base) / f"{settings.name}.state.json")

    def load(self) -> tuple[str | None, str | None]:
        """(saved profile name, None), or (None, why there is none usable: missing, unreadable, corrupt)."""
        self.missing = False
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            self.missing = True
            return None, f"no saved state at {self.path}"
        except OSError as exc:
            return None, f"cannot read {self.path}: {exc.strerror or exc}"
        try:
            doc = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError):
            return None, f"{self.path} is not valid JSON"
        name = doc.get(FORMAT_KEY) if isinstance(doc, dict) else None
        if not isinstance(name, str) or not name:
            return None, f"{self.path} has no '{FORMAT_KEY}' string"
        return name, None

    def save(self, profile: str) -> bool:
        """Write ``profile`` atomically (temp + fsync + rename + directory fsync); False (logged) on failure."""
        body = json.dumps({FORMAT_KEY: profile, "saved_at": round(time.time(), 3)}).encode() + b"\n"
        tmp: str | None = None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o750)
            fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp", dir=self.path.parent)
            try:
                os.write(fd, body)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self.path)
            tmp = None
            dfd = os.open(self.path.parent, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        except OSError as exc:
            log_event(log, logging.WARNING, "cannot save the active profile", path=str(self.path), profile=profile,
                      error=exc.strerror or str(exc))
            return False
        finally:
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
        return True


@dataclass(frozen=True)
class StartProfile:
    """The profile to apply at start, and why that one."""

    name: str | None
    source: str  # "saved" | "default_profile" | "profiles-default" | "none"
    reason: str
    warn: bool = False  # a saved state was there but unusable (corrupt, unreadable, unknown profile)


def choose_start_profile(settings: Any, profiles: Any, state: StateFile | None) -> StartProfile:
    """The saved profile when it is still a profile; else ``default_profile``; else the profiles file's default."""
    fallback = settings.default_profile or profiles.default_name
    fb_source = "default_profile" if settings.default_profile else ("profiles-default" if fallback else "none")
    if state is None:
        return StartProfile(fallback, fb_source, "no state file configured")
    saved, why = state.load()
    if saved is None:
        return StartProfile(fallback, fb_source, why or "nothing saved", warn=not state.missing)
    if saved not in profiles.profiles:
        known = ", ".join(sorted(profiles.profiles)) or "none"
        return StartProfile(fallback, fb_source,
                            f"the saved profile {saved!r} is not in the profiles file (known: {known})", warn=True)
    return StartProfile(saved, "saved", f"the active profile before the restart, from {state.path}")
