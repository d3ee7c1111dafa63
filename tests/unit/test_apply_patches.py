"""scripts/apply_patches.py: the project's patches to llama.cpp apply strictly, or not at all."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.scripts import load_script

REPO = Path(__file__).resolve().parents[2]
VENDORED = Path.home() / ".cache" / "hydra" / "src" / "llama-cpp-python-0.3.36" / "vendor" / "llama.cpp"

ap = load_script("apply_patches")

ORIGINAL = "one\ntwo\nthree\nfour\nfive\nsix\n"
PATCH = """Why this change: a description an upstream pull request would carry.

--- a/src/f.txt
+++ b/src/f.txt
@@ -2,3 +2,4 @@
 two
-three
+THREE
+three and a half
 four
@@ -6,1 +7,1 @@
-six
+SIX
"""


def _tree(tmp_path: Path, text: str = ORIGINAL) -> Path:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "f.txt").write_text(text)
    return tmp_path


def test_a_patch_applies_hunk_by_hunk(tmp_path: Path) -> None:
    tree = _tree(tmp_path)
    patch = tmp_path / "p.patch"
    patch.write_text(PATCH)
    assert ap.apply(tree, [patch]) == ["src/f.txt"]
    assert (tree / "src" / "f.txt").read_text() == "one\ntwo\nTHREE\nthree and a half\nfour\nfive\nSIX\n"


def test_a_hunk_that_does_not_match_changes_nothing_and_names_itself(tmp_path: Path) -> None:
    tree = _tree(tmp_path, ORIGINAL.replace("six", "seven"))
    patch = tmp_path / "p.patch"
    patch.write_text(PATCH)
    with pytest.raises(ap.PatchError, match=r"p.patch: src/f.txt: hunk 2 \(line 6\)"):
        ap.apply(tree, [patch])
    assert (tree / "src" / "f.txt").read_text() == ORIGINAL.replace("six", "seven")  # hunk 1 not written either


def test_no_fuzz_a_hunk_at_another_line_is_refused(tmp_path: Path) -> None:
    tree = _tree(tmp_path, "zero\n" + ORIGINAL)
    patch = tmp_path / "p.patch"
    patch.write_text(PATCH)
    with pytest.raises(ap.PatchError, match="hunk 1"):
        ap.apply(tree, [patch])


def test_check_mode_writes_nothing(tmp_path: Path) -> None:
    tree = _tree(tmp_path)
    patch = tmp_path / "p.patch"
    patch.write_text(PATCH)
    assert ap.main(["--check", "--tree", str(tree), str(patch)]) == 0
    assert (tree / "src" / "f.txt").read_text() == ORIGINAL


def test_a_cut_short_hunk_is_not_a_patch(tmp_path: Path) -> None:
    with pytest.raises(ap.PatchError, match="cut short"):
        ap.parse("--- a/x\n+++ b/x\n@@ -1,3 +1,3 @@\n a\n-b\n")


def test_the_projects_cuda_patches_parse_and_carry_their_description() -> None:
    patches = sorted((REPO / "patches" / "cuda").glob("*.patch"))
    if not patches:
        pytest.skip("patches/cuda holds no patch today")
    for p in patches:
        text = p.read_text()
        assert ap.parse(text), p
        assert text.index("--- a/") > 200, f"{p.name} begins with its description"
        assert p.name in (REPO / "patches" / "README.md").read_text()


@pytest.mark.skipif(not (VENDORED / "ggml").is_dir(), reason="the vendored llama.cpp source is not extracted "
                    "here (scripts/build_llama_server extracts it)")
def test_the_projects_cuda_patches_apply_to_the_vendored_source(tmp_path: Path) -> None:
    patches = sorted((REPO / "patches" / "cuda").glob("*.patch"))
    if not patches:
        pytest.skip("patches/cuda holds no patch today")
    files = {fp.path for p in patches for fp in ap.parse(p.read_text())}
    for rel in files:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text((VENDORED / rel).read_text())
    changed = ap.apply(tmp_path, patches)
    assert set(changed) == files
