"""The reference pages under docs/reference/ say what the code says (scripts/gen_docs).

Each page is regenerated in memory from its source of truth (the parameters' tiers, the settings
models, the metrics registries, the command-line parsers) and compared with the checked-in file; a
difference fails with the one command that fixes it.
"""

from __future__ import annotations

import difflib
import importlib.machinery
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]


def _gen_docs() -> ModuleType:
    name = "hydra_gen_docs"
    if name in sys.modules:
        return sys.modules[name]
    loader = importlib.machinery.SourceFileLoader(name, str(REPO / "scripts" / "gen_docs"))
    spec = importlib.util.spec_from_loader(name, loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def pages() -> dict[str, str]:
    return _gen_docs().render_all()


@pytest.mark.parametrize("path", list(_gen_docs().PAGES))
def test_checked_in_page_matches_the_code(pages: dict[str, str], path: str) -> None:
    target = REPO / path
    assert target.is_file(), f"{path} is missing: run scripts/gen_docs"
    have = target.read_text(encoding="utf-8")
    if have != pages[path]:
        diff = "".join(list(difflib.unified_diff(have.splitlines(True), pages[path].splitlines(True),
                                                 f"{path} (checked in)", f"{path} (from the code)"))[:60])
        pytest.fail(f"{path} disagrees with the code: run scripts/gen_docs and commit the result\n{diff}")


def test_the_tier_table_names_every_runtime_parameter_once(pages: dict[str, str]) -> None:
    from hydrad.common.params import RuntimeParams

    table = pages["docs/reference/params.md"].split("## Every parameter")[0]
    rows = {line.split("|")[1].strip(): line.split("|")[4] for line in table.splitlines() if line.startswith("| T")}
    listed = [word.strip("`") for tier in ("T1", "T2", "T3") for word in rows[tier].split()]
    assert sorted(listed) == sorted(RuntimeParams.model_fields)
    for name in RuntimeParams.model_fields:
        assert f"`{name}`" in rows[f"T{int(RuntimeParams.tier_of(name))}"], name


def test_a_stale_page_is_named_with_the_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            pages: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    gen = _gen_docs()
    for path, text in pages.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text, encoding="utf-8")
    monkeypatch.setattr(gen, "REPO", tmp_path)
    monkeypatch.setattr(gen, "render_all", lambda: pages)
    assert gen.main(["--check"]) == 0
    stale_page = tmp_path / "docs" / "reference" / "metrics.md"
    stale_page.write_text(pages["docs/reference/metrics.md"].replace("hydra_slots_busy", "hydra_slots_used"))
    assert gen.main(["--check"]) == 1
    assert "docs/reference/metrics.md is stale: run scripts/gen_docs" in capsys.readouterr().err
    assert gen.main([]) == 0  # rewrites it
    assert stale_page.read_text() == pages["docs/reference/metrics.md"]


def test_machine_specific_defaults_do_not_leak_into_the_pages(monkeypatch: pytest.MonkeyPatch,
                                                               pages: dict[str, str]) -> None:
    """A developer's $XDG_RUNTIME_DIR or $HYDRA_* must not change what is written."""
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/run/user/4242")
    monkeypatch.setenv("HYDRA_ENGINE_URL", "http://elsewhere:1")
    monkeypatch.setenv("COLUMNS", "37")
    assert _gen_docs().render_all() == pages
