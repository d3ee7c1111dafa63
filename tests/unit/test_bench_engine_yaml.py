"""scripts/bench_engine.py: the engine YAML it writes for hydrad, read back by the engine's own loader.

A variant given with ``--hydrad-config`` must add to the settings both servers share, not replace them:
an H200 run with ``{"defaults": {"use_mmap": false}}`` once dropped n_parallel with the rest of the
bench's defaults, and the engine then refused the benchmark's fifth slot.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from hydrad.engine.settings import load_config
from tests.support.scripts import load_script

be = load_script("bench_engine")
SETTINGS = be.ServerSettings(n_ctx=4096, n_batch=512, n_ubatch=512, n_parallel=8, kv_unified=True, threads=3,
                             flash_attn="auto", gpu_layers=0, hydrad_params={"text_overlap": "off"})


def _read_back(tmp_path: Path, extra: dict) -> dict:
    path = tmp_path / "hydrad.yaml"
    path.write_text(yaml.safe_dump(be.hydrad_yaml(SETTINGS, 18080, 18081, extra)))
    return load_config(path).settings.model_dump(mode="json")


def test_a_variants_defaults_are_merged_into_the_shared_ones(tmp_path: Path) -> None:
    cfg = _read_back(tmp_path, {"defaults": {"use_mmap": False, "n_threads": 4}, "cuda_pinned_host": "alone"})
    d = cfg["defaults"]
    assert d["n_parallel"] == 8 and d["n_ctx"] == 4096 and d["n_threads_batch"] == 3  # the shared ones kept
    assert d["use_mmap"] is False and d["n_threads"] == 4  # the variant's added, or taking precedence
    assert d["text_overlap"] == "off"  # hydrad's own parameters kept too
    assert cfg["cuda_pinned_host"] == "alone"  # an engine key of the variant is the engine's
    assert cfg["http"]["port"] == 18080 and cfg["rpc"]["port"] == 18081


def test_no_variant_writes_the_shared_settings_alone(tmp_path: Path) -> None:
    cfg = _read_back(tmp_path, {})
    assert cfg["defaults"]["n_parallel"] == 8 and "use_mmap" not in cfg["defaults"]
    assert cfg["cuda_pinned_host"] is True  # the engine's default


def test_each_spec_kind_runs_the_same_kind_at_the_same_sizes_on_both_servers(tmp_path: Path) -> None:
    """``--spec KIND``: hydrad's parameters (read back by the engine's own loader) and llama-server's flags
    (read by hydrad's table of them, which maps llama-server's spellings) name the same speculation."""
    from hydrad.cli import hydrad as hydrad_cli, llamaflags

    gguf = tmp_path / "m.gguf"
    for kind in be.SPEC_KINDS:
        args = be.argparse.Namespace(spec=kind, draft_model=None, draft_n_max=5)
        params, ref = be.spec_settings(args, gguf)
        cfg = _read_back(tmp_path, {"defaults": params})["defaults"]
        flags = llamaflags.read(hydrad_cli.build_parser().parse_args(ref.split()).llama_flags).layer["defaults"]
        assert {k: cfg[k] for k in flags} == flags, kind
        assert set(flags) == set(params)
    assert cfg["spec_draft_model"] == str(gguf) and cfg["spec_n_max"] == 5
