"""An OpenAPI 3.1 description of a daemon's HTTP doors, built from its own route table.

Each daemon serves it at ``GET /openapi.json`` so that generic API tools (clients generated from it,
schema-driven fuzzers such as schemathesis) can reach every door without a hand-written copy that
drifts: a route added to the app is described the moment it exists. Request bodies are described by
the pydantic models the doors really parse with where there is one (chat, completions, llama-server's
``/completion`` and ``/infill``, Anthropic's messages), or by a JSON schema written beside the parser
(``hydrad.wire.bodies``); the rest as "a JSON object" (their parsers check field by field and answer
400 naming the field, which is what a fuzzer should find). A schema says what the parser really
requires (required fields, types, ranges) and never more: a body it allows may still be refused
(a 400 naming the field), but no body the parser accepts is outside it. Every operation may answer
an OpenAI-shaped error.
"""

from __future__ import annotations

import re
from typing import Any, Mapping, Sequence

from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import BaseRoute, Route

ERROR = {"type": "object", "required": ["error"], "properties": {"error": {
    "type": "object", "required": ["message", "type"],
    "properties": {"message": {"type": "string"}, "type": {"type": "string"},
                   "code": {"type": ["string", "null"]}, "param": {"type": ["string", "null"]}}}}}
ANY_OBJECT: dict[str, Any] = {"type": "object"}
BINARY = {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}
_PARAM = re.compile(r"{([A-Za-z_][A-Za-z0-9_]*)(?::[a-z]+)?}")


def describe(routes: Sequence[BaseRoute], title: str, version: str,
             bodies: Mapping[str, type[BaseModel] | dict[str, Any]] | None = None,
             binary_bodies: frozenset[str] = frozenset()) -> dict[str, Any]:
    """The document for ``routes``: ``bodies`` maps a path to the model (or JSON schema) of its
    request body; a path in ``binary_bodies`` takes raw bytes (the KV state upload)."""
    bodies = bodies or {}
    paths: dict[str, dict[str, Any]] = {}
    components: dict[str, Any] = {}
    for route in routes:
        if not isinstance(route, Route):
            continue
        path = _PARAM.sub(r"{\1}", route.path)
        params = [{"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
                  for name in _PARAM.findall(route.path)]
        for method in sorted((route.methods or {"GET"}) - {"HEAD"}):
            op: dict[str, Any] = {
                "operationId": f"{method.lower()}_{re.sub(r'[^A-Za-z0-9]+', '_', path).strip('_') or 'root'}",
                "responses": {"200": {"description": "the answer (JSON, or a server-sent event stream when "
                                                      "the request asks to stream)"},
                              "default": {"description": "an error", "content": {
                                  "application/json": {"schema": ERROR}}}}}
            if params:
                op["parameters"] = params
            if method in ("POST", "PUT", "PATCH"):
                if path in binary_bodies:
                    op["requestBody"] = {"required": True, "content": BINARY}
                else:
                    schema = _schema(bodies.get(path, ANY_OBJECT), components)
                    op["requestBody"] = {"required": True, "content": {"application/json": {"schema": schema}}}
            paths.setdefault(path, {})[method.lower()] = op
    doc: dict[str, Any] = {"openapi": "3.1.0", "info": {"title": title, "version": version}, "paths": paths}
    if components:
        doc["components"] = {"schemas": components}
    return doc


def _schema(body: type[BaseModel] | dict[str, Any], components: dict[str, Any]) -> dict[str, Any]:
    """A body's JSON schema; a model's nested models go to ``components`` (pydantic puts them in a
    ``$defs`` of the model's own, which a reference inside an OpenAPI document cannot reach)."""
    if not isinstance(body, type):
        return body
    schema = body.model_json_schema(ref_template="#/components/schemas/{model}")
    for name, sub in schema.pop("$defs", {}).items():
        if components.setdefault(name, sub) != sub:
            raise ValueError(f"two request models both name a nested model {name}")
    return schema


def openapi_route(routes: Sequence[BaseRoute], title: str, version: str, **kwargs: Any) -> Route:
    """``GET /openapi.json`` for ``routes`` (itself included), built once."""
    doc: dict[str, Any] = {}

    async def serve(_: Request) -> JSONResponse:
        if not doc:
            doc.update(describe([*routes, route], title, version, **kwargs))
        return JSONResponse(doc)

    route = Route("/openapi.json", serve)
    return route
