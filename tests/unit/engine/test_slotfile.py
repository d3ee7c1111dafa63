"""Slot file names and files: hostile names refused with a reason, atomic writes, no links followed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hydrad.engine.slotfile import (
    MAX_NAME, BadName, NotUsable, capacity_bytes, checked_name, open_slot_file, path_of, write_atomic,
)

HOSTILE = ["../x", "/etc/passwd", ".hidden", "a/b", "a\\b", "", "x" * 300, "x\x00y", "..", ".", "x..y",
           "\u2024\u2024", "ｘ.bin", "x\u202e.bin", "x\n", " x", "x ", "C:x", "~", "-x", "_x"]


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_names_are_refused(name: str) -> None:
    with pytest.raises(BadName) as exc:
        checked_name(name)
    assert str(exc.value)


@pytest.mark.parametrize("name", ["a", "slot-0.bin", "Conv_2024.12.01.kv", "x" * MAX_NAME, "0"])
def test_plain_names_pass(name: str) -> None:
    assert checked_name(name) == name


@settings(max_examples=500, deadline=None)
@given(st.text(max_size=200))
def test_no_name_leaves_the_directory(name: str) -> None:
    try:
        checked_name(name)
    except BadName:
        return
    base = Path("/srv/slots")
    assert path_of(base, name).parent == base and not name.startswith(".") and "/" not in name


def test_write_is_atomic_and_replaces(tmp_path: Path) -> None:
    d = tmp_path / "slots"
    assert write_atomic(d, "a.bin", [b"abc", memoryview(b"def")]) == 6
    assert (d / "a.bin").read_bytes() == b"abcdef" and oct(d.stat().st_mode & 0o777) == "0o700"

    def failing():
        yield b"new"
        raise OSError("disk full")

    with pytest.raises(OSError):
        write_atomic(d, "a.bin", failing())
    assert os.listdir(d) == ["a.bin"] and (d / "a.bin").read_bytes() == b"abcdef"  # the old file, whole
    write_atomic(d, "a.bin", [b"xyz"])
    assert (d / "a.bin").read_bytes() == b"xyz" and os.listdir(d) == ["a.bin"]


def test_open_refuses_links_other_files_and_big_ones(tmp_path: Path) -> None:
    d = tmp_path / "slots"
    d.mkdir()
    (tmp_path / "secret").write_bytes(b"s" * 10)
    (d / "link").symlink_to(tmp_path / "secret")
    (d / "sub").mkdir()
    os.mkfifo(d / "fifo")
    (d / "big").write_bytes(b"b" * 101)
    (d / "ok").write_bytes(b"k" * 100)
    for name, too_large in (("link", False), ("sub", False), ("fifo", False), ("big", True)):
        with pytest.raises(NotUsable) as exc:
            open_slot_file(d, name, 100)
        assert exc.value.too_large is too_large, name
    with pytest.raises(FileNotFoundError):
        open_slot_file(d, "missing", 100)
    f, size = open_slot_file(d, "ok", 100)
    with f:
        assert size == 100 and f.read() == b"k" * 100


def test_capacity_bound_covers_a_real_slot() -> None:
    # SmolLM2-135M: 30 layers, width 576, f16 KV of 3 heads of 64 per layer: 23,040 bytes a token
    assert capacity_bytes(4096, 30, 576) > 4096 * 23_040
