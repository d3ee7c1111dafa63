"""scripts/make_model.py end to end, at a tiny size: the script writes a dense random-weight llama GGUF tensor
by tensor and quantizes it with the bundled llama.cpp (real subprocess); the quantized file has the shapes
asked for, the F16 file is gone unless kept, and llama.cpp loads the result and completes with it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.engine import REPO

pytestmark = pytest.mark.model

SCRIPT = REPO / "scripts" / "make_model.py"
LAYERS, EMBD, FF, HEADS, HEADS_KV = 2, 64, 128, 4, 2

_RUN = r"""
import json, sys
import llama_cpp
m = llama_cpp.Llama(model_path=sys.argv[1], n_ctx=128, n_threads=1, n_threads_batch=1, verbose=False)
toks = []
for tok in m.generate(m.tokenize(b"Hello there"), temp=0.0, top_k=1, reset=True):
    toks.append(tok)
    if len(toks) == 4:
        break
print(json.dumps({"arch": m.metadata.get("general.architecture"), "layers": m.metadata.get("llama.block_count"),
                  "toks": toks, "n_vocab": m.n_vocab()}))
m.close()
"""


def test_make_model_writes_quantizes_and_loads(tmp_path: Path, smollm_path: Path) -> None:
    gguf = pytest.importorskip("gguf", reason="the gguf package (test extra) is not installed")
    stem = tmp_path / "rand"
    r = subprocess.run([sys.executable, str(SCRIPT), str(stem), "--vocab-from", str(smollm_path),
                        "--layers", str(LAYERS), "--embd", str(EMBD), "--ff", str(FF), "--heads", str(HEADS),
                        "--heads-kv", str(HEADS_KV), "--quant", "Q8_0", "--threads", "1"],
                       capture_output=True, text=True, timeout=300, cwd=str(REPO))
    assert r.returncode == 0, r.stderr
    q8 = tmp_path / "rand.Q8_0.gguf"
    assert q8.is_file() and not (tmp_path / "rand.F16.gguf").exists(), "F16 kept without --keep-f16"
    assert not list(tmp_path.glob("*.tmp")), "a temporary file was left behind"
    assert "B parameters" in r.stdout.splitlines()[-1]

    reader = gguf.GGUFReader(q8)
    tensors = {t.name: t for t in reader.tensors}
    vocab = len(reader.fields["tokenizer.ggml.tokens"].data)
    assert list(tensors["output.weight"].shape) == [EMBD, vocab]
    for i in range(LAYERS):
        assert list(tensors[f"blk.{i}.ffn_up.weight"].shape) == [EMBD, FF]
        assert list(tensors[f"blk.{i}.attn_k.weight"].shape) == [EMBD, EMBD // HEADS * HEADS_KV]
    assert tensors["blk.0.attn_q.weight"].tensor_type == gguf.GGMLQuantizationType.Q8_0

    run = subprocess.run([sys.executable, "-c", _RUN, str(q8)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got["arch"] == "llama" and int(got["layers"]) == LAYERS
    assert len(got["toks"]) == 4 and all(0 <= t < got["n_vocab"] for t in got["toks"])


def test_make_model_refuses_shapes_that_do_not_fit(tmp_path: Path, smollm_path: Path) -> None:
    r = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "bad"), "--vocab-from", str(smollm_path),
                        "--layers", "1", "--embd", "30", "--ff", "8", "--heads", "4", "--heads-kv", "2", "--quant", ""],
                       capture_output=True, text=True, timeout=120, cwd=str(REPO))
    assert r.returncode != 0 and "n_embd 30" in r.stderr
    assert not list(tmp_path.iterdir()), "nothing is written for shapes that do not fit"
    r = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "bad"), "--size", "1b", "--quant", "Q3_X"],
                       capture_output=True, text=True, timeout=60, cwd=str(REPO))
    assert r.returncode == 2 and "Q3_X" in r.stderr
