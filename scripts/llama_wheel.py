#!/usr/bin/env python3
"""Makes a llama-cpp-python wheel from a standalone llama.cpp build, without compiling.

    llama_wheel.py --sdist llama_cpp_python-0.3.36.tar.gz --libs BUILD_DIR --out WHEEL_DIR

``scripts/setup --cuda`` builds the vendored llama.cpp once with CMake (scripts/
build_llama_server: llama-server, llama-bench and the shared libraries, CUDA on). Building
llama-cpp-python's own wheel with CUDA would compile the same kernels a second time (minutes
to tens of minutes), so this puts the sdist's pure-Python package ``llama_cpp/`` and the
shared libraries of that one build into a wheel instead: the engine and the benchmark's
llama-server then run the very same library files.

The libraries go to ``llama_cpp/lib/`` (where llama_cpp and hydrad load them from) under the
names they are loaded by: the plain ``libX.so`` that code opens by path and the ``libX.so.N``
soname that the libraries link each other by (their rpath is ``$ORIGIN``). The fully
versioned ``libX.so.N.M.K`` is not needed. GPU back ends (``libggml-cuda`` ...) are only ever
reached through libggml's link, so they are stored once, under their soname.

The wheel's metadata is the sdist's PKG-INFO; its tag is ``py3-none-linux_<machine>`` like
the wheel that ``pip wheel`` builds from the sdist. Only the standard library is used.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import platform
import re
import sys
import tarfile
import zipfile
from pathlib import Path

# Loaded through libggml's link only, never opened by path: stored under the soname alone.
LINK_ONLY = re.compile(r"libggml-(cuda|hip|musa|vulkan|sycl|opencl)\.so$")
_SONAME = re.compile(r"(lib[\w.+-]+?\.so)\.(\d+)$")
_PLAIN = re.compile(r"lib[\w.+-]+?\.so$")


def library_files(libs: Path) -> dict[str, Path]:
    """Archive name under llama_cpp/lib -> file to read (symlinks followed)."""
    out: dict[str, Path] = {}
    for p in sorted(libs.iterdir()):
        name = p.name
        if not p.is_file():
            continue
        if _SONAME.fullmatch(name) or (_PLAIN.fullmatch(name) and not LINK_ONLY.fullmatch(name)):
            out[name] = p
    if "libllama.so" not in out:
        raise SystemExit(f"llama_wheel: no libllama.so in {libs}")
    plain = {n for n in out if _PLAIN.fullmatch(n)}
    for n in list(out):
        m = _SONAME.fullmatch(n)
        if m and m.group(1) not in plain and not LINK_ONLY.fullmatch(m.group(1)):
            raise SystemExit(f"llama_wheel: {n} has no {m.group(1)} beside it in {libs}")
    return out


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def make_wheel(sdist: Path, libs: Path, out_dir: Path, machine: str | None = None) -> Path:
    machine = machine or platform.machine()
    with tarfile.open(sdist, "r:gz") as tf:
        members = tf.getmembers()
        top = members[0].name.split("/", 1)[0]
        pkg_info = tf.extractfile(f"{top}/PKG-INFO").read()  # type: ignore[union-attr]
        meta = {}
        for line in pkg_info.decode().splitlines():
            if not line.strip():
                break
            key, _, value = line.partition(":")
            meta.setdefault(key.strip(), value.strip())
        name, version = meta["Name"], meta["Version"]
        dist = re.sub(r"[-_.]+", "_", name).lower()
        py_files = {}
        for m in members:
            rel = m.name[len(top) + 1:]
            if m.isfile() and rel.startswith("llama_cpp/") and not rel.startswith("llama_cpp/lib/"):
                py_files[rel] = tf.extractfile(m).read()  # type: ignore[union-attr]
        license_ = tf.extractfile(f"{top}/LICENSE.md").read() if f"{top}/LICENSE.md" in tf.getnames() else None  # type: ignore[union-attr]
    if "llama_cpp/__init__.py" not in py_files:
        raise SystemExit(f"llama_wheel: {sdist} has no llama_cpp/__init__.py")
    info = f"{dist}-{version}.dist-info"
    tag = f"py3-none-linux_{machine}"
    wheel_meta = (
        "Wheel-Version: 1.0\nGenerator: hydra scripts/llama_wheel.py\n"
        f"Root-Is-Purelib: false\nTag: {tag}\n"
    ).encode()
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{dist}-{version}-{tag}.whl"
    tmp = path.with_suffix(".whl.tmp")
    record = []
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=6) as zf:

        def add(arcname: str, data: bytes, mode: int = 0o644) -> None:
            zi = zipfile.ZipInfo(arcname, date_time=(2020, 1, 1, 0, 0, 0))
            zi.external_attr = (0o100000 | mode) << 16
            zi.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(zi, data)
            record.append(_record_line(arcname, data))

        for rel, data in sorted(py_files.items()):
            add(rel, data)
        for arcname, src in library_files(libs).items():
            add(f"llama_cpp/lib/{arcname}", src.read_bytes(), 0o755)
        add(f"{info}/METADATA", pkg_info)
        add(f"{info}/WHEEL", wheel_meta)
        if license_ is not None:
            add(f"{info}/licenses/LICENSE.md", license_)
        record.append(f"{info}/RECORD,,")
        zf.writestr(f"{info}/RECORD", "\n".join(record) + "\n")
    tmp.replace(path)
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sdist", type=Path, required=True, help="the llama-cpp-python sdist (.tar.gz)")
    ap.add_argument("--libs", type=Path, required=True, help="directory with libllama.so and friends")
    ap.add_argument("--out", type=Path, required=True, help="directory to write the wheel to")
    args = ap.parse_args(argv)
    print(make_wheel(args.sdist, args.libs, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
