"""A pool's default store directory is on a tmpfs every local user can write to (``/dev/shm``), so
it is made and checked as this user's alone before anything is read from it or written to it.

A KV state read from the store goes into an engine's slot as the prompt's cache: a directory
another user could write to would let them plant what a pool's requests continue from, and one
they could read would hand them the conversations. So the pool's directory is created mode 0700,
and an existing one is refused (StoreError naming it and the fix) when it is a symbolic link, is
owned by another user, or may be opened by others; so is the root above it when another user
could replace the pool's directory in it.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from hydrad.store.errors import StoreError


def _check(path: Path, *, shared_root: bool) -> None:
    try:
        st = os.lstat(path)
    except OSError as exc:
        raise StoreError(f"cannot use {path} as a store directory: {exc.strerror or exc}") from None
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise StoreError(f"{path} is not a directory (a symbolic link or a file): refused as a store directory; "
                         "remove it or set the store's dir")
    mine = st.st_uid == os.geteuid()
    if shared_root:
        # the root may be another user's only if that user is root and the directory is sticky (like /tmp):
        # then nobody else can rename or remove the pools' directories in it
        if not mine and not (st.st_uid == 0 and st.st_mode & stat.S_ISVTX):
            raise StoreError(f"{path} belongs to user {st.st_uid}, who could replace this pool's store directory "
                             "in it; set XDG_RUNTIME_DIR or the store's dir")
        if mine and st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
            raise StoreError(f"{path} may be written by other users: chmod 700 {path}")
        return
    if not mine:
        raise StoreError(f"the store directory {path} belongs to user {st.st_uid}, not to this process's user "
                         f"{os.geteuid()}: refused (another user could read or plant KV states)")
    if st.st_mode & 0o077:
        raise StoreError(f"the store directory {path} may be opened by other users "
                         f"(mode {stat.S_IMODE(st.st_mode):04o}): chmod 700 {path}")


def pool_dir(path: Path) -> None:
    """Create ``path`` (a pool's default store directory) and its root, each mode 0700 when missing,
    and check both; StoreError when either cannot be trusted."""
    for p, shared in ((path.parent, True), (path, False)):
        try:
            p.mkdir(mode=0o700, exist_ok=True)
        except FileNotFoundError:
            p.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot create the store directory {p}: {exc.strerror or exc}") from None
        _check(p, shared_root=shared)
