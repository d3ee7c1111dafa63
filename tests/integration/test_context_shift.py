"""Context shift (``ctx_shift`` with ``n_keep``) and chunk reuse (``n_cache_reuse``), as llama-server's
``--context-shift``, ``--keep`` and ``--cache-reuse`` (hydrad/engine/kvshift.py).

Real SmolLM2 engines with a small context (256 tokens per slot): a greedy generation asked for more
tokens than the context holds goes on past it when the engine shifts, and ends at the context's end when
it does not; a slot that shifted keeps only the prompt's head, so the next request on it is answered as
by a fresh engine; a prompt repeating chunks of the cached one after they part reuses them.
"""

from __future__ import annotations

from typing import Any, Callable

import pytest

from tests.support.engine import Engine

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
