"""Context shift (``ctx_shift`` with ``n_keep``) and chunk reuse (``n_cache_reuse``), as llama-server's
``--context-shift``, ``--keep`` and ``--cache-reuse`` (hydrad/engine/kvshift.py).

Real SmolLM2 engines with a small context (256 tokens per slot): a greedy generation asked for more
tokens than the context holds goes on past it when the engine shifts, and ends at the context's end when
it does not; a slot that shifted keeps only the prompt's head, so the next request on it is answered as
by a fresh engine; a prompt repeating chunks of the cached one after they part reuses them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterator

import httpx
import pytest

from tests.support import llamaserver
from tests.support.coordinator import Coordinator
from tests.support.engine import Engine, metric, models_dir, SMOLLM
from tests.support.scripts import load_script

pytestmark = pytest.mark.model

N_CTX = 256
PROMPT = ("The history of the lighthouse keepers of the northern coast, told by the last of them: "
          "the storms, the ships, the long winters and the lamps.")
BASE = {"model": "smollm2-135m", "temperature": 0, "n_parallel": 1, "n_ctx": N_CTX, "n_threads": 1}
LONG = N_CTX + 48  # more tokens than the context holds


@pytest.fixture(scope="module")
def shifting(start_module_engine: Callable[..., Engine]) -> Engine:
    e = start_module_engine(name="shift", defaults={**BASE, "ctx_shift": True})
    e.wait_ready()
    return e


@pytest.fixture(scope="module")
def plain(start_module_engine: Callable[..., Engine]) -> Engine:
    """No shift, no chunk reuse: the reference (with cache_prompt false, a fresh engine's answer)."""
    e = start_module_engine(name="plain", defaults=BASE)
    e.wait_ready()
    return e


def tokens_of(e: Engine, text: str) -> list[int]:
    r = e.http.post("/tokenize", json={"content": text})
    assert r.status_code == 200, r.text
    return list(r.json()["tokens"])


def complete(e: Engine, prompt: list[int], **fields: Any) -> dict[str, Any]:
    r = e.http.post("/completion", json={"prompt": prompt, "id_slot": 0, "return_tokens": True, **fields})
    assert r.status_code == 200, r.text
    return dict(r.json())


def slot_tokens(e: Engine) -> list[int]:
    r = e.http.get("/slots/0/state/meta")
    assert r.status_code == 200, r.text
    return list(r.json()["tokens"])


@pytest.mark.parametrize("n_keep", [-1, 8])
def test_a_shifting_generation_runs_past_the_context_and_keeps_the_prompts_head(
        shifting: Engine, plain: Engine, n_keep: int) -> None:
    prompt = tokens_of(shifting, PROMPT)
    out = complete(shifting, prompt, n_predict=LONG, ignore_eos=True, n_keep=n_keep)
    assert out["tokens_predicted"] == LONG > N_CTX - len(prompt), out["tokens_predicted"]
    assert out["truncated"] is True and out["stop_type"] == "limit"
    assert len(out["tokens"]) == LONG
    kept = len(prompt) if n_keep < 0 else n_keep  # SmolLM2 adds no BOS
    # the slot keeps what a prefill gives: the prompt's head, not the shifted tail
    assert slot_tokens(shifting) == prompt[:kept]
    assert shifting.http.get("/health").json()["status"] == "ok"
    # the next request on the slot reuses that head and answers as a fresh engine does
    follow = prompt + out["tokens"][-40:]
    again = complete(shifting, follow, n_predict=24)
    assert again["tokens_cached"] == kept, again["tokens_cached"]
    fresh = complete(plain, follow, n_predict=24, cache_prompt=False)
    assert again["content"] == fresh["content"] and again["tokens"] == fresh["tokens"]


def test_without_a_shift_the_generation_ends_at_the_context(plain: Engine) -> None:
    prompt = tokens_of(plain, PROMPT)
    out = complete(plain, prompt, n_predict=LONG, ignore_eos=True, n_keep=-1)
    assert out["tokens_predicted"] == N_CTX - len(prompt), out["tokens_predicted"]
    assert out["stop_type"] == "limit" and out["truncated"] is True  # llama-server's: it ran out of context
    short = complete(plain, prompt, n_predict=8, ignore_eos=True)
    assert short["tokens_predicted"] == 8 and short["truncated"] is False


def test_until_the_context_is_full_is_not_extended_by_a_shift(shifting: Engine) -> None:
    """n_predict -1 means "until the context is full": a shift would make it endless, so it ends there."""
    prompt = tokens_of(shifting, PROMPT)
    out = complete(shifting, prompt, n_predict=-1, ignore_eos=True)
    assert out["tokens_predicted"] == N_CTX - len(prompt), out["tokens_predicted"]


def test_context_fields_out_of_range_are_refused_by_name(shifting: Engine) -> None:
    for field, bad in (("n_keep", -2), ("n_cache_reuse", -1)):
        r = shifting.http.post("/completion", json={"prompt": "Hi", field: bad})
        assert r.status_code == 400 and r.json()["error"]["param"] == field, r.text


# n_cache_reuse: a list the second prompt repeats without one of its lines
FRUITS = [("Banana", "yellow"), ("Cherry", "red"), ("Lime", "green"), ("Plum", "purple"), ("Orange", "orange"),
          ("Blueberry", "blue")]


def _lists(e: Engine, drop: int, lines_dropped: int = 1) -> tuple[list[int], list[int], int]:
    """(the cached prompt, the new one without ``lines_dropped`` lines from line ``drop``, the tokens they
    share at the head)."""
    head = tokens_of(e, "List of fruits and their colours.\n")
    lines = [tokens_of(e, f"- {f} is {c}.\n") for f, c in FRUITS]
    question = tokens_of(e, "Question: what colour is a lime?\nAnswer: A lime is")
    first = head + sum(lines, []) + question
    second = head + sum(lines[:drop] + lines[drop + lines_dropped:], []) + question
    shared = next(i for i, (a, b) in enumerate(zip(first, second)) if a != b)
    return first, second, shared


def test_cache_reuse_moves_the_chunks_a_new_prompt_repeats(plain: Engine) -> None:
    first, second, shared = _lists(plain, 0)
    complete(plain, first, n_predict=1)
    reused = complete(plain, second, n_predict=8, n_cache_reuse=4)
    # everything after the dropped line came from the cache (but the last token, decoded for its logits)
    assert reused["tokens_cached"] == len(second) - 1 > shared, (reused["tokens_cached"], shared)
    assert reused["generation_settings"]["n_cache_reuse"] == 4
    fresh = complete(plain, second, n_predict=8, cache_prompt=False)
    assert reused["content"] == fresh["content"]
    # without it, only the shared head is reused
    complete(plain, first, n_predict=1)
    assert complete(plain, second, n_predict=8)["tokens_cached"] == shared
    assert metric(plain, "hydra_cache_reuse_tokens_total") >= len(second) - 1 - shared


@pytest.fixture(scope="module")
def llama_server() -> Iterator[httpx.Client]:
    """llama.cpp's own llama-server of the vendored tree (scripts/build_llama_server), with --cache-reuse 4."""
    with llamaserver.running(models_dir() / SMOLLM, "-c", str(N_CTX), "-np", "1", "-t", "1", "--temp", "0",
                             "--cache-reuse", "4", "--cache-ram", "0") as client:
        yield client


def test_reused_chunks_answer_as_llama_servers_cache_reuse(plain: Engine, llama_server: httpx.Client) -> None:
    """Reused KV was computed after other tokens: where that changes the answer (two lines dropped), the
    answer is still llama-server's own with --cache-reuse, token for token."""
    first, second, shared = _lists(plain, 0, lines_dropped=2)
    answers = []
    for post in (plain.http.post, llama_server.post):
        assert post("/completion", json={"prompt": first, "n_predict": 1, "id_slot": 0}).status_code == 200
        r = post("/completion", json={"prompt": second, "n_predict": 8, "id_slot": 0, "n_cache_reuse": 4,
                                      "temperature": 0, "return_tokens": True})
        assert r.status_code == 200, r.text
        answers.append(r.json())
    ours, theirs = answers
    assert ours["tokens_cached"] == theirs["timings"]["cache_n"] > shared
    assert ours["tokens"] == theirs["tokens"] and ours["content"] == theirs["content"]


@pytest.fixture
def pool(tmp_path: Path, smollm_path: Path, start_engine: Callable[..., Engine]) -> Iterator[tuple[Coordinator, Engine]]:
    params = {**BASE, "ctx_shift": True}
    profiles = {"profiles": {"one": {"description": "one shifting SmolLM2 engine",
                                     "engines": {"solo": {"model": "smollm2-135m", "params": {
                                         k: v for k, v in params.items() if k != "model"}}}}},
                "default": "one"}
    c = Coordinator(tmp_path, profiles=profiles, heartbeat_interval_s=0.5)
    c.wait_ready()
    e = start_engine(name="solo", defaults=params, extra={"bus": c.engine_bus(heartbeat_interval_s=0.5)})
    c.wait_engines(lambda es: es.get("solo", {}).get("model") == "smollm2-135m"
                   and es["solo"].get("stage") == "ready", timeout=120)
    yield c, e
    c.stop()


def test_front_door_carries_n_keep_and_the_shift(pool: tuple[Coordinator, Engine]) -> None:
    """Through the coordinator: n_keep travels over the bus, the answer runs past the context, and
    llama-server's truncated comes back."""
    c, e = pool
    prompt = tokens_of(e, PROMPT)
    r = c.http.post("/completion", json={"prompt": prompt, "n_predict": LONG, "ignore_eos": True, "n_keep": 6,
                                         "temperature": 0, "return_tokens": True})
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["tokens_predicted"] == LONG and out["truncated"] is True
    assert out["generation_settings"]["n_keep"] == 6
    assert slot_tokens(e) == prompt[:6]  # the engine kept the head n_keep named
    # the same prompt again: the kept head is reused, and the greedy answer is the first one's
    again = c.http.post("/completion", json={"prompt": prompt, "n_predict": 16, "temperature": 0,
                                             "return_tokens": True})
    assert again.status_code == 200, again.text
    assert again.json()["tokens_cached"] == 6 and again.json()["tokens"] == out["tokens"][:16]


def _tiny_mrope_model(out: Path) -> Path:
    """A tiny random ``qwen2vl`` GGUF (SmolLM2's vocabulary): multi-position RoPE, whose KV cache
    llama.cpp cannot shift (llama_memory_can_shift false)."""
    import numpy as np

    moe = load_script("make_tiny_moe")
    embd, ff, heads, heads_kv, layers = 64, 128, 4, 2, 2
    tokenizer = moe.read_tokenizer(models_dir() / SMOLLM)
    n_vocab = len(next(v for k, v, *_ in tokenizer if k == "tokenizer.ggml.tokens"))
    writer = moe.llama_writer(out, "tiny-mrope", tokenizer, ctx=4096, embd=embd, ff=ff, layers=layers, heads=heads,
                              heads_kv=heads_kv, rope_base=10000.0, arch="qwen2vl")
    writer.add_rope_dimension_sections([2, 3, 3, 0])  # of head_dim / 2 = 8 rotated pairs
    rng = np.random.default_rng(0)

    def w(*shape: int) -> Any:
        return (rng.standard_normal(shape, dtype=np.float32) / np.sqrt(shape[-1])).astype(np.float16)

    kv = embd // heads * heads_kv
    writer.add_tensor("token_embd.weight", w(n_vocab, embd))
    writer.add_tensor("output_norm.weight", np.ones(embd, dtype=np.float32))
    for i in range(layers):
        for name, t in (("attn_norm", np.ones(embd, dtype=np.float32)), ("attn_q", w(embd, embd)),
                        ("attn_k", w(kv, embd)), ("attn_v", w(kv, embd)), ("attn_output", w(embd, embd)),
                        ("ffn_norm", np.ones(embd, dtype=np.float32)), ("ffn_gate", w(ff, embd)),
                        ("ffn_up", w(ff, embd)), ("ffn_down", w(embd, ff))):
            writer.add_tensor(f"blk.{i}.{name}.weight", t)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def test_a_model_that_cannot_shift_ends_at_the_context(tmp_path: Path, start_engine: Callable[..., Engine]) -> None:
    """ctx_shift on, but a KV cache with several positions per token cannot move: the generation ends at
    the context's end (finish_reason length, truncated, as without the shift), the load says why, and
    n_cache_reuse reuses only the shared prefix; the engine goes on serving."""
    path = _tiny_mrope_model(tmp_path / "tiny-mrope.gguf")
    e = start_engine(name="mrope", defaults={**BASE, "model": str(path), "ctx_shift": True, "n_cache_reuse": 4})
    e.wait_ready()
    assert "cannot shift" in e.log()
    prompt = tokens_of(e, PROMPT)
    out = complete(e, prompt, n_predict=LONG, ignore_eos=True)
    assert out["tokens_predicted"] == N_CTX - len(prompt) and out["stop_type"] == "limit" and out["truncated"]
    first, second, shared = _lists(e, 0)
    complete(e, first, n_predict=1)
    assert complete(e, second, n_predict=4)["tokens_cached"] == shared
    assert e.http.get("/health").json()["status"] == "ok"
