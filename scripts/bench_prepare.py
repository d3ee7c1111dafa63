#!/usr/bin/env python3
"""Preparation time of heavy requests, hydrad beside llama-server on the same model and template.

Each request is sent alone to an idle server, several times, and timed to its answer. Both
servers get a context too small for the longest prompts, so a request whose prompt does not fit
is answered 400 as soon as it is prepared (parsed, templated, tokenized, its grammar made): the
time is its preparation, not a prefill. The requests:

- ``tools_128``: 128 ordinary tools, ``tool_choice: "required"``, with a chat template that
  supports tools on both servers (``--template``, default the Hermes-style Qwen 2.5 template that
  llama.cpp ships in ``models/templates/``). Every run's tools have parameter names of their own,
  so no run is served from a cache; ``tools_128_again`` sends the last run's tools once more;
- ``min_items_1e8``, ``properties_6500``, ``messages_40000``: the stalls the pool was built not to
  have (llama-server's answer may take minutes: each request has ``--timeout`` seconds, one
  that got no answer is not sent to that server again, and a server that goes on with a request
  after its client left is waited for, idle, before the next);
- three structured-output requests as OpenAI's guide writes them (a math tutor's steps, a UI tree
  with a recursive ``$ref``, a research paper's fields), generating one token.

    .venv/bin/python scripts/bench_prepare.py --runs 5 --out build/bench-prepare.json

Prints a table of medians and the ratio hydrad ÷ llama-server (below 1: hydrad is faster).
"""

from __future__ import annotations

if __name__ == "__main__":  # run as scripts/NAME: under the checkout's .venv when there is one
    import _venv
    _venv.reexec()

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))
sys.path.insert(0, str(REPO))
from bench_engine import (_CLK, Hydrad, LlamaServer, ServerSettings, _proc_ticks, describe_machine,  # noqa: E402
                          git_describe, llama_server_binary, machine)
from tests.support.heavy import properties_6500  # noqa: E402

TEMPLATE = "Qwen-Qwen2.5-7B-Instruct.jinja"


def find_template(name: str) -> Path:
    """A template from the llama.cpp tree that scripts/build_llama_server unpacked."""
    found = sorted((Path.home() / ".cache" / "hydra").glob(f"**/models/templates/{name}"))
    if not found:
        raise SystemExit(f"bench: {name} not found; run scripts/build_llama_server, or pass --template PATH")
    return found[0]


def tools(run: int) -> list[dict[str, Any]]:
    """128 tools whose parameters are named for the run (no two runs share a schema)."""
    return [{"type": "function", "function": {
        "name": f"tool_{i}", "description": f"Does task {i} with the given inputs.",
        "parameters": {"type": "object", "properties": {
            f"path_{run}_{i}": {"type": "string"}, f"count_{run}_{i}": {"type": "integer"},
            f"mode_{run}_{i}": {"enum": ["fast", "slow"]},
            f"tags_{run}_{i}": {"type": "array", "items": {"type": "string"}}}, "required": [f"path_{run}_{i}"]}}}
        for i in range(128)]


def structured(name: str) -> dict[str, Any]:
    """OpenAI's structured-output guide's examples, as response formats."""
    schemas: dict[str, Any] = {
        "math_steps": {"type": "object", "properties": {
            "steps": {"type": "array", "items": {"type": "object", "properties": {
                "explanation": {"type": "string"}, "output": {"type": "string"}},
                "required": ["explanation", "output"], "additionalProperties": False}},
            "final_answer": {"type": "string"}}, "required": ["steps", "final_answer"], "additionalProperties": False},
        "ui_tree": {"type": "object", "properties": {
            "type": {"type": "string", "enum": ["div", "button", "header", "section", "field", "form"]},
            "label": {"type": "string"}, "children": {"type": "array", "items": {"$ref": "#"}},
            "attributes": {"type": "array", "items": {"type": "object", "properties": {
                "name": {"type": "string"}, "value": {"type": "string"}}, "required": ["name", "value"],
                "additionalProperties": False}}},
            "required": ["type", "label", "children", "attributes"], "additionalProperties": False},
        "paper": {"type": "object", "properties": {
            "title": {"type": "string"}, "authors": {"type": "array", "items": {"type": "string"}},
            "abstract": {"type": "string"}, "keywords": {"type": "array", "items": {"type": "string"}}},
            "required": ["title", "authors", "abstract", "keywords"], "additionalProperties": False},
    }
    return {"type": "json_schema", "json_schema": {"name": name, "strict": True, "schema": schemas[name]}}


def bodies(run: int) -> dict[str, dict[str, Any]]:
    hi = [{"role": "user", "content": "Hi"}]
    out: dict[str, dict[str, Any]] = {
        "tools_128": {"messages": hi, "max_tokens": 1, "tools": tools(run), "tool_choice": "required"},
        "min_items_1e8": {"messages": hi, "max_tokens": 1, "response_format": {
            "type": "json_schema", "json_schema": {"name": "xs", "schema": {
                "type": "array", "items": {"type": "integer"}, "minItems": 100_000_000}}}},
        "properties_6500": {"messages": hi, "max_tokens": 1, "response_format": {
            "type": "json_schema", "json_schema": {"name": "wide", "schema": properties_6500()}}},
        "messages_40000": {"messages": [{"role": "user", "content": ""}] * 40_000, "max_tokens": 1},
    }
    for name in ("math_steps", "ui_tree", "paper"):
        out[name] = {"messages": [{"role": "user", "content": "Answer in JSON."}], "max_tokens": 1,
                     "response_format": structured(name)}
    return out


