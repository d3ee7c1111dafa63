"""llama-server's command line, as ``hydrad`` reads it: ``hydrad -m model.gguf --port 8080 -c 4096``
starts the engine that ``llama-server`` with the same flags would be.

Every flag of the llama-server that llama-cpp-python 0.3.36 vendors (its ``tools/server/README.md``),
and the older spellings scripts still use (``--no-mmap``, ``--mlock``, ``-fa`` without a value), is
one of four kinds, so that none is silently dropped:

- **mapped**: it sets the engine setting a YAML file sets (``-c`` is ``defaults.n_ctx``, ``--port`` is
  ``http.port``), with the same validation;
- **accepted**: it asks for what hydrad always does (``--cont-batching``, ``--metrics``), so it
  changes nothing;
- **neutral values**: accepted at the values under which llama-server behaves as hydrad does
  (``--mirostat 0``), refused at any other;
- **refused**: hydrad cannot honour it; it exits 2 naming the flag and the reason.

A flag neither hydrad nor llama-server knows is refused the same way. The flags make a settings
layer of the YAML's shape (:class:`CommandLine`); ``--config FILE`` lies over it, field by field.
"""

from __future__ import annotations

import argparse
from typing import Any

from pydantic import ValidationError

from hydrad.cli.llamaflagtable import BY_NAME, FLAGS, file_value
from hydrad.cli.llamaflagtypes import CommandLine, Flag, FlagError, State
from hydrad.common.params import check_partial

__all__ = ["BY_NAME", "FLAGS", "CommandLine", "Flag", "FlagError", "add_to", "check", "read", "refuse_alone"]


# ----- the parser --------------------------------------------------------------------------------------

class _Record(argparse.Action):
    """Keeps each llama-server flag, in order, for :func:`read` (the last of a setting wins, as in
    llama-server); a refused one ends the parse at once with its reason."""

    def __init__(self, option_strings: list[str], dest: str, flag: Flag, **kw: Any) -> None:
        self.flag = flag
        super().__init__(option_strings, dest, **kw)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        name = option_string or self.flag.names[0]
        if isinstance(values, list):
            value = values if len(values) > 1 else (values[0] if values else None)
        else:
            value = values
        if self.flag.kind == "refused" or (self.flag.kind == "neutral" and not _is_neutral(self.flag, value)):
            at = "" if self.flag.kind == "refused" else f" {value}"
            parser.exit(2, f"hydrad: {name}{at}: not supported: {self.flag.help}\n")
        recorded = getattr(namespace, "llama_flags", None) or []
        recorded.append((name, self.flag, value))
        namespace.llama_flags = recorded


def refuse_alone(parser: argparse.ArgumentParser, action: argparse.Action) -> None:
    """A refused flag given without the value it takes: its refusal, not argparse's "expected one
    argument" (which would not say why)."""
    if isinstance(action, _Record) and action.flag.kind == "refused":
        parser.exit(2, f"hydrad: {action.flag.names[-1]}: not supported: {action.flag.help}\n")


def _is_neutral(flag: Flag, value: Any) -> bool:
    """Whether ``value`` is one of the flag's neutral values (numbers compared as numbers: 0.0 is 0)."""
    if value in flag.neutral:
        return True
    try:
        number = float(value)
    except (TypeError, ValueError):
        return False
    for v in flag.neutral:
        try:
            if float(v) == number:
                return True
        except ValueError:
            continue
    return False


def add_to(parser: argparse.ArgumentParser) -> None:
    """llama-server's flags on hydrad's parser: those hydrad honours (mapped, or accepted as no-ops) in
    one group, those it refuses in another, each with what it does here or why it is refused."""
    honoured = parser.add_argument_group("llama-server's flags", "each sets the engine setting named after it "
                                         "(the YAML's; --config's file wins where both set one), or is accepted "
                                         "and changes nothing, as its text says")
    refused = parser.add_argument_group("llama-server's flags hydrad refuses", "each exits 2 naming the flag and "
                                        "this reason; a flag below marked 'only' is accepted at those values")
    for f in FLAGS:
        group = refused if f.kind in ("refused", "neutral") else honoured
        kw: dict[str, Any] = {"dest": "llama_flags", "default": None, "flag": f}
        if f.optional is not None:
            kw.update(nargs="?", const=f.optional, metavar=f.metavar)
        elif f.takes_value():
            kw.update(nargs=f.nargs, metavar=tuple((f.metavar or "").split()) if f.nargs > 1 else f.metavar)
        else:
            kw.update(nargs=0)
        help_text = f.help
        if f.kind == "accepted":
            help_text = "accepted, changes nothing: " + help_text
        elif f.kind == "neutral":
            help_text = f"only {' or '.join(f.neutral)}: " + help_text
        kw["help"] = help_text.replace("%", "%%")
        group.add_argument(*f.names, action=_Record, **kw)


# ----- from the recorded flags to settings --------------------------------------------------------------

def read(recorded: list[tuple[str, Flag, Any]] | None) -> CommandLine:
    """The settings layer of the flags as given (FlagError naming the first that cannot be used)."""
    cl = CommandLine()
    state = State()
    for name, flag, value in recorded or []:
        if flag.apply is not None:
            flag.apply(cl, state, name, value)
    _model_and_aliases(cl, state)
    if state.model is not None and cl.get(("http", "metrics_endpoint")) is None:
        # llama-server's command line serves /metrics only with --metrics: the same line does here
        cl.set(("http", "metrics_endpoint"), False, state.model[0])
    if state.keys:
        cl.api_keys = tuple(dict.fromkeys(state.keys))
    check(cl)
    return cl


def _model_and_aliases(cl: CommandLine, state: State) -> None:
    """``-m`` makes an entry of the engine's own registry (``models``), named by the first alias, else
    by the file's name as llama-server names it; the boot model (``defaults.model``) is that entry."""
    if state.model is None:
        if state.aliases is not None:
            raise FlagError(f"{state.aliases[0]}: names the model -m/--model loads; with --config, give a "
                            "model's aliases in the registry (models.yaml, aliases:)")
        return
    flag, value = state.model
    path = file_value(flag, value)
    names = state.aliases[1] if state.aliases is not None else [path.name]
    key, more = names[0], [n for n in dict.fromkeys(names[1:]) if n != names[0]]
    entry: dict[str, Any] = {"path": str(path)}
    if more:
        entry["aliases"] = more
    cl.set(("models", key), entry, state.aliases[0] if state.aliases is not None else flag)
    cl.set(("defaults", "model"), key, flag)


def check(cl: CommandLine) -> None:
    """Every value validated as the YAML's would be, the error naming the flag that gave it."""
    from hydrad.engine.settings import EngineSettings

    for key, value in (cl.layer.get("defaults") or {}).items():
        if key == "model":
            continue
        try:
            check_partial({key: value})
        except ValueError as exc:
            raise FlagError(f"{cl.origin[('defaults', key)]}: {exc}") from None
    try:
        EngineSettings(**{k: v for k, v in cl.layer.items() if k != "defaults"})
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = tuple(err["loc"])
        where = ".".join(str(p) for p in loc)
        raise FlagError(f"{cl.flag_of(loc) or where}: {where}: {err['msg']}") from None
    except ValueError as exc:  # a registry name claimed twice
        raise FlagError(str(exc)) from None


__all__ = ["CommandLine", "Flag", "FlagError", "FLAGS", "BY_NAME", "add_to", "read"]
