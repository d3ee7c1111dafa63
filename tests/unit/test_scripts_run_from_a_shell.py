"""Every script in ``scripts/`` runs as ``scripts/NAME`` from a plain shell.

Each one's ``--help`` is run the way a developer types it, with nothing of this process's environment:
``env -i PATH=/usr/bin:/bin scripts/NAME --help`` (no virtualenv on PATH, no HOME, no PYTHONPATH). Python
scripts that need the project's packages re-run themselves under the checkout's ``.venv``
(``scripts/_venv.py``); the shell scripts answer ``--help`` before they set anything up. A new script is
picked up by this test on its own: it must be executable and take ``--help``, or be listed in
``NOT_COMMANDS`` with the reason.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "scripts"

# Files of scripts/ that are not commands, and why.
NOT_COMMANDS = {
    "_venv.py": "the helper the Python scripts import to re-run under .venv; not a command",
    "alloc_hold.py": "a module of bench_load_stall.py (--hold-alloc), imported, never run",
}
PLAIN_ENV = {"PATH": "/usr/bin:/bin"}


def _scripts() -> list[str]:
    return sorted(p.name for p in SCRIPTS.iterdir() if p.is_file() and not p.name.endswith((".pyc", "~")))


def test_every_file_is_a_command_or_listed_with_its_reason() -> None:
    for name in _scripts():
        path = SCRIPTS / name
        if name in NOT_COMMANDS:
            continue
        assert os.access(path, os.X_OK), f"scripts/{name} is not executable (chmod +x, or list it in NOT_COMMANDS)"
        assert path.read_text().startswith("#!/usr/bin/env "), f"scripts/{name}: no #!/usr/bin/env line"
    assert set(NOT_COMMANDS) <= set(_scripts()), "NOT_COMMANDS names a file that is gone"


@pytest.mark.parametrize("name", [n for n in _scripts() if n not in NOT_COMMANDS])
def test_help_from_a_plain_shell(name: str) -> None:
    out = subprocess.run(["/usr/bin/env", "-i", *(f"{k}={v}" for k, v in PLAIN_ENV.items()), f"scripts/{name}", "--help"],
                         cwd=REPO, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL, check=False)
    assert out.returncode == 0, f"scripts/{name} --help exited {out.returncode}:\n{out.stdout[-2000:]}{out.stderr[-3000:]}"
    assert out.stdout.strip(), f"scripts/{name} --help printed nothing"
    assert "Traceback" not in out.stderr, out.stderr


def test_a_python_script_outside_the_venv_runs_again_inside_it(tmp_path: Path) -> None:
    """The helper itself: started by a python3 that is not .venv's, a script ends up under .venv's
    interpreter with the same arguments; its children do not inherit the once-only guard."""
    venv_python = REPO / ".venv" / "bin" / "python"
    if not os.access(venv_python, os.X_OK):
        pytest.skip("no .venv in this checkout (scripts/setup makes it)")
    probe = tmp_path / "probe.py"
    probe.write_text(f"import sys, os\nsys.path.insert(0, {str(SCRIPTS)!r})\n"
                     "if __name__ == '__main__':\n"
                     "    import _venv\n"
                     "    _venv.reexec()\n"
                     "print(sys.prefix, sys.argv[1:], 'HYDRA_SCRIPT_VENV' in os.environ)\n")
    out = subprocess.run(["/usr/bin/env", "-i", "PATH=/usr/bin:/bin", "python3", str(probe), "a b", "--c"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=60, check=True)
    prefix, _, rest = out.stdout.strip().partition(" ")
    assert Path(prefix).resolve() == (REPO / ".venv").resolve(), out.stdout + out.stderr
    assert rest == "['a b', '--c'] False"
