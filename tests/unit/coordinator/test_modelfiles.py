"""The model files door's Range parsing and its name lookup (no path from the URL is ever joined)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hydrad.common.registry import ModelEntry, Registry
from hydrad.coordinator.modelfiles import ModelFiles, byte_range
from hydrad.wire.openai import ApiError


@pytest.mark.parametrize(("header", "want"), [
    (None, None), ("bytes=0-", (0, 99)), ("bytes=10-19", (10, 19)), ("bytes=90-500", (90, 99)),
    ("bytes=-10", (90, 99)), ("bytes=-500", (0, 99)), ("bytes=5-4", None), ("bytes=1-2,4-5", None),
    ("items=0-1", None), ("bytes=-", None)])
def test_byte_range(header: str | None, want: tuple[int, int] | None) -> None:
    assert byte_range(header, 100) == want


@pytest.mark.parametrize("header", ["bytes=100-", "bytes=-0", "bytes=500-600"])
def test_a_range_past_the_end_is_416_with_the_size(header: str) -> None:
    with pytest.raises(ApiError) as exc:
        byte_range(header, 100)
    assert exc.value.status == 416 and exc.value.headers["Content-Range"] == "bytes */100"


def test_only_registry_files_under_models_dir_are_served(tmp_path: Path) -> None:
    root = tmp_path / "models"
    root.mkdir()
    (root / "m.gguf").write_bytes(b"GGUF")
    (tmp_path / "secret.gguf").write_bytes(b"GGUF")
    (root / "link.gguf").symlink_to(tmp_path / "secret.gguf")
    reg = Registry(root, {"m": ModelEntry(path="m.gguf", aliases=["m-alias"]),
                          "up": ModelEntry(path="../secret.gguf"), "abs": ModelEntry(path=str(tmp_path / "secret.gguf")),
                          "link": ModelEntry(path="link.gguf")})
    files = ModelFiles(reg, root, ["t" * 32], 0)
    assert files.path_of("m")[1] == (root / "m.gguf").resolve()
    assert files.path_of("m-alias")[1] == (root / "m.gguf").resolve()
    for name in ("up", "abs", "link", "m.gguf", "../secret.gguf", "nope"):
        with pytest.raises(ApiError) as exc:
            files.path_of(name)
        assert exc.value.status == 404, name
    with pytest.raises(ApiError) as exc:
        ModelFiles(reg, None, ["t" * 32], 0).path_of("m")
    assert exc.value.status == 404
