"""Tests for the offline bundle (scripts/bundle) and the CUDA wheel maker (scripts/llama_wheel.py).

Splitting into parts, the manifest, verification, reassembly (checked, atomic), the stripped
sdist and the wheel made of a standalone build's libraries, all on small synthetic files; no
network, no compiler. The whole path (scripts/bundle, then scripts/setup --from-bundle without
network) is run by hand, see docs/gpu-hosts.md.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import importlib.machinery
import importlib.util
import io
import json
import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str, path: Path) -> ModuleType:
    # scripts/ is not a package and scripts/bundle has no .py suffix: load by path.
    loader = importlib.machinery.SourceFileLoader(name, str(path))
    spec = importlib.util.spec_from_loader(name, loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look the module up
    loader.exec_module(module)
    return module


bd = _load("hydra_bundle", ROOT / "scripts" / "bundle")
lw = _load("hydra_llama_wheel", ROOT / "scripts" / "llama_wheel.py")

PART = 4096


def _file(path: Path, size: int, seed: int = 1) -> bytes:
    data = hashlib.shake_256(f"{seed}".encode()).digest(size) if size else b""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return data


def _bundle(tmp_path: Path, sizes: dict[str, int]) -> tuple[Path, dict[str, bytes], list]:
    src = tmp_path / "src"
    out = tmp_path / "bundle"
    out.mkdir()
    datas, entries = {}, []
    for i, (rel, size) in enumerate(sizes.items()):
        datas[rel] = _file(src / rel, size, seed=i)
        entries.append(bd.store(src / rel, out, rel, PART))
    bd.write_manifest(out, entries, {"hydra_commit": "0" * 40})
    return out, datas, entries


# --- splitting and the manifest -------------------------------------------------


def test_split_sizes_and_hashes(tmp_path: Path) -> None:
    out, datas, entries = _bundle(
        tmp_path,
        {"models/a.gguf": 2 * PART + 1808, "models/b.gguf": 2 * PART, "wheels/x.whl": PART, "e": 0},
    )
    a, b, x, e = entries
    assert [p.size for p in a.parts] == [PART, PART, 1808]
    assert [p.path for p in a.parts] == [f"models/a.gguf.part{i:03d}" for i in range(3)]
    assert [p.size for p in b.parts] == [PART, PART]  # an exact multiple: no empty last part
    assert x.parts == () and (out / "wheels/x.whl").read_bytes() == datas["wheels/x.whl"]
    assert e.parts == () and e.size == 0
    assert not (out / "models/a.gguf").exists()  # split files are stored as parts only
    for entry in entries:
        assert entry.sha256 == hashlib.sha256(datas[entry.path]).hexdigest()
        for s in entry.stored:
            stored = (out / s.path).read_bytes()
            assert len(stored) == s.size <= PART
            assert hashlib.sha256(stored).hexdigest() == s.sha256
    joined = b"".join((out / p.path).read_bytes() for p in a.parts)
    assert joined == datas["models/a.gguf"]


def test_manifest_and_sha256sums(tmp_path: Path) -> None:
    out, _, entries = _bundle(tmp_path, {"models/a.gguf": 3 * PART - 5, "wheels/x.whl": 10})
    manifest, read = bd.read_manifest(out)
    assert manifest["format"] == bd.FORMAT and manifest["hydra_commit"] == "0" * 40
    assert read == entries
    sums = (out / bd.SUMS).read_text().splitlines()
    assert len(sums) == 4  # 3 parts + 1 whole file
    # the format sha256sum -c reads
    r = subprocess.run(["sha256sum", "-c", "--quiet", bd.SUMS], cwd=out, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_verify_ok_then_damaged_and_missing(tmp_path: Path) -> None:
    out, _, entries = _bundle(tmp_path, {"models/a.gguf": 3 * PART, "wheels/x.whl": 100})
    assert bd.verify(out) == []
    part = out / entries[0].parts[1].path
    raw = bytearray(part.read_bytes())
    raw[17] ^= 0xFF
    part.write_bytes(bytes(raw))
    (out / entries[0].parts[2].path).unlink()
    (out / "wheels/x.whl").write_bytes(b"short")
    problems = bd.verify(out)
    assert len(problems) == 3
    assert any("a.gguf.part001: sha256" in p for p in problems)
    assert any("a.gguf.part002: missing" in p for p in problems)
    assert any("x.whl: size 5, expected 100" in p for p in problems)


def test_assemble_checks_and_is_atomic(tmp_path: Path) -> None:
    out, datas, entries = _bundle(tmp_path, {"models/a.gguf": 3 * PART + 7})
    dest = tmp_path / "models" / "a.gguf"
    assert bd.assemble(out, entries[0], dest) is True
    assert dest.read_bytes() == datas["models/a.gguf"]
    assert bd.assemble(out, entries[0], dest) is False  # present and right: left alone
    # a wrong file in place is replaced
    dest.write_bytes(b"x" * entries[0].size)
    assert bd.assemble(out, entries[0], dest) is True
    assert dest.read_bytes() == datas["models/a.gguf"]
    # a damaged part: an error naming it, nothing written, no temporary file left behind
    dest.unlink()
    part = out / entries[0].parts[2].path
    part.write_bytes(b"\0" * part.stat().st_size)
    with pytest.raises(bd.BundleError, match=r"a\.gguf\.part002"):
        bd.assemble(out, entries[0], dest)
    assert list(dest.parent.iterdir()) == []


def test_extract_flattens_prefix(tmp_path: Path) -> None:
    out, datas, _ = _bundle(
        tmp_path, {"models/a.gguf": 2 * PART + 1, "models/b.gguf": 10, "wheels/x.whl": 3}
    )
    to = tmp_path / "m"
    got = bd.extract(out, "models/", to, quiet=True)
    assert sorted(p.name for p in got) == ["a.gguf", "b.gguf"]
    assert (to / "a.gguf").read_bytes() == datas["models/a.gguf"]
    assert not (to / "x.whl").exists()
    with pytest.raises(bd.BundleError, match="nothing under"):
        bd.extract(out, "src/", to)


def test_manifest_rejects_paths_outside_the_bundle(tmp_path: Path) -> None:
    out, _, _ = _bundle(tmp_path, {"a": 10})
    manifest = json.loads((out / bd.MANIFEST).read_text())
    manifest["files"][0]["path"] = "../../etc/passwd"
    (out / bd.MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(bd.BundleError, match="unsafe path"):
        bd.read_manifest(out)
    (out / bd.MANIFEST).write_text(json.dumps({**manifest, "format": "other/9"}))
    with pytest.raises(bd.BundleError, match="format"):
        bd.read_manifest(out)


def test_cli_verify_and_extract(tmp_path: Path) -> None:
    out, datas, entries = _bundle(tmp_path, {"models/a.gguf": 2 * PART + 3})
    script = [sys.executable, str(ROOT / "scripts" / "bundle")]
    r = subprocess.run([*script, "--verify", str(out)], capture_output=True, text=True)
    assert r.returncode == 0 and "3 files ok" in r.stdout, r.stdout + r.stderr
    to = tmp_path / "models"
    r = subprocess.run([*script, "--extract", str(out), "--only", "models/", "--to", str(to)],
                       capture_output=True, text=True)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert (to / "a.gguf").read_bytes() == datas["models/a.gguf"]
    (out / entries[0].parts[0].path).write_bytes(b"")
    r = subprocess.run([*script, "--verify", str(out)], capture_output=True, text=True)
    assert r.returncode == 1 and "a.gguf.part000: size 0" in r.stderr


def test_a_missing_llama_build_fails_before_anything_is_written(tmp_path: Path) -> None:
    out = tmp_path / "bundle"
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "bundle"), str(out), "--no-models",
                        "--llama-build", str(tmp_path / "none.tar.xz")], capture_output=True, text=True)
    assert r.returncode == 1 and "--llama-build" in r.stderr and "none.tar.xz: no such file" in r.stderr
    assert not out.exists()


def test_parse_size() -> None:
    assert bd.parse_size("60M") == 60 << 20
    assert bd.parse_size("60MiB") == 60 << 20
    assert bd.parse_size("1g") == 1 << 30
    assert bd.parse_size("4096") == 4096
    assert bd.DEFAULT_PART_SIZE == 60 << 20
    with pytest.raises(argparse.ArgumentTypeError):
        bd.parse_size("lots")


# --- the stripped sdist and the wheel made of a standalone build -------------------


def _tar_add(tf: tarfile.TarFile, name: str, data: bytes) -> None:
    ti = tarfile.TarInfo(name)
    ti.size = len(data)
    tf.addfile(ti, io.BytesIO(data))


def _sdist(path: Path, extra: dict[str, bytes] | None = None) -> Path:
    top = "llama_cpp_python-0.3.36"
    files = {
        "PKG-INFO": b"Metadata-Version: 2.2\nName: llama_cpp_python\nVersion: 0.3.36\n"
                    b"Requires-Dist: numpy>=1.20.0\nRequires-Dist: pytest; extra == \"test\"\n\nLong text\n",
        "LICENSE.md": b"MIT",
        "llama_cpp/__init__.py": b"__version__ = '0.3.36'\n",
        "llama_cpp/llama_cpp.py": b"# bindings\n",
        "vendor/llama.cpp/CMakeLists.txt": b"project(llama)\n",
        "vendor/llama.cpp/models/ggml-vocab.gguf": b"v" * 100,
        "vendor/llama.cpp/docs/build.md": b"docs",
        "vendor/llama.cpp/ggml/src/ggml-cuda/ggml-cuda.cu": b"cuda",
        "vendor/llama.cpp/ggml/src/ggml-vulkan/ggml-vulkan.cpp": b"vk",
        "vendor/llama.cpp/tools/ui/index.html": b"<html>",
        "vendor/llama.cpp/tools/server/server.cpp": b"server",
        ".git/modules/vendor/llama.cpp/objects/pack/p.pack": b"g" * 100,
        **(extra or {}),
    }  # fmt: skip
    with tarfile.open(path, "w:gz") as tf:
        for rel, data in files.items():
            _tar_add(tf, f"{top}/{rel}", data)
    return path


def test_strip_sdist_keeps_what_builds_need(tmp_path: Path) -> None:
    src = _sdist(tmp_path / "in.tar.gz")
    dest = tmp_path / "out.tar.gz"
    kept, dropped = bd.strip_sdist(src, dest)
    with tarfile.open(dest) as tf:
        names = {n.split("/", 1)[1] for n in tf.getnames()}
    assert "vendor/llama.cpp/ggml/src/ggml-cuda/ggml-cuda.cu" in names
    assert "vendor/llama.cpp/tools/ui/index.html" in names
    assert "vendor/llama.cpp/tools/server/server.cpp" in names
    assert "llama_cpp/__init__.py" in names and "PKG-INFO" in names
    for gone in ("vendor/llama.cpp/models/ggml-vocab.gguf", "vendor/llama.cpp/docs/build.md",
                 "vendor/llama.cpp/ggml/src/ggml-vulkan/ggml-vulkan.cpp",
                 ".git/modules/vendor/llama.cpp/objects/pack/p.pack"):  # fmt: skip
        assert gone not in names
    assert (kept, dropped) == (8, 4)
    assert bd._sdist_requirements(src) == ["numpy>=1.20.0"]


def test_requirements_cover_project_and_test_extras() -> None:
    reqs = bd._project_requirements(ROOT)
    assert not any(r.lower().startswith("llama") for r in reqs)
    assert any(r.startswith("pytest") for r in reqs) and any(r.startswith("pyzmq") for r in reqs)
    tags = bd._platform_tags("2.28", "x86_64")
    assert tags[0] == "manylinux_2_28_x86_64" and "manylinux_2_17_x86_64" in tags
    assert "manylinux2014_x86_64" in tags


def _libs(tmp_path: Path) -> Path:
    libs = tmp_path / "build"
    libs.mkdir()
    for base, ver in (("libllama", "0.5.0"), ("libggml", "0.25.3"), ("libggml-base", "0.25.3"),
                      ("libggml-cuda", "0.25.3")):  # fmt: skip
        full = f"{base}.so.{ver}"
        (libs / full).write_bytes(base.encode() * 10)
        os.symlink(full, libs / f"{base}.so.{ver.split('.')[0]}")
        os.symlink(f"{base}.so.{ver.split('.')[0]}", libs / f"{base}.so")
    (libs / "llama-server").write_bytes(b"ELF")
    (libs / "BUILD-INFO").write_text("llama-cpp-python 0.3.36\n")
    return libs


def test_llama_wheel_from_a_standalone_build(tmp_path: Path) -> None:
    sdist = _sdist(tmp_path / "llama_cpp_python-0.3.36.tar.gz")
    wheel = lw.make_wheel(sdist, _libs(tmp_path), tmp_path / "out", machine="x86_64")
    assert wheel.name == "llama_cpp_python-0.3.36-py3-none-linux_x86_64.whl"
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        lib = {n.split("/")[-1] for n in names if n.startswith("llama_cpp/lib/")}
        # opened by path (plain) and linked by soname; the CUDA back end only by soname
        assert lib == {"libllama.so", "libllama.so.0", "libggml.so", "libggml.so.0",
                       "libggml-base.so", "libggml-base.so.0", "libggml-cuda.so.0"}  # fmt: skip
        assert zf.read("llama_cpp/lib/libggml-cuda.so.0") == b"libggml-cuda" * 10
        assert "llama_cpp/__init__.py" in names and "llama_cpp/llama_cpp.py" in names
        info = "llama_cpp_python-0.3.36.dist-info"
        assert b"Requires-Dist: numpy>=1.20.0" in zf.read(f"{info}/METADATA")
        assert b"Tag: py3-none-linux_x86_64" in zf.read(f"{info}/WHEEL")
        assert zf.getinfo("llama_cpp/lib/libllama.so").external_attr >> 16 & 0o111
        # RECORD lists every other file with its sha256 and size
        record = {}
        for line in zf.read(f"{info}/RECORD").decode().splitlines():
            path, digest, size = line.rsplit(",", 2)
            record[path] = (digest, size)
        assert set(record) == names
        for n in names - {f"{info}/RECORD"}:
            data = zf.read(n)
            want = "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            assert record[n] == (want, str(len(data)))


def test_llama_wheel_needs_libllama(tmp_path: Path) -> None:
    sdist = _sdist(tmp_path / "s.tar.gz")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(SystemExit, match="no libllama.so"):
        lw.make_wheel(sdist, empty, tmp_path / "out")


# --- scripts/setup's arguments (checked before anything is touched) ----------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--cuda-fa"], "--cuda-fa needs --cuda"),
        (["--from-bundle"], "--from-bundle needs a directory"),
        (["--from-bundle", "/nonexistent-bundle"], "is not a bundle"),
        (["--cpu", "--cuda", "90"], "exclude each other"),
        (["--bogus"], "unknown argument"),
    ],
)
def test_setup_rejects_bad_arguments(args: list[str], message: str) -> None:
    r = subprocess.run([str(ROOT / "scripts" / "setup"), *args], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and message in r.stderr, r.stderr


def test_setup_help_documents_gpu_and_bundle() -> None:
    r = subprocess.run([str(ROOT / "scripts" / "setup"), "--help"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0
    for word in ("--cuda [ARCH]", "--cuda-fa", "--from-bundle DIR", "--cpu"):
        assert word in r.stdout
