"""A llama.cpp build made on one host is exported and imported on another (scripts/build_llama_server
``--export`` / ``--import`` / ``--no-build``), so a GPU host can skip minutes of compiling.

The build these tests move is the real CPU build of llama-server in this machine's cache; making one
takes several minutes on two cores, so without it they skip and say so. The archive is imported into
a fresh cache directory, and what comes out must run.
"""

from __future__ import annotations

import os
import subprocess
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "build_llama_server"
pytestmark = pytest.mark.slow  # xz archives of a whole build: about 40 s on 2 cores


def _run(*args: str | Path, cache: Path | None = None, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if cache is not None:
        env["HYDRA_CACHE_DIR"] = str(cache)
    return subprocess.run([str(SCRIPT), *map(str, args)], capture_output=True, text=True, env=env, cwd=cwd,
                          timeout=300, stdin=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The cached CPU build, exported once: (the archive, the build's own binary)."""
    found = _run("-q", "--no-build")
    if found.returncode == 3:
        pytest.skip("no CPU llama-server build in this machine's cache (scripts/build_llama_server makes one, "
                    "several minutes on 2 cores)")
    assert found.returncode == 0, found.stderr
    archive = tmp_path_factory.mktemp("export") / "build.tar.xz"
    out = _run("--no-build", "--export", archive)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == found.stdout.strip()  # the path stays the last line
    assert "exported build" in out.stderr
    return archive, Path(found.stdout.strip())


def test_an_exported_build_is_imported_and_runs(exported: tuple[Path, Path], tmp_path: Path) -> None:
    archive, original = exported
    key = original.parent.name
    with tarfile.open(archive) as tar:
        names = tar.getnames()
    assert {n.split("/")[0] for n in names} == {key}
    assert f"{key}/.complete" in names and f"{key}/llama-server" in names

    cache = tmp_path / "cache"
    assert _run("--no-build", cache=cache).returncode == 3  # an empty cache has nothing to find
    # a relative path is the caller's, not the script's directory
    out = _run("--no-build", "--import", archive.name, cache=cache, cwd=archive.parent)
    assert out.returncode == 0, out.stderr
    binary = Path(out.stdout.strip().splitlines()[-1])
    assert binary == cache / "llama-server" / key / "llama-server"
    assert f"imported build {key}" in out.stderr
    version = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=60)
    assert version.returncode == 0 and "version" in (version.stdout + version.stderr).lower()
    # found the second time, without the archive
    again = _run("--no-build", cache=cache)
    assert again.returncode == 0 and again.stdout.strip() == str(binary)


def _rewritten(archive: Path, dest: Path, key: str, *, new_key: str | None = None,
               extra: str | None = None) -> Path:
    """A copy of ``archive`` whose top directory is ``new_key`` (default: as it was), plus an empty
    entry named ``extra``."""
    with tarfile.open(archive) as src, tarfile.open(dest, "w:xz") as dst:
        for member in src.getmembers():
            data = src.extractfile(member) if member.isfile() else None
            if new_key is not None:
                member.name = new_key + member.name[len(key):]
            dst.addfile(member, data)
        if extra is not None:
            dst.addfile(tarfile.TarInfo(extra))
    return dest


def test_an_archive_of_other_flags_is_named_and_left_alone(exported: tuple[Path, Path], tmp_path: Path) -> None:
    archive, original = exported
    key = original.parent.name
    other = _rewritten(archive, tmp_path / "other.tar.xz", key, new_key="0123456789abcdef")
    cache = tmp_path / "cache"
    out = _run("--no-build", "--import", other, "--import", tmp_path / "missing.tar.xz", cache=cache)
    assert out.returncode == 3
    assert f"holds build 0123456789abcdef; these flags make {key}: not used" in out.stderr
    assert "missing.tar.xz: no such file" in out.stderr
    assert not (cache / "llama-server" / key).exists()


def test_a_damaged_archive_leaves_nothing_behind(exported: tuple[Path, Path], tmp_path: Path) -> None:
    archive, original = exported
    key = original.parent.name
    cut = tmp_path / "cut.tar.xz"
    cut.write_bytes(archive.read_bytes()[: archive.stat().st_size // 2])
    cache = tmp_path / "cache"
    out = _run("--no-build", "--import", cut, cache=cache)
    assert out.returncode == 3 and "damaged" in out.stderr
    left = sorted(p.name for p in (cache / "llama-server").iterdir())
    assert left == [f"{key}.lock"], left


def test_an_archive_reaching_outside_its_build_is_refused(exported: tuple[Path, Path], tmp_path: Path) -> None:
    archive, original = exported
    key = original.parent.name
    evil = _rewritten(archive, tmp_path / "evil.tar.xz", key, extra=f"{key}/../escaped")
    cache = tmp_path / "cache"
    out = _run("--no-build", "--import", evil, cache=cache)
    assert out.returncode == 3 and "entries outside" in out.stderr
    assert not (cache / "llama-server" / "escaped").exists()
    assert not (cache / "llama-server" / key).exists()


@pytest.mark.parametrize("args, message", [
    (["--force", "--no-build"], "exclude each other"),
    (["--import"], "--import needs a file"),
    (["--export"], "--export needs a file"),
])
def test_bad_arguments(args: list[str], message: str) -> None:
    out = _run(*args)
    assert out.returncode == 2 and message in out.stderr
