"""The coordinator's admin API: the engine registry, profile switching and routing explained.

``GET /admin/engines`` lists every engine's registration and latest status, with the COMBINE
role it reports (``mode``, ``role``, ``peers``, ``serving``) and its ``pair`` by engine name
(``records.pairs``: ``pair_peers`` for a head, ``pair_heads`` for a peer, ``pair`` both).

``POST /admin/profile {"name": ...}`` waits for the switch by default and answers with its
total time and every engine's result (``"wait": false`` answers 202 at once; progress is on
the PUB socket and in ``GET /admin/profile``). The switch runs as its own task, so a client
that hangs up does not abort a half-done switch.

``POST /admin/route`` takes the body of a chat request (``messages``) or a completion request
(``prompt``), with ``model``, ``max_tokens`` and ``session_id`` (or the ``X-Session-Id``
header) as the front door reads them, and answers with the decision routing would take for
it right now (``Decision.public()``: engine, step, reason, candidates with their costs,
rejected engines with why) plus the request as routing saw it. Nothing is generated, loaded
or published; a bad body is the same 400 and an unknown model the same 404 as on
``/v1/chat/completions``.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from hydrad.coordinator.affinity import Affinity
from hydrad.coordinator.bus import CoordinatorBus
from hydrad.coordinator.frontdoor import FrontDoor
from hydrad.coordinator.records import pairs
from hydrad.coordinator.switcher import ProfileSwitcher, SwitchBusy
from hydrad.wire.openai import ApiError, ChatRequest, CompletionRequest

def _request_schema(model: type[ChatRequest] | type[CompletionRequest]) -> dict[str, Any]:
    """A request model's schema whose nested models (a request's ``lora`` entries) are referred to where the
    front door's own bodies of the same models put them: the document's components."""
    schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
    schema.pop("$defs", None)
    return schema


ADMIN_BODIES: dict[str, dict[str, Any]] = {
    "/admin/profile": {"type": "object", "required": ["name"], "properties": {"name": {"type": "string"}}},
    "/admin/route": {"anyOf": [_request_schema(ChatRequest), _request_schema(CompletionRequest)]},
    "/admin/sessions/move": {"type": "object", "required": ["session", "engine"],
                             "properties": {"session": {"type": "string"}, "engine": {"type": "string"}}},
}
"""The admin doors' bodies as /openapi.json describes them: what each handler checks, no more
(``/admin/route`` reads a body with ``messages`` as a chat request, any other as a completion)."""


def admin_routes(bus: CoordinatorBus, switcher: ProfileSwitcher, affinity: Affinity,
                 front: FrontDoor | None = None) -> list[Route]:
    async def engines(_: Request) -> Response:
        sessions = affinity.counts()
        paired = pairs(bus.engines)
        out = []
        for name, rec in sorted(bus.engines.items()):
            item = rec.public()
            item.update(paired[name].public())  # mode/role/peers/serving are the engine's own; pair by name
            item["inflight"] = bus.inflight(name)
            item["sessions"] = sessions.get(name, 0)
            item["configuring"] = switcher.configuring.get(name)
            item["last_configure"] = switcher.results.get(name)
            out.append(item)
        return JSONResponse({"engines": out, "profile": switcher.active})

    async def get_profile(_: Request) -> Response:
        return JSONResponse(switcher.public())

    async def post_profile(request: Request) -> Response:
        try:
            body: Any = json.loads(await request.body() or b"null")
        except (ValueError, RecursionError):
            raise ApiError(400, "body must be JSON like {\"name\": \"dense\"}", "invalid_json") from None
        if not isinstance(body, dict) or not isinstance(body.get("name"), str):
            raise ApiError(400, "body must be a JSON object with a string 'name'", "invalid_field", "name")
        wait = body.get("wait", True)
        try:
            task = switcher.start_switch(body["name"])
        except KeyError as exc:
            raise ApiError(404, str(exc.args[0]), "profile_not_found", "name") from None
        except SwitchBusy as exc:
            raise ApiError(409, str(exc), "busy", headers={"Retry-After": "1"}) from None
        if not wait:
            return JSONResponse({"profile": body["name"], "state": "switching"}, status_code=202,
                                headers={"Location": "/admin/profile"})
        result = await asyncio.shield(task)
        return JSONResponse(result, status_code=200 if result["ok"] else 502)

    async def explain_route(request: Request) -> Response:
        assert front is not None
        raw = await request.body()
        try:
            body: Any = json.loads(raw or b"null")
        except (ValueError, RecursionError):
            raise ApiError(400, "body must be JSON like {\"messages\": [...]} or {\"prompt\": \"...\"}",
                           "invalid_json") from None
        if not isinstance(body, dict):
            raise ApiError(400, "body must be a JSON object with 'messages' or 'prompt'", "invalid_request")
        return JSONResponse(front.explain("chat" if "messages" in body else "completion", raw, request))

    async def sessions(_: Request) -> Response:
        """The session keeper's counters and its store's (``{"keep": false}`` when it is off)."""
        assert front is not None
        keeper = front.sessions
        if keeper is None:
            return JSONResponse({"keep": False})
        stats = await asyncio.get_running_loop().run_in_executor(None, keeper.store.stats)
        return JSONResponse({"keep": True, **keeper.public(), "store": stats})

    async def move_session(request: Request) -> Response:
        """Move a session's KV to ENGINE now (engine to engine; its next turn goes there, pinned)."""
        assert front is not None
        try:
            body: Any = json.loads(await request.body() or b"null")
        except (ValueError, RecursionError):
            raise ApiError(400, "body must be JSON like {\"session\": \"s1\", \"engine\": \"gpu1\"}",
                           "invalid_json") from None
        if not isinstance(body, dict) or not isinstance(body.get("session"), str) or not isinstance(body.get("engine"), str):
            raise ApiError(400, "body must be a JSON object with string 'session' and 'engine'", "invalid_request")
        return JSONResponse(await front.move_session(body["session"], body["engine"]))

    routes = [Route("/admin/engines", engines), Route("/admin/profile", get_profile),
              Route("/admin/profile", post_profile, methods=["POST"])]
    if front is not None:
        routes.append(Route("/admin/route", explain_route, methods=["POST"]))
        routes.append(Route("/admin/sessions", sessions))
        routes.append(Route("/admin/sessions/move", move_session, methods=["POST"]))
    return routes
