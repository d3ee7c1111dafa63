"""scripts/make_tiny_moe.py end to end: the script writes a Mixture-of-Experts GGUF (real subprocess), the
bundled llama.cpp loads it and completes greedily with it (llama-cpp-python, in a subprocess, one thread),
and the file holds the expert tensors that placement overrides match (``blk.N.ffn_*_exps.weight``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.support.engine import REPO

pytestmark = pytest.mark.model

SCRIPT = REPO / "scripts" / "make_tiny_moe.py"
EXPERTS, USED, LAYERS, EMBD, FF = 4, 2, 2, 64, 128

# Loads each GGUF named on the command line and prints, per file, its expert metadata and the tokens of
# a greedy 8-token completion, computed twice from a fresh context (the second must repeat the first).
_RUN = r"""
import json, sys
import llama_cpp
out = []
for path in sys.argv[1:]:
    m = llama_cpp.Llama(model_path=path, n_ctx=256, n_threads=1, n_threads_batch=1, verbose=False)
    runs = []
    for _ in range(2):
        m.reset()
        toks = []
        for tok in m.generate(m.tokenize(b"The capital of France is"), temp=0.0, top_k=1, reset=True):
            toks.append(tok)
            if len(toks) == 8:
                break
        runs.append(toks)
    meta = {k: v for k, v in m.metadata.items() if k.startswith("general.architecture") or "expert" in k}
    out.append({"meta": meta, "runs": runs, "n_vocab": m.n_vocab()})
    m.close()
print(json.dumps(out))
"""


def _make(out: Path, vocab: Path, seed: int) -> None:
    r = subprocess.run([sys.executable, str(SCRIPT), str(out), "--vocab-from", str(vocab), "--layers", str(LAYERS),
                        "--experts", str(EXPERTS), "--experts-used", str(USED), "--embd", str(EMBD), "--ff", str(FF),
                        "--seed", str(seed)], capture_output=True, text=True, timeout=120, cwd=str(REPO))
    assert r.returncode == 0, r.stderr
    assert out.is_file() and "wrote" in r.stdout


def test_tiny_moe_loads_runs_and_has_expert_tensors(tmp_path: Path, smollm_path: Path) -> None:
    gguf = pytest.importorskip("gguf", reason="the gguf package (test extra) is not installed")
    a, a2, b = tmp_path / "a.gguf", tmp_path / "a2.gguf", tmp_path / "b.gguf"
    _make(a, smollm_path, seed=7)
    _make(a2, smollm_path, seed=7)
    _make(b, smollm_path, seed=8)
    assert a.read_bytes() == a2.read_bytes(), "the same --seed must write the same file"
    assert a.stat().st_size < 16_000_000

    reader = gguf.GGUFReader(a)
    tensors = {t.name: t for t in reader.tensors}
    vocab = len(reader.fields["tokenizer.ggml.tokens"].data)  # SmolLM2's: llama.cpp's n_vocab below
    assert list(tensors["token_embd.weight"].shape) == [EMBD, vocab]
    for i in range(LAYERS):
        assert list(tensors[f"blk.{i}.ffn_gate_inp.weight"].shape) == [EMBD, EXPERTS]
        for part, ne in (("gate", [EMBD, FF, EXPERTS]), ("up", [EMBD, FF, EXPERTS]), ("down", [FF, EMBD, EXPERTS])):
            t = tensors[f"blk.{i}.ffn_{part}_exps.weight"]
            assert list(t.shape) == ne, t.name
            assert not any(n == f"blk.{i}.ffn_{part}.weight" for n in tensors), "a dense FFN next to the experts"

    # another seed: the same layout (so A's offsets are B's), other weights
    data = tensors["blk.0.ffn_gate_exps.weight"]
    start, end = int(data.data_offset), int(data.data_offset) + int(data.n_bytes)
    raw_a, raw_b = a.read_bytes(), b.read_bytes()
    assert len(raw_a) == len(raw_b) and raw_a[:reader.data_offset] == raw_b[:reader.data_offset]
    assert raw_a[start:end] != raw_b[start:end]
    assert np.frombuffer(raw_a[start:end], np.float16).std() > 0

    r = subprocess.run([sys.executable, "-c", _RUN, str(a), str(a2)], capture_output=True, text=True, timeout=120,
                       cwd=str(REPO))
    assert r.returncode == 0, r.stderr[-4000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    for g in got:
        assert g["meta"]["general.architecture"] == "llama"
        assert g["meta"]["llama.expert_count"] == str(EXPERTS)
        assert g["meta"]["llama.expert_used_count"] == str(USED)
        assert g["n_vocab"] == vocab
        first, second = g["runs"]
        assert len(first) == 8 and first == second
    assert got[0]["runs"] == got[1]["runs"], "the same seed must complete the same tokens"
