"""Real llama.cpp KV states for the store's tests: made once per test session, in a subprocess
(make_states.py, one SmolLM2 load, n_threads 1), and shared by every test that needs them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.engine import SMOLLM, models_dir

HERE = Path(__file__).resolve().parent
META = {"model": {"arch": "llama", "n_layer": 30, "n_embd": 576, "n_head_kv": 3, "n_vocab": 49152,
                  "fingerprint": "test"}, "cache_type_k": "f16", "cache_type_v": "f16", "format": "hydra-kv/1"}


class States:
    """``get("a", "trans")`` -> (meta, bytes); names a, b, c (400 tokens sharing 300) and p (the 300 alone);
    layouts "trans" (flash attention off: V transposed) and "rows" (on: V as rows)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def get(self, name: str, layout: str) -> tuple[dict[str, Any], bytes]:
        tokens = json.loads((self.root / f"{name}_{layout}.json").read_text())["tokens"]
        meta = dict(META, tokens=tokens, n_tokens=len(tokens))
        return meta, (self.root / f"{name}_{layout}.bin").read_bytes()


@pytest.fixture(scope="session")
def real_states(tmp_path_factory: pytest.TempPathFactory) -> States:
    model = models_dir() / SMOLLM
    if not model.is_file():
        pytest.skip(f"model file {model} is missing (scripts/setup fetches it)")
    out = tmp_path_factory.mktemp("kv-states")
    proc = subprocess.run([sys.executable, str(HERE / "make_states.py"), str(model), str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return States(out)


def fake_meta(tokens: list[int], arch: str = "fake") -> dict[str, Any]:
    meta = json.loads(json.dumps(META))
    meta["model"]["arch"] = arch
    return dict(meta, tokens=tokens, n_tokens=len(tokens))
