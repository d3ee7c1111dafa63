"""The engine must load libllama before numpy (hydrad.engine.llama.preload_native): on the GPU host a
numpy imported first bound llama.cpp's C++ symbols to another copy of the runtime, and the first model
load crashed. Importing the daemon's entry point must therefore not import numpy."""

from __future__ import annotations

import subprocess
import sys

from tests.support.engine import REPO


def test_the_engine_entry_point_does_not_import_numpy() -> None:
    code = "import sys, hydrad.cli.hydrad; print(sorted(m for m in sys.modules if m.split('.')[0] == 'numpy')[:3])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", f"numpy imported before libllama by: {out.stdout.strip()}"
