"""llama-server's slot files on real engines: POST /slots/{id}?action=save|restore|erase.

A saved slot comes back whole (its prompt is reused, its greedy continuation is the same); hostile
names write nothing anywhere; a file from another model, a damaged or truncated one, a busy slot and
a caller without the engine's token are refused, and a refused restore leaves the slot as it was."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any, Callable

import httpx
import pytest

from tests.support.engine import Engine
from tests.support.wait import eventually

pytestmark = pytest.mark.model

SMOL = {"model": "smollm2-135m", "temperature": 0, "n_ctx": 2048, "n_parallel": 2}
PROMPT = ("A slot file keeps the KV cache of a conversation on disk, so that the server can put it back later "
          "and continue without computing the prompt again. The first thing to know is")
TOKEN = "slot-files-5ecret-token"


def complete(e: Engine, slot: int | None, prompt: str = PROMPT, n: int = 12) -> dict[str, Any]:
    body: dict[str, Any] = {"prompt": prompt, "max_tokens": n, "temperature": 0}
    if slot is not None:
        body["id_slot"] = slot
    r = e.http.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def cached(answer: dict[str, Any]) -> int:
    return int(answer["usage"]["prompt_tokens_details"]["cached_tokens"])


def action(e: Engine, slot: int | str, what: str, body: Any = None, **kw: Any) -> httpx.Response:
    return e.http.post(f"/slots/{slot}?action={what}", json=body, **kw)


def slot_tokens(e: Engine, slot: int) -> int:
    return next(s["n_tokens"] for s in e.http.get("/slots").json() if s["id"] == slot)


def files_under(root: Path) -> set[str]:
    """Every file under ``root`` but the engines' own logs, config and notify sockets."""
    return {str(p.relative_to(root)) for p in root.rglob("*")
            if p.is_file() and not p.name.endswith((".log", ".yaml"))}


@pytest.fixture
def slot_dir(tmp_path: Path) -> Path:
    return tmp_path / "slots"


@pytest.fixture
def engine(smollm_path: Path, slot_dir: Path, start_engine: Callable[..., Engine]) -> Engine:
    e = start_engine(defaults=SMOL, extra={"slot_save_dir": str(slot_dir)})
    e.wait_ready()
    return e


def test_save_erase_restore_round_trip(engine: Engine, slot_dir: Path) -> None:
    first = complete(engine, 0)
    n = first["usage"]["prompt_tokens"]
    held = slot_tokens(engine, 0)
    saved = action(engine, 0, "save", {"filename": "conversation.bin"})
    assert saved.status_code == 200, saved.text
    body = saved.json()
    assert body["id_slot"] == 0 and body["filename"] == "conversation.bin" and body["n_saved"] == held > n
    assert body["n_written"] == (slot_dir / "conversation.bin").stat().st_size and body["timings"]["save_ms"] > 0
    assert sorted(os.listdir(slot_dir)) == ["conversation.bin"]  # the temporary file is gone

    erased = action(engine, 0, "erase")
    assert erased.status_code == 200 and erased.json() == {"id_slot": 0, "n_erased": held}, erased.text
    assert slot_tokens(engine, 0) == 0

    for slot in (0, 1):  # its own slot, and another one
        restored = action(engine, slot, "restore", {"filename": "conversation.bin"})
        assert restored.status_code == 200, restored.text
        r = restored.json()
        assert r["id_slot"] == slot and r["filename"] == "conversation.bin" and r["n_restored"] == held
        assert r["n_read"] == body["n_written"] and r["timings"]["restore_ms"] > 0
        assert slot_tokens(engine, slot) == held
        again = complete(engine, slot)
        assert cached(again) >= n - 1, again["usage"]
        assert again["choices"][0]["text"] == first["choices"][0]["text"]

    # saving again over the same name replaces the file whole
    complete(engine, 0, prompt="Something else entirely. " + PROMPT)
    assert action(engine, 0, "save", {"filename": "conversation.bin"}).json()["n_saved"] == slot_tokens(engine, 0)
    assert sorted(os.listdir(slot_dir)) == ["conversation.bin"]


def test_off_without_a_directory(smollm_engine: Engine) -> None:
    for what in ("save", "restore", "erase"):
        r = action(smollm_engine, 0, what, {"filename": "x.bin"} if what != "erase" else None)
        assert r.status_code == 501, r.text
        assert "slot_save_dir" in r.json()["error"]["message"] and "--slot-save-path" in r.json()["error"]["message"]


