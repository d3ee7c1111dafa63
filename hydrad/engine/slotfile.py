"""Slot files (llama-server's ``--slot-save-path``): the names a client may give one, how one is
written and opened, and the largest one a slot could hold.

A slot file holds exactly the state stream ``GET /slots/{id}/state`` sends (STATE_META with the
model identity and the token list, STATE_DATA..., STATE_END with the data's xxh3-128), so a
restore runs the same checks as an upload: another model's state is refused from its meta before
any data is read, and a truncated or damaged file fails its digest. A file saved here can also be
``PUT`` back over HTTP, and a downloaded stream dropped into the directory restores the same way.

Names are checked, never cleaned up: a client that asks for ``../x`` gets a 400 saying why, not a
file called ``x``. What is allowed is deliberately narrow (ASCII letters, digits, ``.``, ``_``,
``-``; a letter or digit first, so no hidden names and no ``..``; at most 128 characters), so no
name can leave the directory, collide with the temporary files of a save, or mean something else
on another file system.
"""

from __future__ import annotations

import errno
import os
import re
import stat
import tempfile
from pathlib import Path
from typing import BinaryIO, Iterable

MAX_NAME = 128
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_TMP_PREFIX = ".slot-"  # a hidden name: no client can name it, so a half-written file is never restored
_HEADROOM = 1 << 20  # the stream's frames, the meta's token list, per-cell positions


class BadName(ValueError):
    """A file name a client may not use; the message says why."""


class NotUsable(ValueError):
    """The name is fine but what it names cannot be restored (not a regular file, too large)."""

    def __init__(self, message: str, too_large: bool = False) -> None:
        super().__init__(message)
        self.too_large = too_large


def checked_name(name: object) -> str:
    """``name`` when a client may use it as a slot file name, else BadName saying why."""
    if not isinstance(name, str):
        raise BadName("filename must be a string")
    if not name:
        raise BadName("filename must not be empty")
    if len(name) > MAX_NAME:
        raise BadName(f"filename may have at most {MAX_NAME} characters (got {len(name)})")
    if ".." in name:
        raise BadName("filename must not contain '..'")
    if not _NAME.fullmatch(name):
        raise BadName("filename may hold only ASCII letters, digits, '.', '_' and '-', and must begin with a letter "
                      "or digit (no paths, no hidden names)")
    return name


def path_of(directory: Path, name: str) -> Path:
    """The file ``name`` (already checked) in ``directory``; the check is repeated on the joined path
    so that a change to the name rules can never open a way out of the directory."""
    path = directory / checked_name(name)
    if path.parent != directory or path.name != name:
        raise BadName("filename must name a file directly in the slot directory")
    return path


def capacity_bytes(n_ctx_seq: int, n_layer: int, n_embd: int) -> int:
    """An upper bound on the state of one slot of a context: every cell of ``n_ctx_seq`` with K and V
    rows of up to twice the model's width (grouped-query models are narrower, a few wider) in f32 on
    every layer, plus the stream's own overhead. A file bigger than this cannot be a state of it."""
    return n_ctx_seq * 16 * n_layer * max(n_embd, 1) + _HEADROOM


def write_atomic(directory: Path, name: str, pieces: Iterable[bytes | memoryview]) -> int:
    """Write ``pieces`` as ``directory/name``, whole or not at all: a temporary file in the same
    directory, fsync, rename over the old file, fsync of the directory. Returns the bytes written."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    final = path_of(directory, name)
    fd, tmp = tempfile.mkstemp(prefix=_TMP_PREFIX, suffix=".part", dir=directory)
    written = 0
    try:
        with os.fdopen(fd, "wb") as f:
            for piece in pieces:
                f.write(piece)
                written += len(piece)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return written


def open_slot_file(directory: Path, name: str, limit: int) -> tuple[BinaryIO, int]:
    """The file ``name`` opened for reading, with its size. FileNotFoundError when there is none;
    NotUsable when it is not a regular file (a symbolic link is refused, not followed) or is larger
    than ``limit``, checked on the open file so nothing can swap it in between."""
    path = path_of(directory, name)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise NotUsable(f"'{name}' is a symbolic link; slot files are read only as regular files") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotUsable(f"'{name}' is not a regular file")
        if st.st_size > limit:
            raise NotUsable(f"'{name}' has {st.st_size} bytes; a slot of this engine holds at most {limit}",
                            too_large=True)
        return os.fdopen(fd, "rb"), st.st_size
    except BaseException:
        os.close(fd)
        raise
