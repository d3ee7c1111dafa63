"""``load_script``: import one of scripts/ (not a package) as a module, for tests of its functions."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def load_script(stem: str, name: str | None = None) -> ModuleType:
    """scripts/STEM.py as a module named ``name`` (default ``hydra_STEM``), loaded once per process.

    Registered in ``sys.modules`` before it runs, because dataclasses (and pickling) look a class's
    module up there."""
    name = name or f"hydra_{stem}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{stem}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module
