"""Images on a real engine serving Gemma-3-270M with a tiny vision projector written in the test with the
``gguf`` package (tests/support/tinyvision.py: a ``gemma3`` projector of random weights that makes every
image 16 embeddings). The answers are noise; what is checked is the path.

What is shown: a chat with an ``image_url`` part and a /completion with ``multimodal_data`` are answered,
their ``prompt_tokens`` counting the image's tokens; the same image twice reuses the cached prompt
through the image, another image with the same text only up to it; the front door (a real coordinator)
carries a chat's image to the engine and gets the engine's own answer; the refusals: a model without a
projector (400 naming the field), a remote URL, too many pixels (413), a projector that is not one or
not this model's (the load fails naming ``mmproj``, the serving model goes on).
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any, Callable, Iterator

import httpx
import pytest

from tests.support.coordinator import Coordinator
from tests.support.engine import GEMMA, Engine, models_dir
from tests.support.tinyvision import IMAGE_TOKENS, tiny_png, write_projector

pytestmark = pytest.mark.model

BASE = {"model": "gemma3-270m", "n_ctx": 1024, "n_parallel": 2, "n_threads": 1, "temperature": 0}
RED, BLUE = (255, 0, 0), (0, 0, 255)


@pytest.fixture(scope="module")
def projector(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny projector, written once for the module's tests."""
    return write_projector(tmp_path_factory.mktemp("vision") / "tiny-mmproj.gguf")


@pytest.fixture(scope="module")
def vision_engine(projector: Path, start_module_engine: Callable[..., Engine]) -> Engine:
    if not (models_dir() / GEMMA).is_file():
        pytest.skip(f"{GEMMA} is not in the models directory")
    e = start_module_engine(defaults={**BASE, "mmproj": str(projector)})
    e.wait_ready()
    return e


def uri(rgb: tuple[int, int, int], **kw: int) -> str:
    return "data:image/png;base64," + base64.b64encode(tiny_png(rgb, **kw)).decode()


def chat_body(image_url: str, text: str = "What is in this picture?") -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": [{"type": "text", "text": text},
                                                       {"type": "image_url", "image_url": {"url": image_url}}]}],
            "max_tokens": 4, "temperature": 0}


def chat(http: httpx.Client, image_url: str) -> dict[str, Any]:
    r = http.post("/v1/chat/completions", json=chat_body(image_url))
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def text_only_tokens(http: httpx.Client) -> int:
    """The prompt tokens of the same chat without its image (the marker's place empty)."""
    r = http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "What is in this picture?"}],
                                                 "max_tokens": 1, "temperature": 0})
    assert r.status_code == 200, r.text
    return int(r.json()["usage"]["prompt_tokens"])


def test_images_through_chat_and_completion(vision_engine: Engine) -> None:
    http = vision_engine.http
    plain = text_only_tokens(http)
    first = chat(http, uri(RED))
    usage = first["usage"]
    # the image's 16 embeddings, and the two tokens gemma3's projector puts around them
    assert usage["prompt_tokens"] == plain + IMAGE_TOKENS + 2, usage
    again = chat(http, uri(RED))
    assert again["usage"]["prompt_tokens"] == usage["prompt_tokens"]
    # the same image: the whole prompt but its last token comes from the cache, the image included
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == usage["prompt_tokens"] - 1, again["usage"]
    other = chat(http, uri(BLUE))
    cached = other["usage"]["prompt_tokens_details"]["cached_tokens"]
    # another image with the same text: reused up to where the image starts, nothing of the image
    assert 0 < cached < usage["prompt_tokens"] - IMAGE_TOKENS - 1, other["usage"]

    png = base64.b64encode(tiny_png(RED)).decode()
    r = http.post("/completion", json={"prompt": {"prompt_string": "Look: <__media__> is", "multimodal_data": [png]},
                                       "n_predict": 3, "temperature": 0, "cache_prompt": False})
    assert r.status_code == 200, r.text
    text = http.post("/completion", json={"prompt": "Look:  is", "n_predict": 1, "cache_prompt": False}).json()
    assert r.json()["tokens_evaluated"] == text["tokens_evaluated"] + IMAGE_TOKENS + 2, (r.json(), text)

    two = {"prompt": {"prompt_string": "<__media__> and <__media__>", "multimodal_data": [png]}, "n_predict": 1}
    bad = http.post("/completion", json=two)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "prompt.multimodal_data", bad.text


