"""Run a script of ``scripts/`` under this checkout's ``.venv``, whatever shell started it.

``scripts/NAME`` starts under the first ``python3`` on PATH (its ``#!/usr/bin/env python3`` line), while
the project's packages (httpx, pydantic, numpy, ``hydrad`` itself) live in the ``.venv`` that
``scripts/setup`` makes. A script that needs them starts with::

    if __name__ == "__main__":  # run as scripts/NAME: under the checkout's .venv when there is one
        import _venv
        _venv.reexec()

(``scripts/`` is the first entry of ``sys.path`` when a script in it runs), before it imports any of
them. ``reexec`` runs the same command line again under ``.venv/bin/python`` when that exists and is not
the running interpreter, and returns at once otherwise: without a ``.venv`` the script goes on where it
is and its first missing import names what is missing. A script imported as a module (tests, another
script) never gets here. Scripts that need only the standard library (``bundle``, ``fetch_models.py``,
``llama_wheel.py``: ``scripts/setup`` runs them before the ``.venv`` exists) do without it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

VENV = Path(__file__).resolve().parent.parent / ".venv"
# Set for the one re-executed process only: never run twice, even where .venv's interpreter does not
# say it is that venv (sys.prefix); taken out again so the script's own children start afresh.
_GUARD = "HYDRA_SCRIPT_VENV"


def _in_venv() -> bool:
    try:
        return Path(sys.prefix).resolve() == VENV.resolve()
    except OSError:
        return False


def reexec() -> None:
    """Replace this process by the same command under ``.venv/bin/python``; return when there is nothing to do."""
    python = VENV / "bin" / "python"
    tried = os.environ.pop(_GUARD, None)
    if tried is not None or _in_venv() or not os.access(python, os.X_OK):
        return
    os.environ[_GUARD] = str(python)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(python, [str(python), *sys.orig_argv[1:]])