def until_idle(server: Any, timeout: float) -> None:
    """Wait until ``server`` uses under a tenth of a core over a second: llama-server goes on with a
    request whose client left (40,000 messages took it minutes), and the other server's next
    request must not share the machine with it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        before = _proc_ticks(server.proc.pid)
        time.sleep(1.0)
        if _proc_ticks(server.proc.pid) - before < _CLK / 10:
            return
    raise RuntimeError(f"{server.name} still busy after {timeout:.0f} s")


def timed(url: str, body: bytes, timeout: float) -> tuple[float | None, int]:
    """(seconds to the whole answer, status); None seconds when there was none within ``timeout``."""
    t0 = time.perf_counter()
    try:
        r = httpx.post(url + "/v1/chat/completions", content=body, timeout=timeout,
                       headers={"Content-Type": "application/json"})
    except httpx.HTTPError:
        return None, 0
    return time.perf_counter() - t0, r.status_code


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m", help="registry alias both servers load")
    ap.add_argument("--template", type=Path, help=f"chat template (default: llama.cpp's {TEMPLATE})")
    ap.add_argument("--runs", type=int, default=5, help="times each request is sent to each server")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds a request may take before it counts as none")
    ap.add_argument("--n-ctx", type=int, default=4096, help="both servers' context (small: long prompts are refused once prepared)")
    ap.add_argument("--llama-server", help="llama-server binary (default: scripts/build_llama_server's)")
    ap.add_argument("--requests", help="comma-separated names: only these (default: every one)")
    ap.add_argument("--out", type=Path, help="write the results as JSON here")
    args = ap.parse_args()
    template = args.template or find_template(TEMPLATE)
    binary = llama_server_binary(args.llama_server)
    settings = ServerSettings(n_ctx=args.n_ctx, n_batch=512, n_ubatch=512, n_parallel=1, kv_unified=False,
                              threads=2, flash_attn="off", gpu_layers=0)
    registry = __import__("yaml").safe_load((REPO / "etc" / "hydra" / "models.yaml").read_text())
    gguf = REPO / "models" / Path(registry["models"][args.model]["path"]).name
    times: dict[str, dict[str, list[float | None]]] = {}
    statuses: dict[str, dict[str, list[int]]] = {}
    gave_up: set[tuple[str, str]] = set()
    with tempfile.TemporaryDirectory(prefix="bench-prepare-") as tmp:
        work = Path(tmp)
        (work / "hydrad").mkdir()
        (work / "llama-server").mkdir()
        hydrad = Hydrad(work / "hydrad", settings, None, {"defaults": {"chat_template": template.read_text()}})
        ref = LlamaServer(work / "llama-server", binary, settings, gguf,
                          ["--jinja", "--chat-template-file", str(template)])
        try:
            hydrad.start()
            hydrad.load(args.model)
            ref.start()
            for run in range(args.runs):
                made = bodies(run)
                if args.requests:
                    made = {k: v for k, v in made.items() if k in args.requests.split(",")}
                if run == args.runs - 1 and "tools_128" in made:
                    made["tools_128_again"] = made["tools_128"]
                for name, body in made.items():
                    raw = json.dumps(body, separators=(",", ":")).encode()
                    for server in (hydrad, ref):
                        if (name, server.name) in gave_up:  # it got no answer once: not sent again
                            times[name][server.name].append(None)
                            statuses[name][server.name].append(0)
                            continue
                        seconds, status = timed(server.url, raw, args.timeout)
                        if seconds is None:
                            gave_up.add((name, server.name))
                        times.setdefault(name, {}).setdefault(server.name, []).append(seconds)
                        statuses.setdefault(name, {}).setdefault(server.name, []).append(status)
                        if seconds is None:  # a server still busy with it must not slow the next measurement
                            until_idle(server, 900)
        finally:
            hydrad.stop()
            ref.stop()

    def median(xs: list[float | None]) -> float | None:
        got = [x for x in xs if x is not None]
        return statistics.median(got) if len(got) == len(xs) else None

    rows = []
    print("| request | hydrad (s) | llama-server (s) | hydrad ÷ llama-server | statuses |")
    print("|---|---:|---:|---:|---|")
    for name, per in times.items():
        h, r = median(per["hydrad"]), median(per["llama-server"])
        ratio = h / r if h is not None and r else None
        rows.append({"request": name, "hydrad_s": h, "llama_server_s": r, "ratio": ratio,
                     "statuses": statuses[name], "runs": per})
        fmt = lambda x: f"{x:.3f}" if x is not None else f"> {args.timeout:g}"  # noqa: E731
        print(f"| {name} | {fmt(h)} | {fmt(r)} | {'-' if ratio is None else f'{ratio:.2f}'} | "
              f"{sorted(set(statuses[name]['hydrad']))} / {sorted(set(statuses[name]['llama-server']))} |")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"machine": describe_machine(machine()), "tree": git_describe(), "model": args.model,
                                        "template": template.name, "runs": args.runs, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
