"""The rules of hydrad/engine/adapters.py that need no model: which scales a request runs with
(llama-server's: the adapters a request names at their scales, the others at 0; none named: the
engine's), the cache namespace those scales make, the turns of several sets, where an adapter file is
looked up, and the control vector's sum (read from GGUFs written here)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hydrad.common.params import AdapterFile
from hydrad.common.tenants import cache_namespace, store_owner
from hydrad.engine import adapters as ad
from hydrad.engine.llama import LoadError
from hydrad.wire.requests import LoraScale
from tests.support.adapters import make_control_vector


def two(defaults: tuple[float, ...] = (1.0, 0.0), first: str = "id-a", **kw: object) -> ad.Adapters:
    return ad.Adapters([ad.Lora(0, Path("/a.gguf"), None, first), ad.Lora(1, Path("/b.gguf"), None, "id-b")], defaults,
                       **kw)  # type: ignore[arg-type]


def test_a_request_names_adapters_by_id_and_the_others_run_at_zero() -> None:
    a = two()
    assert a.scales(None) == a.scales([]) == (1.0, 0.0)
    assert a.scales([LoraScale(1, 0.5)]) == (0.0, 0.5)
    assert a.scales([LoraScale(1, 0.5), LoraScale(1, 2.0)]) == (0.0, 2.0)  # the last of an id wins
    with pytest.raises(ad.AdapterRefused, match=r"^lora: no adapter 2 \(this model has 2"):
        a.scales([LoraScale(2, 1.0)])
    assert a.set_defaults([LoraScale(1, 0.25)]) == (0.0, 0.25) and a.scales(None) == (0.0, 0.25)
    assert a.set_defaults([]) == (0.0, 0.0)
    assert a.public() == [{"id": 0, "path": "/a.gguf", "scale": 0.0}, {"id": 1, "path": "/b.gguf", "scale": 0.0}]


def test_the_scales_widen_the_cache_namespace() -> None:
    a = two()
    assert a.owner("", (0.0, 0.0)) == "" and a.owner("t1", (0.0, 0.0)) == "t1"  # the base model's
    one, other = a.owner("t1", (1.0, 0.0)), a.owner("t1", (0.5, 0.0))
    assert one.startswith("t1|adapters:") and one != other and one == a.owner("t1", (1.0, 0.0))
    assert a.owner("t2", (1.0, 0.0)) != one  # a tenant's namespace stays its own
    assert two(first="id-retrained").owner("t1", (1.0, 0.0)) != one  # another file at the same id
    tenant = cache_namespace("alice", None)  # the Store still counts the tenant's objects as the tenant's
    assert store_owner(a.owner(tenant, (1.0, 0.0))) == store_owner(tenant) != ""
    assert store_owner(a.owner("", (1.0, 0.0))) == ""
    steered = two(cvec=np.ones(4, dtype=np.float32), cvec_range=(1, 2), n_embd=2)
    assert steered.owner("t1", (0.0, 0.0)).startswith("t1|adapters:")  # a control vector changes every prompt's KV
    assert steered.owner("t1", (0.0, 0.0)) != two(cvec=np.ones(4, dtype=np.float32), cvec_range=(1, 1),
                                                  n_embd=2).owner("t1", (0.0, 0.0))
    assert ad.for_request(a, [LoraScale(0, 0.0)], "t1") == ((0.0, 0.0), "t1")
    assert ad.for_request(None, None, "t1") == ((), "t1") == ad.for_request(None, [], "t1")
    with pytest.raises(ad.AdapterRefused, match="this model has no LoRA adapters"):
        ad.for_request(None, [LoraScale(0, 1.0)], "")


def test_several_sets_take_turns() -> None:
    sets = [(1.0,), (0.0,), (1.0,)]
    assert {ad.Adapters.pick(sets, turn) for turn in range(4)} == {(0.0,), (1.0,)}
    assert [ad.Adapters.pick(sets, turn) for turn in (1, 2)] == [(1.0,), (0.0,)]
    assert ad.Adapters.pick([(0.5,), (0.5,)], 7) == (0.5,)


def test_an_adapter_file_is_absolute_or_under_models_dir(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "x.gguf").write_bytes(b"GGUF")
    assert ad.resolve_file("lora_adapters[0]", "sub/x.gguf", tmp_path) == tmp_path / "sub" / "x.gguf"
    assert ad.resolve_file("lora_adapters[0]", str(tmp_path / "sub" / "x.gguf"), Path("/nowhere")) \
        == tmp_path / "sub" / "x.gguf"
    with pytest.raises(LoadError, match=r"^lora_adapters\[0\]: no such file: y\.gguf"):
        ad.resolve_file("lora_adapters[0]", "y.gguf", tmp_path)


def test_control_vectors_are_summed_times_their_scales(tmp_path: Path) -> None:
    gguf = pytest.importorskip("gguf")
    one = make_control_vector(tmp_path / "one.gguf", 8, range(1, 4), seed=1)
    two_ = make_control_vector(tmp_path / "two.gguf", 8, range(2, 5), seed=2)
    read = {p.name: {t.name: np.array(t.data) for t in gguf.GGUFReader(p).tensors} for p in (one, two_)}
    out = ad.control_vector([AdapterFile(path="one.gguf", scale=2.0), AdapterFile(path=str(two_), scale=-1.0)],
                            tmp_path, n_embd=8, n_layer=4).reshape(3, 8)
    assert np.allclose(out[0], 2 * read["one.gguf"]["direction.1"])
    assert np.allclose(out[1], 2 * read["one.gguf"]["direction.2"] - read["two.gguf"]["direction.2"])
    assert np.allclose(out[2], 2 * read["one.gguf"]["direction.3"] - read["two.gguf"]["direction.3"])
    # (direction.4 is the last layer's: llama.cpp has no control tensor there, as in llama-server)
    with pytest.raises(LoadError, match=r"^control_vectors\[0\]: direction.1 in one.gguf is not 16 F32 values"):
        ad.control_vector([AdapterFile(path=str(one))], tmp_path, n_embd=16, n_layer=4)
    with pytest.raises(LoadError, match=r"^control_vectors\[0\]: two.gguf has tensor 'direction.4'; .* layers 1 to 3"):
        ad.control_vector([AdapterFile(path=str(two_))], tmp_path, n_embd=8, n_layer=3)
