"""/openapi.json: every route of both daemons' apps is described, with the request bodies the doors
parse (pydantic models or schemas written beside the parsers), path parameters, the binary KV upload
and the OpenAI error shape; the schemas say what the parsers require (so a schema-driven fuzzer's
bodies get past the first 400) and never more (every body the parsers accept fits its schema)."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace
from typing import Any, Callable

import pytest
from starlette.applications import Starlette
from starlette.routing import Route
from starlette.testclient import TestClient

from hydrad.common.openapi import describe, openapi_route
from hydrad.coordinator.admin import ADMIN_BODIES, admin_routes
from hydrad.coordinator.frontdoor import FrontDoor
from hydrad.coordinator.settings import CoordinatorSettings
from hydrad.engine.http.app import ROUTES
from hydrad.wire import anthropic, embeddings, infill, native_completion, openai
from hydrad.wire.bodies import BINARY_BODIES, ENGINE_BODIES, FRONT_DOOR_BODIES
from hydrad.wire.openai import INT32_MAX, ApiError


def _engine_doc() -> dict:
    return describe(ROUTES, "hydrad", "t", bodies=ENGINE_BODIES, binary_bodies=BINARY_BODIES)


def _front_routes() -> list[Route]:
    bus = SimpleNamespace(engines={}, listeners=[], inflight=lambda name: 0, inflight_total=lambda: 0)
    switcher = SimpleNamespace(locked=lambda name: False, placed=lambda name: (False, None))
    front = FrontDoor(CoordinatorSettings(), bus, switcher, SimpleNamespace(entries={}))  # type: ignore[arg-type]
    return front.routes() + admin_routes(bus, switcher, SimpleNamespace(), front)  # type: ignore[arg-type]


def _front_doc() -> dict:
    """As hydrad.coordinator.daemon builds it."""
    return describe(_front_routes(), "hydra-coordinator", "t", bodies={**FRONT_DOOR_BODIES, **ADMIN_BODIES})


def _body(doc: dict, path: str, method: str = "post") -> dict:
    return doc["paths"][path][method]["requestBody"]["content"]["application/json"]["schema"]


@pytest.mark.parametrize("doc, routes", [(_engine_doc, lambda: ROUTES), (_front_doc, _front_routes)],
                         ids=["engine", "front door"])
def test_every_route_and_method_is_described(doc: Callable[[], dict], routes: Callable[[], list[Route]]) -> None:
    d = doc()
    assert d["openapi"].startswith("3.1")
    json.dumps(d)
    for r in routes():
        assert isinstance(r, Route)
        for method in (r.methods or {"GET"}) - {"HEAD"}:
            assert method.lower() in d["paths"][r.path], (r.path, method)
            if method == "POST" and r.path in ENGINE_BODIES:
                assert _body(d, r.path) != {"type": "object"}, f"{r.path}: its parser's schema is missing"
    ids = [op["operationId"] for ops in d["paths"].values() for op in ops.values()]
    assert len(ids) == len(set(ids)), "operation ids must be unique"
    for ref in re.findall(r'"\$ref": "([^"]+)"', json.dumps(d)):  # every reference reaches a schema
        assert ref.startswith("#/components/schemas/") and ref.rsplit("/", 1)[1] in d["components"]["schemas"], ref


def test_bodies_are_the_parsers_models_and_the_rest_is_an_object() -> None:
    paths = _engine_doc()["paths"]
    chat = _body(_engine_doc(), "/v1/chat/completions")
    assert "messages" in chat["properties"] and "temperature" in chat["properties"]
    native = _body(_engine_doc(), "/completion")
    assert "prompt" in native["properties"] and "n_probs" in native["properties"]
    assert _body(_engine_doc(), "/control/configure") == {"type": "object"}
    assert "application/octet-stream" in paths["/slots/{slot}/state"]["put"]["requestBody"]["content"]
    assert paths["/slots/{slot}/state"]["get"]["parameters"][0]["name"] == "slot"
    err = paths["/health"]["get"]["responses"]["default"]["content"]["application/json"]["schema"]
    assert err["required"] == ["error"]


def test_the_schemas_carry_the_parsers_required_fields_and_ranges() -> None:
    e, f = _engine_doc(), _front_doc()
    chat = _body(e, "/v1/chat/completions")
    assert chat["required"] == ["messages"]
    assert chat["properties"]["messages"]["minItems"] == 1
    assert chat["properties"]["messages"]["items"]["required"] == ["role"]
    assert "robot" not in chat["properties"]["messages"]["items"]["properties"]["role"]["enum"]
    assert chat["properties"]["n"]["maximum"] == 16 and chat["properties"]["n"]["minimum"] == 1
    assert chat["properties"]["temperature"]["anyOf"][0]["maximum"] == 2
    assert chat["properties"]["max_tokens"]["anyOf"][0]["maximum"] == INT32_MAX
    assert _body(e, "/v1/completions")["required"] == ["prompt"]
    assert _body(e, "/completion")["required"] == ["prompt"]
    assert set(_body(e, "/infill")["required"]) == {"input_prefix", "input_suffix"}
    messages = _body(e, "/v1/messages")
    assert set(messages["required"]) == {"max_tokens", "messages"}
    assert messages["properties"]["max_tokens"]["minimum"] == 1
    assert messages["properties"]["messages"]["items"]["additionalProperties"] is False
    assert _body(e, "/tokenize")["required"] == ["content"] and _body(e, "/tokenize")["additionalProperties"] is False
    assert "model" not in _body(e, "/tokenize")["properties"]  # the engine refuses it by name
    assert "model" in _body(f, "/tokenize")["properties"]  # the front door takes it out to pick the engine
    assert _body(f, "/v1/embeddings")["required"] == ["input"]
    assert _body(f, "/admin/profile")["required"] == ["name"]
    assert _body(f, "/admin/sessions/move")["required"] == ["session", "engine"]
    assert [b["required"] for b in _body(f, "/admin/route")["anyOf"]] == [["messages"], ["prompt"]]


# ----- the schemas are never stricter than the parsers ------------------------------------------
# A validator of the JSON Schema the documents use (the project does not depend on a JSON Schema
# library): every body a parser accepts must fit its door's schema.

def _fits(v: Any, s: dict, root: dict) -> bool:
    if "$ref" in s:
        return _fits(v, root["components"]["schemas"][s["$ref"].rsplit("/", 1)[1]], root)
    kinds = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None)}

    def is_type(t: str) -> bool:
        if t == "integer":
            return type(v) is int or (type(v) is float and v.is_integer())
        if t == "number":
            return type(v) in (int, float)
        return type(v) is kinds[t]
    checks = [
        ("type", lambda t: any(is_type(x) for x in (t if isinstance(t, list) else [t]))),
        ("enum", lambda xs: v in xs), ("const", lambda x: v == x),
        ("anyOf", lambda xs: any(_fits(v, x, root) for x in xs)),
        ("oneOf", lambda xs: sum(_fits(v, x, root) for x in xs) == 1),
    ]
    if type(v) in (int, float):
        checks += [("minimum", lambda m: v >= m), ("maximum", lambda m: v <= m),
                   ("exclusiveMinimum", lambda m: v > m), ("exclusiveMaximum", lambda m: v < m)]
    if isinstance(v, str):
        checks += [("minLength", lambda m: len(v) >= m), ("maxLength", lambda m: len(v) <= m),
                   ("pattern", lambda p: re.search(p, v) is not None)]
    if isinstance(v, list):
        checks += [("minItems", lambda m: len(v) >= m), ("maxItems", lambda m: len(v) <= m),
                   ("items", lambda x: all(_fits(i, x, root) for i in v))]
    if isinstance(v, dict):
        props = s.get("properties", {})
        checks += [("required", lambda r: all(k in v for k in r)),
                   ("properties", lambda p: all(_fits(v[k], x, root) for k, x in p.items() if k in v)),
                   ("additionalProperties", lambda a: a is not False or set(v) <= set(props))]
    return all(check(s[key]) for key, check in checks if key in s)


def _accepted(parse: Callable[[bytes], Any], body: dict) -> bool:
    try:
        parse(json.dumps(body).encode())
        return True
    except ApiError:
        return False


CHAT = {"messages": [{"role": "user", "content": "Hi"}]}
PARSERS: dict[str, Callable[[bytes], Any]] = {
    "/v1/chat/completions": lambda raw: openai.parse("chat", raw),
    "/v1/completions": lambda raw: openai.parse("completion", raw),
    "/completion": native_completion.parse, "/infill": infill.parse, "/v1/messages": anthropic.parse,
    "/v1/embeddings": embeddings.parse_openai, "/embedding": embeddings.parse_native,
}
ACCEPTED: list[tuple[str, dict]] = [
    ("/v1/chat/completions", CHAT),
    ("/v1/chat/completions", {**CHAT, "model": "smollm2-135m", "max_tokens": 0, "temperature": 2, "n": 1,
                              "stop": ["a", "", "", "", "", "b" * 4096], "seed": -1, "top_logprobs": 3, "logprobs": True}),
    ("/v1/chat/completions", {"messages": [{"role": "developer", "content": None},
                                           {"role": "user", "content": [{"type": "text", "text": "a", "x": 1}]},
                                           {"role": "tool", "content": "r", "tool_call_id": "c1"}],
                              "response_format": {"type": "json_object"}}),
    ("/v1/chat/completions", {**CHAT, "grammar": 'root ::= "a"', "stop": "x", "n_predict": -1, "id_slot": -1}),
    ("/v1/completions", {"prompt": "x"}),
    ("/v1/completions", {"prompt": ["x"], "logprobs": 5, "stop": None, "response_format": None}),
    ("/completion", {"prompt": "x"}), ("/completion", {"prompt": [1, 2, INT32_MAX]}),
    ("/completion", {"prompt": [[1, 2]]}), ("/completion", {"prompt": ["x"], "n_probs": 2, "n_predict": -1}),
    ("/infill", {"input_prefix": "a", "input_suffix": ["b", 5], "input_extra": [{"text": "t", "filename": "f"}]}),
    ("/infill", {"input_prefix": [], "input_suffix": "", "prompt": "p"}),
    ("/v1/messages", {"max_tokens": 1, **CHAT}),
    ("/v1/messages", {"max_tokens": 8, "system": [{"type": "text", "text": "s", "cache_control": {"type": "x"}}],
                      "messages": [{"role": "user", "content": [{"type": "text", "text": "a", "citations": []}]}],
                      "stop_sequences": ["x"], "temperature": 1, "thinking": {"type": "disabled"}}),
    ("/v1/embeddings", {"input": "a"}), ("/v1/embeddings", {"input": [1, 2], "encoding_format": "base64"}),
    ("/v1/embeddings", {"input": ["a", [3]], "dimensions": 8, "user": None, "model": "m", "anything": 1}),
    ("/embedding", {"content": "a", "embd_normalize": -1}), ("/embedding", {"input": [[1]], "model": None}),
]
REFUSED: list[tuple[str, dict]] = [
    ("/v1/chat/completions", {"messages": []}), ("/v1/chat/completions", {"messages": [{"content": "x"}]}),
    ("/v1/chat/completions", {"messages": [{"role": "robot", "content": "x"}]}),
    ("/v1/chat/completions", {**CHAT, "n": 17}), ("/v1/chat/completions", {**CHAT, "stop": "b" * 4097}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": 5}]}),
    ("/v1/chat/completions", {**CHAT, "response_format": {"type": "yaml"}}),
    ("/v1/completions", {"prompt": ["a", "b"]}), ("/v1/completions", {"prompt": []}),
    ("/completion", {"prompt": []}), ("/completion", {"prompt": [-1]}), ("/completion", {}),
    ("/infill", {"input_prefix": "a"}), ("/infill", {"input_prefix": "a", "input_suffix": [-1]}),
    ("/v1/messages", {"max_tokens": 0, **CHAT}), ("/v1/messages", {"max_tokens": 1, "messages": []}),
    ("/v1/messages", {"max_tokens": 1, "messages": [{"role": "system", "content": "x"}]}),
    ("/v1/messages", {"max_tokens": 1, "messages": [{"role": "user", "content": "x", "name": "n"}]}),
    ("/v1/embeddings", {"input": ""}), ("/v1/embeddings", {"input": []}), ("/v1/embeddings", {"input": "a", "dimensions": 0}),
    ("/embedding", {"content": "a", "input": "b"}), ("/embedding", {}), ("/embedding", {"content": "a", "x": 1}),
]


@pytest.mark.parametrize("path, body", ACCEPTED, ids=[f"{p} {i}" for i, (p, _) in enumerate(ACCEPTED)])
def test_every_body_the_parser_accepts_fits_the_schema(path: str, body: dict) -> None:
    assert _accepted(PARSERS[path], body), "the case itself is wrong: the parser refuses it"
    for doc in (_engine_doc(), _front_doc()):
        assert _fits(body, _body(doc, path), doc), f"{path}: the schema refuses a body its parser accepts"


@pytest.mark.parametrize("path, body", REFUSED, ids=[f"{p} {i}" for i, (p, _) in enumerate(REFUSED)])
def test_the_schema_refuses_what_the_parser_refuses_by_its_shape(path: str, body: dict) -> None:
    """The point of the tightening: a generator that follows the schema does not make these."""
    assert not _accepted(PARSERS[path], body), "the case itself is wrong: the parser accepts it"
    doc = _engine_doc()
    assert not _fits(body, _body(doc, path), doc)


def test_the_route_serves_the_document_and_describes_itself() -> None:
    async def ok(_: object) -> None:
        return None

    routes = [Route("/a", ok), Route("/b/{x}", ok, methods=["POST"])]
    app = Starlette(routes=[*routes, openapi_route(routes, "t", "1")])
    doc = TestClient(app).get("/openapi.json").json()
    assert set(doc["paths"]) == {"/a", "/b/{x}", "/openapi.json"}
    assert doc["paths"]["/b/{x}"]["post"]["requestBody"]["content"]["application/json"]["schema"] == {"type": "object"}
