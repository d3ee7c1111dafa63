"""/openapi.json: every route of the engine's app is described, with the request models the doors
parse with, path parameters, the binary KV upload, and the OpenAI error shape."""

from __future__ import annotations

import json

from starlette.applications import Starlette
from starlette.routing import Route
from starlette.testclient import TestClient

from hydrad.common.openapi import describe, openapi_route
from hydrad.engine.http.app import ROUTES
from hydrad.wire.native_completion import REQUEST_MODELS


def _doc() -> dict:
    return describe(ROUTES, "hydrad", "t", bodies=REQUEST_MODELS, binary_bodies=frozenset({"/slots/{slot}/state"}))


def test_every_engine_route_and_method_is_described() -> None:
    doc = _doc()
    assert doc["openapi"].startswith("3.1")
    json.dumps(doc)
    for r in ROUTES:
        assert isinstance(r, Route)
        for method in (r.methods or {"GET"}) - {"HEAD"}:
            assert method.lower() in doc["paths"][r.path], (r.path, method)
    ids = [op["operationId"] for ops in doc["paths"].values() for op in ops.values()]
    assert len(ids) == len(set(ids)), "operation ids must be unique"


def test_bodies_are_the_parsers_models_and_the_rest_is_an_object() -> None:
    paths = _doc()["paths"]
    chat = paths["/v1/chat/completions"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert "messages" in chat["properties"] and "temperature" in chat["properties"]
    native = paths["/completion"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert "prompt" in native["properties"] and "n_probs" in native["properties"]
    assert paths["/tokenize"]["post"]["requestBody"]["content"]["application/json"]["schema"] == {"type": "object"}
    assert "application/octet-stream" in paths["/slots/{slot}/state"]["put"]["requestBody"]["content"]
    assert paths["/slots/{slot}/state"]["get"]["parameters"][0]["name"] == "slot"
    err = paths["/health"]["get"]["responses"]["default"]["content"]["application/json"]["schema"]
    assert err["required"] == ["error"]


def test_the_route_serves_the_document_and_describes_itself() -> None:
    async def ok(_: object) -> None:
        return None

    routes = [Route("/a", ok), Route("/b/{x}", ok, methods=["POST"])]
    app = Starlette(routes=[*routes, openapi_route(routes, "t", "1")])
    doc = TestClient(app).get("/openapi.json").json()
    assert set(doc["paths"]) == {"/a", "/b/{x}", "/openapi.json"}
    assert doc["paths"]["/b/{x}"]["post"]["requestBody"]["content"]["application/json"]["schema"] == {"type": "object"}