def test_refusals(vision_engine: Engine) -> None:
    http = vision_engine.http
    r = http.post("/v1/chat/completions", json=chat_body("https://example.com/cat.png"))
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "messages[0].content[1].image_url.url"
    assert "remote image URLs are not fetched" in r.json()["error"]["message"]
    # a PNG header claiming 5000 x 5000 pixels: refused by its header, before anything decodes it
    huge = base64.b64encode(tiny_png(RED, width=5000, height=5000)).decode()
    r = http.post("/v1/chat/completions", json=chat_body("data:image/png;base64," + huge))
    assert r.status_code == 413, r.text
    assert r.json()["error"]["param"] == "messages[0].content[1].image_url.url"
    r = http.post("/v1/chat/completions", json=chat_body("data:image/png;base64,bm90IGFuIGltYWdl"))
    assert r.status_code == 400 and "not a PNG" in r.json()["error"]["message"], r.text
    # the engine goes on serving
    assert chat(http, uri(RED))["usage"]["prompt_tokens"] > IMAGE_TOKENS


def test_a_model_without_projector_refuses_images(start_engine: Callable[..., Engine], gemma_path: Path,
                                                   projector: Path, tmp_path: Path) -> None:
    e = start_engine(defaults=BASE)
    e.wait_ready()
    r = e.http.post("/v1/chat/completions", json=chat_body(uri(RED)))
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "messages" and "mmproj" in r.json()["error"]["message"]
    png = base64.b64encode(tiny_png(RED)).decode()
    r = e.http.post("/completion", json={"prompt": {"prompt_string": "<__media__>!", "multimodal_data": [png]}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt.multimodal_data", r.text

    # a file that is no projector, and a projector made for another model's width: the load fails naming
    # mmproj, and the model without one goes on serving
    wrong = write_projector(tmp_path / "wrong-width.gguf", text_embd=576)
    for bad, says in ((str(gemma_path), "is not a vision projector"), (str(wrong), "llama.cpp refused wrong-width.gguf"),
                      ("no-such-projector.gguf", "no such file")):
        r = e.configure(mmproj=bad)
        assert r.status_code == 422, r.text
        err = r.json()["error"]
        assert err["code"] == "load_failed" and err["param"] == "mmproj" and says in err["message"], err
        assert e.http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hi"}],
                                                         "max_tokens": 1}).status_code == 200
    # the right one loads with a configure, and images are served
    r = e.configure(mmproj=str(projector))
    assert r.status_code == 200 and r.json()["load"]["phase"] == "done", r.text
    assert chat(e.http, uri(RED))["usage"]["prompt_tokens"] > IMAGE_TOKENS


@pytest.fixture
def vision_pool(tmp_path: Path, gemma_path: Path, projector: Path,
                start_engine: Callable[..., Engine]) -> Iterator[tuple[Coordinator, Engine]]:
    profiles = {"profiles": {"one": {"description": "one Gemma engine with a vision projector",
                                     "engines": {"solo": {"model": "gemma3-270m", "params": {"n_parallel": 2}}}}},
                "default": "one"}
    c = Coordinator(tmp_path, profiles=profiles, heartbeat_interval_s=0.5)
    c.wait_ready()
    e = start_engine(name="solo", defaults={**BASE, "mmproj": str(projector)},
                     extra={"bus": c.engine_bus(heartbeat_interval_s=0.5)})
    c.wait_engines(lambda es: es.get("solo", {}).get("model") == "gemma3-270m"
                   and es["solo"].get("stage") == "ready", timeout=120)
    yield c, e
    c.stop()


def test_the_front_door_carries_a_chats_image(vision_pool: tuple[Coordinator, Engine]) -> None:
    c, e = vision_pool
    at_engine = chat(e.http, uri(BLUE))
    r = c.http.post("/v1/chat/completions", json=chat_body(uri(BLUE)))
    assert r.status_code == 200, r.text
    at_front = r.json()
    assert at_front["choices"][0]["message"]["content"] == at_engine["choices"][0]["message"]["content"]
    assert at_front["usage"]["prompt_tokens"] == at_engine["usage"]["prompt_tokens"]
    # the image went through: another image changes what the engine had cached
    r = c.http.post("/v1/chat/completions", json=chat_body(uri(RED)))
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] < at_front["usage"]["prompt_tokens"] - IMAGE_TOKENS
    r = c.http.post("/v1/chat/completions", json=chat_body("http://example.com/a.png"))
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages[0].content[1].image_url.url", r.text
