"""The README as a user meets it: what Hydra is first, then the two set-up commands and a first
request, then one line per doc; and every command, flag, script and link it names exists.

(The install steps themselves run in a real systemd: tests/system/.)
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text(encoding="utf-8")
LINES = README.splitlines()
SETUP_COMMANDS = [
    "scripts/run     # set up, then start a local cluster (coordinator + two engines on the default models) "
    "and print how to use it",
    "scripts/test    # set up, then run the whole test suite",
]


def _blocks(text: str = README) -> list[str]:
    parts = text.split("```")
    return [parts[i].strip("\n") for i in range(1, len(parts), 2)]


def _first_line(pattern: str) -> int:
    for number, line in enumerate(LINES, 1):
        if re.search(pattern, line):
            return number
    raise AssertionError(f"no line of README.md matches {pattern!r}")


def test_what_it_is_then_the_commands_then_a_first_request() -> None:
    assert LINES[0] == "# Hydra"
    assert _first_line(r"^Hydra serves ") <= 15
    picture_end = [n for n, line in enumerate(LINES, 1) if line.startswith("```")][1]
    assert picture_end <= 15, "the picture of the pool must close within the first 15 lines"
    assert "hydra-coordinator" in "\n".join(LINES[:picture_end]) and "hydrad@" in "\n".join(LINES[:picture_end])
    commands = [b for b in _blocks() if b.startswith("scripts/run")]
    assert commands == ["\n".join(SETUP_COMMANDS)], "the two set-up commands must stay exactly as they are"
    assert _first_line(r"^scripts/run ") < _first_line(r"^curl -i http://127\.0\.0\.1:9000/v1/chat/completions") <= 60
    assert _first_line(r"^HTTP/1\.1 200 OK") <= 60, "what the first request shows"
    assert _first_line(r"^## Install on a host") > _first_line(r"^## Where to go next")


def test_where_to_go_next_lists_every_doc_once() -> None:
    section = README.split("## Where to go next", 1)[1].split("\n## ", 1)[0]
    listed = re.findall(r"^- \[(docs/[^\]]+)\]\((docs/[^)]+)\): \S", section, re.M)
    assert all(text == target for text, target in listed), listed
    docs = sorted(str(p.relative_to(REPO)) for p in (REPO / "docs").rglob("*.md"))
    assert sorted(t for _, t in listed) == docs, "one line per doc in docs/, no more, no less"


def test_every_link_resolves() -> None:
    for path in [REPO / "README.md", *(REPO / "docs").rglob("*.md")]:
        text = path.read_text(encoding="utf-8")
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
            if re.match(r"[a-z]+://", target):
                continue
            assert (path.parent / target).exists(), f"{path.relative_to(REPO)} links to missing {target}"


def _parsers() -> dict[str, argparse.ArgumentParser]:
    from hydrad.cli.hydrad import build_parser as hydrad
    from hydrad.cli.hydractl import build_parser as hydractl
    from hydrad.coordinator.daemon import build_parser as coordinator
    from tui.app import build_parser as console

    return {"hydrad": hydrad(), "hydra-coordinator": coordinator(), "hydractl": hydractl(), "hydra-console": console()}


def _subparser(parser: argparse.ArgumentParser, words: list[str]) -> argparse.ArgumentParser:
    """The parser of the deepest subcommand ``words`` name (``hydractl state get``)."""
    for word in words:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs or word not in subs[0].choices:
            break
        parser = subs[0].choices[word]
    return parser


def _command_lines(text: str) -> list[list[str]]:
    out = []
    for block in _blocks(text):
        for line in block.replace("\\\n", " ").splitlines():
            code = line.split("  #", 1)[0].split(" # ", 1)[0].strip()
            if not code or code.startswith("#"):
                continue
            try:
                words = shlex.split(code)
            except ValueError:
                continue
            while words and "=" in words[0] and not words[0].startswith("-"):
                words = words[1:]  # VAR=value prefixes
            if words:
                out.append(words)
    return out


@pytest.mark.parametrize("doc", ["README.md", "docs/hydractl.md", "docs/operations.md", "docs/gpu-hosts.md",
                                 "docs/development.md"])
def test_every_command_and_flag_named_in_a_code_block_exists(doc: str) -> None:
    parsers = _parsers()
    checked = 0
    for words in _command_lines((REPO / doc).read_text(encoding="utf-8")):
        program = os.path.basename(words[0])
        if words[0].startswith("scripts/"):
            script = REPO / words[0]
            assert script.is_file() and os.access(script, os.X_OK), f"{doc}: {words[0]} is not a script"
            continue
        if program not in parsers:
            continue
        parser = _subparser(parsers[program], [w for w in words[1:] if not w.startswith("-")])
        known = {o for a in parser._actions for o in a.option_strings}
        for word in words[1:]:
            flag = word.strip("[]|").split("=", 1)[0]  # usage-style lines write [--json] and [--token T | ...]
            if flag.startswith("--") and flag != "--":
                assert flag in known, f"{doc}: {' '.join(words)}: {parser.prog} has no {flag}"
        checked += 1
    assert checked or doc != "README.md"
