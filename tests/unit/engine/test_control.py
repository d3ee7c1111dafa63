"""Configure's supersede/join decision and its "differs from installed" check (engine/control.py).

``FakeCore`` stands in for ``EngineCore``, which drives llama.cpp: it records the loads the control
layer starts and lets a test end them, so the decision is tested without building a model."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

import pytest

from hydrad.common.params import RuntimeParams, Tier
from hydrad.common.registry import Registry
from hydrad.engine.control import EngineControl

REPO = Path(__file__).resolve().parents[3]
MODELS_YAML = REPO / "etc" / "hydra" / "models.yaml"


class FakeCore:
    """The parts of EngineCore that EngineControl uses, with no llama.cpp behind them."""

    def __init__(self) -> None:
        self.params: RuntimeParams | None = None
        self.gen: Any = None  # the installed generation: only its params matter here
        self.current_load: Any = None
        self.loads: list[Any] = []
        self.aborted: list[int] = []
        self.warmed: list[tuple[str, int]] = []  # (model, loads started by then): estimates read ahead
        self.asleep: str | None = None  # the idle sleep's freed model (hydrad.engine.sleep)

    async def warm_estimate(self, resolved: Any, params: RuntimeParams, kv_bytes_per_token: int | None) -> None:
        self.warmed.append((resolved.id, len(self.loads)))

    def set_defaults(self, params: RuntimeParams) -> None:
        self.params = params

    def load(self, resolved: Any, params: RuntimeParams, on_success: Callable[[], None], policy: str | None = None,
             carry_kv: bool = False, kv_bytes_per_token: int | None = None, keep_standby: bool = False) -> Any:
        rec = SimpleNamespace(id=len(self.loads) + 1, model=resolved.id, params=params, on_success=on_success,
                              policy=policy or "overlap", estimate={})
        self.loads.append(rec)
        self.current_load = rec
        return rec

    def finish(self) -> None:
        """The running load installs its generation."""
        rec, self.current_load = self.current_load, None
        self.gen = SimpleNamespace(params=rec.params)
        rec.on_success()

    async def abort_load(self) -> None:
        self.aborted.append(self.current_load.id)
        self.current_load = None

    async def unload(self) -> None:
        self.gen = None

    async def rebuild_context(self, params: RuntimeParams) -> dict[str, Any]:
        self.gen = SimpleNamespace(params=params)
        return {"seconds": 0.0}


@pytest.fixture
def registry(tmp_path: Path) -> Registry:
    models = tmp_path / "models"
    models.mkdir()
    for name in ("SmolLM2-135M-Instruct.Q4_1.gguf", "gemma-3-270m-q4_k_m.gguf"):
        (models / name).write_bytes(b"GGUF\x03\x00\x00\x00")  # resolve() only checks that the file exists
    return Registry.load(MODELS_YAML, models)


def control(registry: Registry, **yaml: Any) -> tuple[EngineControl, FakeCore]:
    core = FakeCore()
    return EngineControl(core, registry, dict(yaml)), core  # type: ignore[arg-type]


def run(coro: Any) -> Any:
    return asyncio.run(coro)


# ----- the join decision ------------------------------------------------------------------------

def test_asking_for_what_the_boot_load_is_loading_joins_it(registry: Registry) -> None:
    c, core = control(registry, model="gemma3-270m")
    boot = run(c.boot())
    r = run(c.configure({"model": "gemma3-270m"}))
    assert r.load_id == boot.load_id and r.extra == {"joined": True} and r.tier == Tier.T3
    assert core.aborted == [] and len(core.loads) == 1


def test_a_different_setting_supersedes_the_running_load_with_the_merged_target(registry: Registry) -> None:
    c, core = control(registry, model="gemma3-270m")
    run(c.boot())
    r = run(c.configure({"n_ctx": 3072}))
    assert core.aborted == [1] and len(core.loads) == 2
    assert r.tier == Tier.T3 and r.load_id == 2 and "joined" not in r.extra
    target = core.loads[1].params
    assert target.model == "gemma3-270m" and target.n_ctx == 3072  # the YAML's model, with the new setting


def test_a_configure_superseding_a_configure_merges_both_payloads(registry: Registry) -> None:
    c, core = control(registry, model="smollm2-135m")
    run(c.boot())
    core.finish()
    run(c.configure({"model": "gemma3-270m"}))
    run(c.configure({"n_ctx": 2048}))
    assert core.aborted == [2]
    assert (core.loads[-1].params.model, core.loads[-1].params.n_ctx) == ("gemma3-270m", 2048)
    core.finish()
    eff = c.effective()
    assert (eff.model, eff.n_ctx) == ("gemma3-270m", 2048)


def test_the_same_configure_twice_joins_the_first(registry: Registry) -> None:
    c, core = control(registry, model="smollm2-135m")
    run(c.boot())
    core.finish()
    first = run(c.configure({"model": "gemma3-270m"}))
    again = run(c.configure({"model": "gemma3-270m"}))
    assert again.load_id == first.load_id and again.extra == {"joined": True} and core.aborted == []


def test_a_bad_payload_does_not_abort_the_running_load(registry: Registry) -> None:
    from hydrad.common.registry import UnknownModel

    c, core = control(registry, model="gemma3-270m")
    run(c.boot())
    with pytest.raises(UnknownModel):
        run(c.configure({"model": "no-such-model"}))
    assert core.aborted == [] and core.current_load is core.loads[0]


# ----- superseding back to what is installed ----------------------------------------------------

def test_superseding_back_to_the_installed_model_loads_nothing(registry: Registry) -> None:
    c, core = control(registry, model="smollm2-135m")
    run(c.boot())
    core.finish()
    run(c.configure({"model": "gemma3-270m"}))
    r = run(c.configure({"model": "smollm2-135m"}))
    assert core.aborted == [2] and len(core.loads) == 2  # smollm2 is installed: no third load
    assert r.tier != Tier.T3 and c.effective().model == "smollm2-135m"


def test_naming_a_model_the_aborted_boot_load_never_installed_loads_it(registry: Registry) -> None:
    c, core = control(registry, model="gemma3-270m")
    run(c.boot())
    run(c.configure({"model": "smollm2-135m"}))  # supersedes the boot load: nothing is installed
    assert core.aborted == [1] and core.loads[-1].params.model == "smollm2-135m"


def test_a_load_reads_its_estimate_ahead_off_the_loop(registry: Registry) -> None:
    """Every path that starts a load has its memory estimate (the GGUF's tensor table) computed on a
    worker thread first; a change that loads nothing reads nothing."""
    c, core = control(registry, model="smollm2-135m")
    run(c.boot())
    assert core.warmed == [("smollm2-135m", 0)]  # before the boot load started
    core.finish()
    run(c.configure({"n_batch": 1024}))  # a context rebuild
    assert len(core.warmed) == 1
    run(c.configure({"model": "gemma3-270m", "n_cpu_moe": 2}))
    assert core.warmed[-1] == ("gemma3-270m", 1) and core.loads[-1].params.n_cpu_moe == 2


def test_differs_from_installed(registry: Registry) -> None:
    c, core = control(registry, model="smollm2-135m")
    eff = c.effective()
    assert c._differs_from_installed(eff)  # nothing installed, a model asked for
    assert not c._differs_from_installed(eff.model_copy(update={"model": None}))
    core.gen = SimpleNamespace(params=eff)
    assert not c._differs_from_installed(eff)
    assert not c._differs_from_installed(eff.model_copy(update={"temperature": 0.1}))  # T1: no load
    assert not c._differs_from_installed(eff.model_copy(update={"n_ctx": 1024}))  # T2: a context rebuild
    assert c._differs_from_installed(eff.model_copy(update={"model": "gemma3-270m"}))
    assert c._differs_from_installed(eff.model_copy(update={"use_mmap": not eff.use_mmap}))  # any T3 field
