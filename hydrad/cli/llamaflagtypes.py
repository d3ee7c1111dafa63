"""The shapes of llama-server's command line as ``hydrad`` reads it (:mod:`hydrad.cli.llamaflags`):
a flag, the settings layer the flags make, and the refusal of one."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Literal

Path_ = tuple[str, ...]  # a settings path: ("defaults", "n_ctx"), ("http", "port")


class FlagError(ValueError):
    """A flag that cannot be used as given; the message names the flag and why (exit 2)."""


@dataclass
class CommandLine:
    """What the llama-server flags of one command line say: a settings layer in the YAML's shape,
    which flag set each of its fields, and the API keys (kept out of the layer: a secret never goes
    where ``--print-config`` or a log could show it)."""

    layer: dict[str, Any] = field(default_factory=dict)
    origin: dict[Path_, str] = field(default_factory=dict)
    api_keys: tuple[str, ...] = ()
    warnings: list[str] = field(default_factory=list)

    def set(self, path: Path_, value: Any, flag: str) -> None:
        node = self.layer
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = value
        self.origin[path] = flag

    def get(self, path: Path_) -> Any:
        node: Any = self.layer
        for part in path:
            if not isinstance(node, dict) or part not in node:
                return None
            node = node[part]
        return node

    def flag_of(self, loc: tuple[Any, ...]) -> str | None:
        """The flag that set the field at ``loc`` (a validation error's location), or above it."""
        for n in range(len(loc), 0, -1):
            flag = self.origin.get(tuple(str(p) for p in loc[:n]))
            if flag is not None:
                return flag
        return None

    def __bool__(self) -> bool:
        return bool(self.origin) or bool(self.api_keys)


class State:
    """What the flags of one command line leave for the steps that need several of them."""

    def __init__(self) -> None:
        self.model: tuple[str, str] | None = None  # (the flag as typed, its value)
        self.aliases: tuple[str, list[str]] | None = None
        self.keys: list[str] = []


Apply = Callable[[CommandLine, State, str, Any], None]


@dataclass(frozen=True)
class Flag:
    """One llama-server flag: its spellings, what its value looks like (``metavar``; None: it takes
    none), the value it means when given without one (``optional``), and what it does here (``help``:
    the setting it sets, or why it is accepted or refused)."""

    names: tuple[str, ...]
    metavar: str | None
    help: str
    kind: Literal["mapped", "accepted", "neutral", "refused"]
    apply: Apply | None = None
    neutral: tuple[str, ...] = ()
    optional: str | None = None
    nargs: int = 1  # the values it takes when it takes any (--control-vector-layer-range: START END)

    def takes_value(self) -> bool:
        return self.metavar is not None
