"""llama-server's flags' values as hydrad reads them (numbers, lists, files named relative to where the
command runs) and the actions of the flags that do more than set one value: API keys, verbosity,
devices, LoRA adapters and control vectors. :mod:`hydrad.cli.llamaflagtable` names the flags."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

from hydrad.common import tokenfile
from hydrad.cli.llamaflagtypes import Apply, CommandLine, FlagError, State


def int_value(flag: str, value: str) -> int:
    try:
        return int(value, 10)
    except ValueError:
        raise FlagError(f"{flag}: needs a whole number, got {value!r}") from None


def float_value(flag: str, value: str) -> float:
    try:
        out = float(value)
    except ValueError:
        raise FlagError(f"{flag}: needs a number, got {value!r}") from None
    if not math.isfinite(out):
        raise FlagError(f"{flag}: needs a finite number, got {value!r}")
    return out


def list_value(value: str) -> list[str]:
    return [part.strip() for part in value.split(",") if part.strip()]


def absolute(value: str) -> Path:
    """A path given on the command line, relative to the directory hydrad starts in (as llama-server
    reads it), made absolute without following links: the name the operator gave stays visible."""
    return Path(os.path.abspath(Path(value).expanduser()))


def file_value(flag: str, value: str) -> Path:
    p = absolute(value)
    if not p.is_file():
        raise FlagError(f"{flag}: no such file: {value}")
    return p


def api_key(cl: CommandLine, state: State, flag: str, value: Any) -> None:
    keys = list_value(value)
    for key in keys:
        check_key(flag, key)
    state.keys += keys
    cl.warnings.append(f"{flag}: a key on the command line can be read by every user of this machine "
                       "(ps, /proc); --api-key-file keeps it in a file")


def api_key_file(cl: CommandLine, state: State, flag: str, value: Any) -> None:
    p = file_value(flag, value)
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise FlagError(f"{flag}: cannot read {value}: {exc}") from None
    keys = []
    for n, line in enumerate(lines, 1):
        key = line.strip()
        if not key or key.startswith("#"):
            continue
        check_key(f"{flag} {value}, line {n}", key)
        keys.append(key)
    if not keys:
        raise FlagError(f"{flag}: {value} holds no key (one a line; lines starting with # are comments)")
    state.keys += keys


def check_key(where: str, key: str) -> None:
    if not tokenfile.valid(key):
        raise FlagError(f"{where}: an API key must be {tokenfile.MIN_LENGTH} to {tokenfile.MAX_LENGTH} printable "
                        "ASCII characters without spaces")


VERBOSITY = {0: "error", 1: "error", 2: "warning", 3: "info", 4: "debug", 5: "debug"}


def verbosity(cl: CommandLine, _: State, flag: str, value: Any) -> None:
    n = int_value(flag, value)
    cl.set(("logging", "level"), VERBOSITY.get(n, "debug" if n > 5 else "error"), flag)


def device_action(cl: CommandLine, _: State, flag: str, value: Any) -> None:
    names = list_value(value)
    indices = []
    for name in names:
        if not (name.upper().startswith("CUDA") and name[4:].isdigit()):
            raise FlagError(f"{flag}: '{name}' is not served: hydrad names CUDA devices (CUDA0, CUDA1, ...); "
                            "'none' (no offload) is -ngl 0")
        indices.append(name[4:])
    if not indices:
        raise FlagError(f"{flag}: names no device")
    cl.set(("device",), ",".join(indices), flag)


def adapters(name: str, scaled: bool) -> Apply:
    """``--lora``/``--control-vector`` (files, comma-separated, scale 1) and their ``-scaled`` forms
    (``FNAME:SCALE,...``): each flag adds to the list, as llama-server's do."""
    def apply(cl: CommandLine, _: State, flag: str, value: Any) -> None:
        items = []
        for part in list_value(value):
            fname, scale = part, 1.0
            if scaled:
                fname, sep, text = part.rpartition(":")
                if not sep or not fname:
                    raise FlagError(f"{flag}: {part!r} is not FNAME:SCALE")
                scale = float_value(flag, text)
            items.append({"path": str(file_value(flag, fname)), "scale": scale})
        if not items:
            raise FlagError(f"{flag}: names no file")
        cl.set(("defaults", name), list(cl.get(("defaults", name)) or []) + items, flag)
    return apply


def layer_range(cl: CommandLine, _: State, flag: str, value: Any) -> None:
    start, end = (int_value(flag, v) for v in value)
    # llama-server's: a start or end at or below 0 means the first layer or the last one
    cl.set(("defaults", "control_vector_layer_range"), [max(start, 0), max(end, 0)], flag)


# ----- the table ---------------------------------------------------------------------------------------