HOSTILE = ["../x", "../../etc/passwd", "/etc/passwd", ".hidden", "a/b", "a\\b", "", "x" * 300, "x\x00y", "..",
           ".", "x..y", "\u2024\u2024/x", "ｘ.bin", "x\u202e.bin", "x\n.bin", " x", "x y", "C:x", "~x", "$HOME",
           "-", 7, None, ["a"], {"a": 1}]


def test_hostile_names_write_nothing(engine: Engine, tmp_path: Path, slot_dir: Path) -> None:
    complete(engine, 0)
    before = files_under(tmp_path)
    for name in HOSTILE:
        for what in ("save", "restore"):
            r = action(engine, 0, what, {"filename": name})
            assert r.status_code == 400, (what, name, r.text)
            err = r.json()["error"]
            assert err["param"] == "filename" and err["message"], (what, name, err)
    assert files_under(tmp_path) == before
    assert not slot_dir.exists() or not os.listdir(slot_dir)
    for what, body, status, param in (
        ("save", {}, 400, "filename"), ("save", {"filename": "a.bin", "path": "/tmp"}, 400, "path"),
        ("nope", {"filename": "a.bin"}, 400, "action"), ("", None, 400, "action"),
        ("erase", {"filename": "a.bin"}, 400, "filename"),
    ):
        r = action(engine, 0, what, body)
        assert r.status_code == status and r.json()["error"]["param"] == param, (what, body, r.text)
    assert engine.http.post("/slots/0?action=save", content=b"{not json").status_code == 400
    assert engine.http.post("/slots/0?action=save", content=b"[1]").status_code == 400
    assert action(engine, "zero", "save", {"filename": "a.bin"}).status_code == 400
    assert action(engine, 9, "save", {"filename": "a.bin"}).status_code == 404
    assert action(engine, -1, "erase").status_code == 404
    assert action(engine, 0, "restore", {"filename": "missing.bin"}).status_code == 404
    # a link planted in the directory is not followed
    slot_dir.mkdir(exist_ok=True)
    (tmp_path / "outside.bin").write_bytes(b"x" * 100)
    (slot_dir / "link.bin").symlink_to(tmp_path / "outside.bin")
    r = action(engine, 0, "restore", {"filename": "link.bin"})
    assert r.status_code == 400 and "symbolic link" in r.json()["error"]["message"], r.text
    assert engine.http.get("/livez").status_code == 200
    assert complete(engine, 0)["choices"][0]["text"]


