#!/usr/bin/env python3
"""Applies the project's patches to a llama.cpp source tree: unified diffs, applied strictly.

    apply_patches.py --tree DIR PATCH...        # change DIR's files in place
    apply_patches.py --check --tree DIR PATCH...  # only say whether each applies

scripts/build_llama_server applies ``patches/cuda/*.patch`` to a copy of the vendored source
before a CUDA build. Every hunk must match its context and removed lines exactly, at the line
the diff names (no offsets, no fuzz): a patch written for another llama.cpp is refused by file
and hunk rather than half applied. Nothing is written unless every hunk of every patch applies.
Only the standard library is used, so that a bare GPU host without ``patch`` or ``git`` can
run it.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


class PatchError(Exception):
    """A patch that does not apply, or is not a unified diff; says which file and hunk."""


@dataclass
class Hunk:
    old_start: int  # 1-based, as the diff writes it
    lines: list[str] = field(default_factory=list)  # ' ', '-' and '+' lines with their marker

    @property
    def old(self) -> list[str]:
        return [ln[1:] for ln in self.lines if ln[0] in " -"]

    @property
    def new(self) -> list[str]:
        return [ln[1:] for ln in self.lines if ln[0] in " +"]


@dataclass
class FilePatch:
    path: str  # relative to the tree, without the a/ b/ prefix
    hunks: list[Hunk] = field(default_factory=list)


def _strip(name: str) -> str:
    name = name.split("\t", 1)[0].strip()
    return name[2:] if name.startswith(("a/", "b/")) else name


def parse(text: str) -> list[FilePatch]:
    files: list[FilePatch] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
            new = _strip(lines[i + 1][4:])
            if new == "/dev/null":
                raise PatchError(f"{_strip(line[4:])}: deleting files is not supported")
            files.append(FilePatch(new))
            i += 2
            continue
        m = _HUNK.match(line)
        if m:
            if not files:
                raise PatchError(f"hunk before any file header: {line}")
            old_len = int(m.group(2) or 1)
            new_len = int(m.group(4) or 1)
            hunk = Hunk(int(m.group(1)))
            i += 1
            seen_old = seen_new = 0
            while i < len(lines) and (seen_old < old_len or seen_new < new_len):
                body = lines[i]
                if body.startswith("\\"):  # "\ No newline at end of file"
                    i += 1
                    continue
                marker = body[:1] or " "
                if marker not in " -+":
                    raise PatchError(f"{files[-1].path}: malformed hunk line {i + 1}: {body!r}")
                hunk.lines.append(marker + body[1:])
                seen_old += marker in " -"
                seen_new += marker in " +"
                i += 1
            if seen_old != old_len or seen_new != new_len:
                raise PatchError(f"{files[-1].path}: hunk at line {hunk.old_start} is cut short")
            files[-1].hunks.append(hunk)
            continue
        i += 1
    if not files:
        raise PatchError("no file in the patch")
    return files


def patched(original: str, fp: FilePatch) -> str:
    """The file's text with every hunk applied; PatchError naming the first hunk that does not match."""
    lines = original.split("\n")
    out: list[str] = []
    pos = 0  # next original line (0-based) not yet copied
    for n, hunk in enumerate(fp.hunks, 1):
        start = hunk.old_start - 1 if hunk.old else hunk.old_start
        if start < pos or lines[start:start + len(hunk.old)] != hunk.old:
            raise PatchError(f"{fp.path}: hunk {n} (line {hunk.old_start}) does not match the source")
        out.extend(lines[pos:start])
        out.extend(hunk.new)
        pos = start + len(hunk.old)
    out.extend(lines[pos:])
    return "\n".join(out)


def apply(tree: Path, patches: list[Path], check: bool = False) -> list[str]:
    """Apply every patch to ``tree`` (all or nothing); returns the files changed."""
    results: dict[Path, str] = {}
    for patch in patches:
        for fp in parse(patch.read_text()):
            target = tree / fp.path
            if not target.is_file():
                raise PatchError(f"{patch.name}: {fp.path} is not in {tree}")
            current = results.get(target, target.read_text())
            try:
                results[target] = patched(current, fp)
            except PatchError as exc:
                raise PatchError(f"{patch.name}: {exc}") from None
    if not check:
        for target, text in results.items():
            target.write_text(text)
    return sorted(str(t.relative_to(tree)) for t in results)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tree", type=Path, required=True, help="the llama.cpp source tree")
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 when a patch does not apply")
    ap.add_argument("patches", type=Path, nargs="+")
    args = ap.parse_args(argv)
    try:
        changed = apply(args.tree, args.patches, check=args.check)
    except PatchError as exc:
        print(f"apply_patches: {exc}", file=sys.stderr)
        return 1
    for name in changed:
        print(f"apply_patches: {'applies to' if args.check else 'patched'} {name}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
