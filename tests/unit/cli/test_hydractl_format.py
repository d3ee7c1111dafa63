"""hydractl's text blocks render every field they are given (a quick guard over the command modules)."""

from __future__ import annotations

from hydrad.cli.ctl.coordinator import format_engines, format_profile, format_route
from hydrad.cli.ctl.engine import format_config, format_health
from hydrad.cli.ctl.kv import format_info, format_state_meta


def test_route_explain_lists_candidates_and_rejections() -> None:
    text = format_route({"engine": "a", "model": "m", "step": "warm", "reason": "cheapest",
                         "request": {"prompt_tokens": 5, "max_tokens": 16},
                         "candidates": [{"engine": "a", "cost_s": 0.5, "wait_s": 0.1, "load_s": 0, "prefill_s": 0.4,
                                         "warm": True}],
                         "rejected": {"b": "dead"}})
    assert "candidates (1, cheapest first):" in text
    assert "  a       0.5000  0.1000  0.0000  0.4000     yes" in text
    assert "  b  dead" in text


def test_route_explain_shows_the_split_plan_or_why_not() -> None:
    base = {"engine": "slow", "model": "m", "step": "cost", "reason": "cheapest", "candidates": [], "rejected": {}}
    text = format_route({**base, "split": {"reason": "fast prefills, slow decodes", "transfers": {
        "transfers": 3, "bytes_per_s": 2.5e9, "fixed_s": 0.0123}, "plan": {
        "prefill": "fast", "prefill_model": "m-q8", "decode": "slow", "prefill_s": 1.0, "transfer_s": 0.05,
        "decode_s": 1.3, "total_s": 2.35, "single": "slow", "single_s": 21.3, "kv_bytes": 92160000}}})
    assert "split      yes: fast prefills, slow decodes" in text
    assert ("prefill fast (m-q8) 1.0000 s + transfer 0.0500 s (92160000 bytes) + decode slow 1.3000 s = 2.3500 s; "
            "slow alone 21.3000 s") in text
    assert "transfers measured: 3, 2500 MB/s + 12.3 ms each" in text
    text = format_route({**base, "split": {"plan": None, "reason": "slow has not measured its speeds yet",
                                           "transfers": {"transfers": 0}}})
    assert "split      no: slow has not measured its speeds yet" in text and "transfers measured" not in text


def test_engines_and_profile_tables() -> None:
    engines = format_engines({"profile": "dev", "engines": [
        {"name": "a", "alive": True, "stage": "loading_model", "progress": 0.5, "model": "x", "loading_model": "y",
         "slots_total": 2, "slots_busy": 1, "decode_tps": 12.345, "last_seen_s": 0.3}]}, "http://c:9000")
    assert "1/1 engines alive" in engines and "loading_model 50%" in engines and "x -> y" in engines
    profile = format_profile({"active": "dev", "state": "steady", "profiles": {"dev": "two engines"},
                              "engines": {"a": {"alive": True, "entry": {"model": "x"}, "model": "x", "stage": "ready",
                                                "matches": True}}})
    assert "profile dev (steady)" in profile and "profiles: dev (two engines)" in profile


def test_engine_and_kv_blocks() -> None:
    assert "1/2 busy" in format_health({"engine": "a", "status": "ok", "stage": "ready",
                                        "slots": {"busy": 1, "total": 2}}, "http://a:8080")
    assert "n_ctx" in format_config({"engine": "a", "params": {"n_ctx": {"value": 4096, "source": "yaml", "tier": "T2"}}})
    info = format_info({"engine": "a", "stage": "ready", "slots": [{"id": 0, "busy": False, "n_tokens": 3}]}, "a:9503")
    assert "0/1 busy, 3 tokens cached" in info and "- (no ggml-RPC server)" in info
    assert "4 (0.0 MB)" in format_state_meta({"bytes": 4, "tokens": list(range(10))})