def test_refused_restores_leave_the_slot_untouched(smollm_path: Path, gemma_path: Path, slot_dir: Path,
                                                   start_engine: Callable[..., Engine]) -> None:
    smol = start_engine(name="smol", defaults=SMOL, extra={"slot_save_dir": str(slot_dir)})
    gemma = start_engine(name="gemma", defaults={"model": "gemma3-270m", "temperature": 0, "n_ctx": 1024,
                                                 "n_parallel": 1}, extra={"slot_save_dir": str(slot_dir)})
    smol.wait_ready(120)
    gemma.wait_ready(120)
    complete(gemma, 0, n=4)
    assert action(gemma, 0, "save", {"filename": "gemma.bin"}).status_code == 200

    first = complete(smol, 0)
    n, held = first["usage"]["prompt_tokens"], slot_tokens(smol, 0)
    good = action(smol, 0, "save", {"filename": "good.bin"}).json()
    raw = (slot_dir / "good.bin").read_bytes()
    flipped = bytearray(raw)
    flipped[len(raw) // 2] ^= 0xFF
    (slot_dir / "flipped.bin").write_bytes(bytes(flipped))
    (slot_dir / "half.bin").write_bytes(raw[: len(raw) // 2])
    (slot_dir / "noise.bin").write_bytes(os.urandom(4096))
    (slot_dir / "empty.bin").write_bytes(b"")
    for name, status, words in (("gemma.bin", 409, "another model"), ("flipped.bin", 400, "damaged"),
                                ("half.bin", 400, "slot file"), ("noise.bin", 400, "slot file"),
                                ("empty.bin", 400, "truncated")):
        r = action(smol, 0, "restore", {"filename": name})
        assert r.status_code == status, (name, r.text)
        message = r.json()["error"]["message"]
        assert words in message and "the slot is unchanged" in message, (name, message)
        assert slot_tokens(smol, 0) == held, name
    again = complete(smol, 0)
    assert cached(again) >= n - 1 and again["choices"][0]["text"] == first["choices"][0]["text"]
    assert action(smol, 0, "restore", {"filename": "good.bin"}).json()["n_read"] == good["n_written"]
    for e in (smol, gemma):
        assert e.http.get("/livez").status_code == 200


def test_busy_slot_is_refused(engine: Engine) -> None:
    complete(engine, 1)
    assert action(engine, 1, "save", {"filename": "one.bin"}).status_code == 200
    done = threading.Event()

    def long_request() -> None:
        with httpx.Client(base_url=engine.url, timeout=120) as c:
            with c.stream("POST", "/v1/completions", json={"prompt": PROMPT, "max_tokens": 1500, "ignore_eos": True,
                                                           "id_slot": 0, "stream": True}) as r:
                for _ in r.iter_bytes():
                    if done.is_set():
                        return

    t = threading.Thread(target=long_request, daemon=True)
    t.start()
    try:
        eventually(lambda: next(s for s in engine.http.get("/slots").json() if s["id"] == 0)["is_processing"], 30,
                   "slot 0 to be busy")
        for what, body in (("save", {"filename": "busy.bin"}), ("restore", {"filename": "one.bin"}), ("erase", None)):
            r = action(engine, 0, what, body)
            assert r.status_code == 409 and r.json()["error"]["code"] == "conflict", (what, r.text)
            assert "busy" in r.json()["error"]["message"]
    finally:
        done.set()
        t.join(60)
    eventually(lambda: not next(s for s in engine.http.get("/slots").json() if s["id"] == 0)["is_processing"], 30,
               "slot 0 to be idle again")
    assert action(engine, 0, "restore", {"filename": "one.bin"}).status_code == 200


def test_the_engine_token_gates_every_action(smollm_path: Path, tmp_path: Path, slot_dir: Path,
                                             start_engine: Callable[..., Engine]) -> None:
    """The gate of /slots/{id}/state: without the engine's token nothing is saved, restored or erased.
    A restore by a caller holding it is trusted KV: an unpinned request reuses it."""
    e = start_engine(defaults=SMOL, extra={"slot_save_dir": str(slot_dir), "rpc": {"token": TOKEN},
                                           "slot_file_max_bytes": 64 << 20})
    e.wait_ready()
    auth = {"Authorization": f"Bearer {TOKEN}"}
    first = complete(e, 0)
    n = first["usage"]["prompt_tokens"]
    for what, body in (("save", {"filename": "t.bin"}), ("restore", {"filename": "t.bin"}), ("erase", None)):
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            r = action(e, 0, what, body, headers=headers)
            assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Bearer"), (what, r.text)
    assert not slot_dir.exists()
    assert action(e, 0, "save", {"filename": "t.bin"}, headers=auth).status_code == 200
    assert action(e, 0, "erase", headers=auth).status_code == 200
    assert action(e, 1, "restore", {"filename": "t.bin"}, headers=auth).status_code == 200
    again = complete(e, None)
    assert cached(again) >= n - 1 and again["choices"][0]["text"] == first["choices"][0]["text"]
    assert TOKEN not in e.log()


def test_size_limits(smollm_path: Path, slot_dir: Path, start_engine: Callable[..., Engine]) -> None:
    e = start_engine(defaults=SMOL, extra={"slot_save_dir": str(slot_dir), "slot_file_max_bytes": 8192})
    e.wait_ready()
    complete(e, 0)
    r = action(e, 0, "save", {"filename": "big.bin"})
    assert r.status_code == 413 and "slot_file_max_bytes" in r.json()["error"]["message"], r.text
    assert not (slot_dir / "big.bin").exists()
    slot_dir.mkdir(exist_ok=True)
    (slot_dir / "big.bin").write_bytes(b"\0" * 8193)
    r = action(e, 0, "restore", {"filename": "big.bin"})
    assert r.status_code == 413 and r.json()["error"]["param"] == "filename", r.text
    assert e.http.get("/livez").status_code == 200


def test_outside_control_allow_from_is_forbidden(smollm_path: Path, slot_dir: Path,
                                                 start_engine: Callable[..., Engine]) -> None:
    e = start_engine(defaults=SMOL, extra={"slot_save_dir": str(slot_dir), "control_allow_from": ["10.0.0.0/8"]})
    e.wait_ready()
    complete(e, 0)
    for what, body in (("save", {"filename": "t.bin"}), ("restore", {"filename": "t.bin"}), ("erase", None)):
        r = action(e, 0, what, body)
        assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden", (what, r.text)
    assert not slot_dir.exists() and slot_tokens(e, 0) > 0
