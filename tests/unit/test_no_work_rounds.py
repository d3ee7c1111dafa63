"""The repository describes the product as it is: no file numbers or names a round of the work on it.

Commit messages are the history. A file that dates a finding by the numbered period of work that made
it, or points into docs/benchmarks.md by such a number instead of by a heading, makes a reader learn
that history to read the file, and the pointer breaks when the history is rewritten. So every tracked
text file (``git ls-files``) is read and each pattern below fails the test, named by file and line;
the sentences the patterns must and must not match are :data:`WORK` and :data:`DOMAIN`.

"Session" is also one of Hydra's own words: a chat session moves between engines, has a
``session_id`` and shares a prefix with other conversations; HTTP and the merged port have control
sessions; a fault test's next round moves a session again. :func:`test_the_patterns_tell_work_rounds_from_the_domain`
holds the patterns to sentences of both kinds, so a pattern that matches nothing, or the domain, fails first.

Pointers into docs/benchmarks.md name a section by its heading (``docs/benchmarks.md, "Overlap
reload"``); :func:`test_benchmark_pointers_name_a_heading` checks that each one names a heading there.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
THIS = Path(__file__).resolve().relative_to(REPO).as_posix()  # its samples would match: not scanned

# Files whose owner has yet to apply the replacements listed for them; each path maps to why it is
# here. Empty now. A path listed here must still match (the test says when it no longer does), so
# the list only ever shrinks; nothing new is to be added to it.
ALLOWED: dict[str, str] = {}

_UNITS = ("first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth", "ninth")
_TEENS = ("tenth", "eleventh", "twelfth", "thirteenth", "fourteenth", "fifteenth", "sixteenth",
          "seventeenth", "eighteenth", "nineteenth")
_TENS = ("twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety")
# The two lowest ordinals are everyday words for chat sessions; from the third on, an ordinal next to the
# word has only ever named a round of work here. Longest alternatives first.
_ORDINALS_UP = sorted(
    [*_UNITS[2:], *_TEENS, *(t[:-1] + "ieth" for t in _TENS),
     *(f"{t}-{u}" for t in _TENS for u in _UNITS)],
    key=len, reverse=True)
_ORDINAL = r"(?:" + "|".join(_ORDINALS_UP) + r"|\d+(?:st|nd|rd|th))"
_ANY_ORDINAL = r"(?:" + "|".join(sorted([*_ORDINALS_UP, "first", "second"], key=len, reverse=True)) + r"|\d+(?:st|nd|rd|th))"
_ROUND = r"(?:session|round|wave|sprint|iteration)s?"
_S = r"\s+"  # any run of white space, a line break included

PATTERNS: dict[str, re.Pattern[str]] = {name: re.compile(rx, re.IGNORECASE) for name, rx in {
    # an ordinal (word or digits) from the third up, next to session/round/wave/sprint; not after "a"
    # (a chat session sharing a prefix), nor followed by "of" (a round of kills)
    "ordinal round": rf"(?<![Aa] )\b{_ORDINAL}(?:{_S}(?:work|GPU|dev|development|benchmark)){{0,1}}{_S}{_ROUND}\b(?!{_S}of\b)",
    # a cardinal after session/round/wave/sprint, where a word before it points at one
    "numbered round": rf"\b(?:in|from|since|until|after|before|see|of|during){_S}(?:session|round|wave|sprint){_S}#?\d+\b"
                      rf"|\b(?:session|round|wave|sprint){_S}#\d+\b|\b(?:wave|sprint){_S}\d+\b"
                      rf"|^#+{_S}(?:session|round|wave|sprint){_S}\d+\b",
    # a pointer into docs/benchmarks.md by an ordinal instead of a heading
    "pointer by round": rf"benchmarks\.md,?{_S}(?:see{_S})?(?:the{_S})?{_ANY_ORDINAL}\b",
    # a preposition, then this / the last / the previous / the next session or round
    "this or last session": rf"\b(?:in|during|after|before|until|since|within|throughout){_S}"
                            rf"(?:this|the{_S}(?:last|previous|next)){_S}(?:GPU{_S})?(?:session|round)\b",
    # a verb of work done, then "this" session or round
    "done this session": rf"\b(?:built|new|fixed|measured|changed|made|ran|found|mended|added|left){_S}"
                         rf"(?:in{_S})?this{_S}(?:session|round)\b",
    # a session's or round's possessions that only a round of work has (its tables, tree, device, notes)
    "a session's work": rf"\b(?:first|second|last|previous|next|this|that|same|earlier|later){_S}(?:GPU{_S})?"
                        rf"(?:session|round)'s{_S}(?:section|table|tables|run|runs|figures?|tree|host|"
                        rf"device|GPU|notes?|changes?|commits?|work|plan|goal|measurements?)\b",
    # device or GPU time belonging to a session
    "a session's device time": rf"\b(?:GPU|device){_S}time{_S}(?:left{_S}|lent{_S})?(?:to|for|of|in){_S}"
                               rf"(?:this|the|that){_S}session\b|\bsession'?s?{_S}(?:GPU|device){_S}time\b",
    # a round, session or sprint "of work", and "work" before one of them
    "round of work": rf"\b(?:session|round|sprint|iteration)s?{_S}of{_S}work\b|\bwork{_S}(?:session|round|sprint)s?\b",
}.items()}

# Sentences that name a round of work: each must match. Written with {R}, {r} and {w} for "session",
# "round" and "wave" and filled in below, so this file itself holds no such sentence.
_WORK = [
    "the seventh {R}'s section",
    "the twenty-third {R}'s table updates",
    "## 2026-12-02, fourth {R}: the GPU host",
    "as the fourteenth {R} found,",
    "(docs/benchmarks.md, fourteenth\n{R})",
    "(docs/benchmarks.md, fourteenth and sixteenth {R}s)",
    "(see benchmarks.md, ninth ...)",
    "(docs/benchmarks.md, twenty-first {R})",
    "measured in {R} 23",
    "since {r} 12 the gap",
    "{w} 3 of the rewrite",
    "the 23rd {R}",
    "the 4th {r} measured the H100",
    "in this {R}",
    "It stays off until a GPU host measured it in the next {R}.",
    "Built this {R}",
    "not changed this {R}",
    "the last {R}'s tree",
    "this {R}'s device time was spent",
    "the GPU time left to this {R}",
    "which {r} of work measured it",
    "the eighth {R}'s profiler runs",
    "the nineteenth {R}'s 2.49",
]
WORK = [s.format(R="session", r="round", w="wave") for s in _WORK]
# Hydra's own sessions and rounds, as the tree uses them today: none may match.
DOMAIN = [
    "a second session sharing a system prompt: its state is read, cut to the",
    "The first session is cut at blocks; the second, finding",
    "the first turn of a session goes to the other one (load spreads).",
    "the second turn of the session goes to the engine holding its KV and reuses it.",
    "its KV now holds this session and this conversation.",
    "tokens of this session kept in the Store: any engine serving the model restores them",
    "The session's next turn must answer normally; the next round moves it on from where that turn ran.",
    "and dropped at the next round: never accepted.",
    "the second stream of each round ended the same way",
    "a third session sharing the prefix finds both",
    "the third round of kills restarts the coordinator",
    "five rounds per size, order alternating",
    "session_id 3 with X-Session-Id: 12",
    "sessions of about 1K, 2K and 4K tokens",
    "the next sessions find it",
    "a session's KV is moved or restored only when it pays",
    "the control session of the merged port",
    "the round trip to the peer",
    "(docs/benchmarks.md, \"Overlap reload\")",
]


def _hits(text: str) -> list[tuple[int, str, str]]:
    """(line, pattern name, matched text) for every match in ``text``."""
    out = []
    for name, rx in PATTERNS.items():
        for m in rx.finditer(text):
            out.append((text.count("\n", 0, m.start()) + 1, name, " ".join(m.group(0).split())))
    return sorted(out)


def _tracked_text_files() -> dict[str, str]:
    try:
        listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: nothing says which files are tracked")
    files = {}
    for raw in listed.split(b"\0"):
        if not raw:
            continue
        rel = raw.decode("utf-8", "surrogateescape")
        path = REPO / rel
        if rel == THIS or not path.is_file() or path.is_symlink():
            continue
        data = path.read_bytes()
        if b"\0" in data[:8192]:
            continue  # binary
        try:
            files[rel] = data.decode("utf-8")
        except UnicodeDecodeError:
            continue  # not text
    return files


def test_the_patterns_tell_work_rounds_from_the_domain() -> None:
    missed = [s for s in WORK if not _hits(s)]
    assert not missed, f"wording of a round of work that no pattern matches: {missed}"
    wrong = {s: _hits(s) for s in DOMAIN if _hits(s)}
    assert not wrong, f"Hydra's own use of session/round taken for a round of work: {wrong}"
    # every pattern earns its place: each matches at least one of the work sentences
    idle = [name for name, rx in PATTERNS.items() if not any(rx.search(s) for s in WORK)]
    assert not idle, f"patterns that match none of the samples: {idle}"


def test_no_tracked_file_numbers_a_round_of_work() -> None:
    files = _tracked_text_files()
    assert len(files) > 100 and "docs/benchmarks.md" in files  # the walk really read the tree
    found = {rel: hits for rel, text in files.items() if (hits := _hits(text))}
    report = [f"{rel}:{line}: {name}: {what!r}" for rel, hits in sorted(found.items()) if rel not in ALLOWED
              for line, name, what in hits]
    assert not report, ("wording that numbers or names a round of work (describe the product, point to a "
                        "heading of docs/benchmarks.md; the history goes in the commit message):\n"
                        + "\n".join(report))
    fixed = sorted(set(ALLOWED) - set(found))
    assert not fixed, f"allowed paths that no longer match, to be taken off ALLOWED: {fixed}"


def test_benchmark_pointers_name_a_heading() -> None:
    files = _tracked_text_files()
    headings = {" ".join(m.group(1).split()) for m in re.finditer(r"^#+\s+(.+?)\s*$", files["docs/benchmarks.md"], re.M)}
    pointer = re.compile(r"benchmarks\.md,\s+[\"“']([^\"”']+)[\"”']")
    stale = [f"{rel}:{text.count(chr(10), 0, m.start()) + 1}: {name!r}"
             for rel, text in sorted(files.items()) for m in pointer.finditer(text)
             if (name := " ".join(m.group(1).split())) not in headings]
    assert not stale, "pointers to a heading docs/benchmarks.md does not have:\n" + "\n".join(stale)
