"""The engine's settings reach llama.cpp's parameter structs.

A ctypes ``Structure`` takes any attribute without complaint, so a field llama.cpp renamed (``use_mmap``
became ``load_mode``) made the engine's assignment a silent no-op: ``use_mmap: false`` loaded by mapping
the file all the same. The first test names every field the wrapper sets against the structs' own
fields; the second reads back, from llama.cpp's own log, how a real load read the model."""

from __future__ import annotations

import ast
import logging
from pathlib import Path

import pytest

from hydrad.common.params import RuntimeParams
from hydrad.engine import llama

STRUCTS = {"mp": "llama_model_params", "cp": "llama_context_params"}


def test_every_field_the_wrapper_sets_is_a_field_of_the_struct() -> None:
    tree = ast.parse(Path(llama.__file__).read_text())
    set_fields: dict[str, set[str]] = {name: set() for name in STRUCTS}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) \
                        and target.value.id in STRUCTS:
                    set_fields[target.value.id].add(target.attr)
    C = llama.lib()
    for var, struct in STRUCTS.items():
        known = {f[0] for f in getattr(C, struct)._fields_}
        assert set_fields[var], f"the wrapper sets no field of {struct}: the scan is broken"
        assert set_fields[var] <= known, f"not fields of {struct}: {sorted(set_fields[var] - known)}"


@pytest.mark.model
@pytest.mark.parametrize("use_mmap, mode", [(True, "mmap"), (False, "none")])
def test_use_mmap_decides_how_llama_cpp_reads_the_model(smollm_path: Path, use_mmap: bool, mode: str,
                                                        caplog: pytest.LogCaptureFixture,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    llama.lib()
    monkeypatch.setattr(llama, "_llama_log_min", llama._LOG_LEVELS["info"])
    with caplog.at_level(logging.INFO, logger="hydrad.llama"):
        llama.Model.load(smollm_path, RuntimeParams(use_mmap=use_mmap)).free()
    said = [r.getMessage() for r in caplog.records if "load_mode =" in r.getMessage()]
    assert said and said[-1].endswith(f"(load_mode = {mode})"), said


@pytest.mark.model
@pytest.mark.parametrize("no_host", [False, True])
def test_no_host_reaches_the_model_params_of_a_real_load(smollm_path: Path, no_host: bool,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """On a CPU-only build llama.cpp has no GPU host buffer to bypass, so what can be checked here is that
    the struct llama.cpp loads with carries the setting; a GPU run shows its effect (docs/benchmarks.md)."""
    C = llama.lib()
    real = C.llama_model_load_from_file
    seen: list[bool] = []

    def spy(path: bytes, mp: object) -> object:
        seen.append(bool(getattr(mp, "no_host")))  # noqa: B009 (mp: the ctypes struct, typed object)
        return real(path, mp)

    monkeypatch.setattr(C, "llama_model_load_from_file", spy)
    llama.Model.load(smollm_path, RuntimeParams(no_host=no_host)).free()
    assert seen == [no_host]
