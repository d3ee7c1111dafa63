"""A T1 configure answers once its parameters are in force: a request sent right after the answer is
prepared with them, even when the engine thread was inside a long prefill step when the configure came
(the chat's template is rendered off that thread, from the parameters in force)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Callable

import httpx

from tests.support.engine import Engine

LONG = " ".join(f"Line {i}: the quick brown fox jumps over the lazy dog." for i in range(150))  # ~2,000 tokens
MARKS = {"gemma": "<start_of_turn>user", "chatml": "<|im_start|>user"}


def test_a_request_right_after_a_chat_template_configure_uses_it(smollm_path: Path,
                                                                  start_engine: Callable[..., Engine]) -> None:
    e = start_engine(defaults={"model": "smollm2-135m", "temperature": 0, "n_threads": 1, "n_parallel": 2,
                               "n_ctx": 8192, "n_batch": 2048, "n_ubatch": 2048})
    e.wait_ready()
    messages = [{"role": "user", "content": "Hello"}]
    for template in ("gemma", "chatml"):
        # the engine thread goes into one step of ~2,000 prompt tokens (seconds on one CPU thread)
        long = threading.Thread(target=lambda: httpx.post(f"{e.url}/v1/completions", timeout=120, json={
            "prompt": LONG, "max_tokens": 1, "id_slot": 0}))
        long.start()
        t0 = time.monotonic()
        while not any(s["is_processing"] for s in e.http.get("/slots").json()):
            assert time.monotonic() - t0 < 30, "the long prompt never started"
            time.sleep(0.005)
        r = e.http.post("/control/configure", json={"chat_template": template})
        assert r.status_code == 200 and r.json()["tier"] == "T1" and "pending" not in r.json(), r.text
        prompt = e.http.post("/apply-template", json={"messages": messages}).json()["prompt"]
        assert MARKS[template] in prompt, (template, prompt)
        chat = e.http.post("/v1/chat/completions", json={"messages": messages * 40, "max_tokens": 1})  # prepared off-thread
        assert chat.status_code == 200
        long.join(120)
