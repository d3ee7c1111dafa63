"""llama-server's POST /infill on real engines: a model without FIM tokens (SmolLM2, Gemma-3) is
refused with llama-server's 501 naming what it lacks; a copy of SmolLM2 whose GGUF names FIM tokens
gets the prompt llama-server's format_prompt_infill builds (checked token for token: the same
greedy answer and prompt count as a /completion of that prompt), truncated as llama-server does,
in /completion's answer shapes, and every bad field is refused by name."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import pytest

from tests.integration.test_native_completion import check_shape
from tests.support.engine import SMOLLM, Engine, models_dir

pytestmark = pytest.mark.model

# SmolLM2's vocabulary has <repo_name> (FIM_REP, found by llama.cpp) but no FIM_PRE/SUF/MID; the copy names
# <gh_stars>, <issue_start>, <issue_comment> as those and <file_sep> as FIM_SEP
FIM = {"pre": 7, "suf": 8, "mid": 9, "sep": 5}
REP = 4
N_BATCH = 64
BODY = {"input_prefix": "def add(a, b):\n    return ", "input_suffix": "\n\nprint(add(1, 2))\n",
        "input_extra": [{"filename": "util.py", "text": "X = 1\n"}], "n_predict": 8, "temperature": 0}


def fim_copy(src: Path, out: Path) -> Path:
    """``src`` rewritten with FIM token ids in its metadata (the tensors copied as they are)."""
    import gguf
    from gguf.scripts.gguf_new_metadata import MetadataDetails, copy_with_new_metadata

    reader = gguf.GGUFReader(src)
    writer = gguf.GGUFWriter(str(out), reader.fields["general.architecture"].contents())
    copy_with_new_metadata(reader, writer, {f"tokenizer.ggml.fim_{k}_token_id": MetadataDetails(
        gguf.GGUFValueType.UINT32, v) for k, v in FIM.items()}, [])
    return out


def _fim_engine(smollm: Path, tmp: Path, start: Callable[..., Engine]) -> Engine:
    path = fim_copy(smollm, tmp / "smollm2-fim.gguf")
    e = start(defaults={"model": str(path), "temperature": 0, "n_batch": N_BATCH, "n_ctx": 2048, "n_parallel": 1})
    e.wait_ready()
    return e


@pytest.fixture
def fim_engine(smollm_path: Path, tmp_path: Path, start_engine: Callable[..., Engine]) -> Engine:
    return _fim_engine(smollm_path, tmp_path, start_engine)


@pytest.fixture(scope="module")
def shared_fim_engine(tmp_path_factory: pytest.TempPathFactory, start_module_engine: Callable[..., Engine]) -> Engine:
    """``fim_engine``, booted once for the module: for the requests it refuses."""
    smollm = models_dir() / SMOLLM
    if not smollm.is_file():
        pytest.skip(f"model file {smollm} is missing (scripts/setup fetches it)")
    return _fim_engine(smollm, tmp_path_factory.mktemp("fim"), start_module_engine)


def tok(e: Engine, text: str) -> list[int]:
    r = e.http.post("/tokenize", json={"content": text, "add_special": False, "parse_special": False})
    assert r.status_code == 200, r.text
    return r.json()["tokens"]


def expected(e: Engine, prefix: str, suffix: str, extra: list[dict[str, str]], prompt: str = "",
             n_ctx: int = 2048, n_predict: int = -1) -> list[int]:
    """llama-server's format_prompt_infill for this vocabulary (no BOS added: SmolLM2 adds none)."""
    ex = [REP, *tok(e, "myproject\n")]
    for c in extra:
        ex += [FIM["sep"], *tok(e, c["filename"] + "\n"), *tok(e, c["text"])]
    ex += [FIM["sep"], *tok(e, "filename\n")]
    pre, suf = tok(e, prefix), tok(e, suffix)
    mid = e.http.post("/tokenize", json={"content": prompt, "parse_special": True}).json()["tokens"] if prompt else []
    n_pre = min(len(pre), 3 * (N_BATCH // 4))
    n_suf = min(len(suf), max(0, N_BATCH // 4 - (2 + len(mid))))
    n_ex = min(max(0, n_ctx - N_BATCH - 2 * n_predict), len(ex))
    return [*ex[len(ex) - n_ex:], FIM["pre"], *pre[len(pre) - n_pre:], *mid, FIM["suf"], *suf[:n_suf], FIM["mid"]]


def same_as_completion(e: Engine, body: dict[str, Any], ids: list[int]) -> dict[str, Any]:
    r = e.http.post("/infill", json=body)
    assert r.status_code == 200, r.text
    got = r.json()
    check_shape(got)
    plain = {k: v for k, v in body.items() if not k.startswith("input_") and k != "prompt"}
    ref = e.http.post("/completion", json={**plain, "prompt": ids}).json()
    assert got["tokens_evaluated"] == ref["tokens_evaluated"] == len(ids)
    assert got["content"] == ref["content"] and got["tokens_predicted"] == ref["tokens_predicted"]
    return got


def test_the_prompt_is_llama_servers(fim_engine: Engine) -> None:
    e = fim_engine
    got = same_as_completion(e, BODY, expected(e, BODY["input_prefix"], BODY["input_suffix"], BODY["input_extra"]))
    assert got["stop"] is True and got["model"]
    # the start of the middle, parsed with special tokens; no extra chunk: only the FIM_REP header and FIM_SEP
    body = {**BODY, "input_extra": [], "prompt": "a +"}
    same_as_completion(e, body, expected(e, BODY["input_prefix"], BODY["input_suffix"], [], "a +"))
    # a long prefix keeps its last 3/4 batch, a long suffix its first quarter less the prompt and 2
    long = {**BODY, "input_prefix": "x = 1\n" * 60, "input_suffix": "y = 2\n" * 60}
    ids = expected(e, long["input_prefix"], long["input_suffix"], BODY["input_extra"])
    assert ids.count(FIM["pre"]) == 1 and len(ids) < len(tok(e, long["input_prefix"]))
    same_as_completion(e, long, ids)


def test_streamed_like_completion(fim_engine: Engine) -> None:
    e = fim_engine
    whole = e.http.post("/infill", json=BODY).json()
    with e.http.stream("POST", "/infill", json={**BODY, "stream": True}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        raw = r.read().decode()
    blocks = [b[len("data: "):] for b in raw.split("\n\n") if b.strip()]
    assert blocks and all(b.startswith("{") for b in blocks)
    evs = [json.loads(b) for b in blocks]
    assert "".join(p["content"] for p in evs) == whole["content"] and evs[-1]["stop"] is True


@pytest.mark.parametrize("body, field", [
    ({"input_suffix": ""}, "input_prefix"),
    ({"input_prefix": ""}, "input_suffix"),
    ({**BODY, "input_prefix": 3}, "input_prefix"),
    ({**BODY, "input_suffix": [{"a": 1}]}, "input_suffix"),
    ({**BODY, "input_suffix": [-1]}, "input_suffix"),
    ({**BODY, "input_prefix": [10 ** 9]}, "input_prefix"),
    ({**BODY, "input_extra": {"text": "x"}}, "input_extra"),
    ({**BODY, "input_extra": [{"filename": "a.py"}]}, "input_extra"),
    ({**BODY, "input_extra": [{"text": "x", "filename": 1}]}, "input_extra"),
    ({**BODY, "input_extra": [{"text": "x"}] * 1025}, "input_extra"),
    ({**BODY, "prompt": [1, 2]}, "prompt"),
    ({**BODY, "n_indent": 4}, "n_indent"),
    ({**BODY, "top_k": "x"}, "top_k"),
])
def test_bad_fields_are_refused_by_name(shared_fim_engine: Engine, body: dict[str, Any], field: str) -> None:
    r = shared_fim_engine.http.post("/infill", json=body)
    assert r.status_code == 400, r.text
    assert field in r.json()["error"]["message"] or r.json()["error"].get("param") == field, r.text


def test_a_model_without_fim_tokens_is_refused(smollm_engine: Engine) -> None:
    r = smollm_engine.http.post("/infill", json=BODY)
    assert r.status_code == 501, r.text
    msg = r.json()["error"]["message"]
    assert "not supported by this model" in msg and "prefix, suffix, middle" in msg
    # the request was checked first: a bad field is still a 400
    assert smollm_engine.http.post("/infill", json={"input_suffix": ""}).status_code == 400
