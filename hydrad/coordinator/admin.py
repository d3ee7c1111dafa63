"""The coordinator's admin API: the engine registry and profile switching.

``POST /admin/profile {"name": ...}`` waits for the switch by default and answers with its
total time and every engine's result (``"wait": false`` answers 202 at once; progress is on
the PUB socket and in ``GET /admin/profile``). The switch runs as its own task, so a client
that hangs up does not abort a half-done switch.
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
from hydrad.coordinator.switcher import ProfileSwitcher, SwitchBusy
from hydrad.http.openai import ApiError


def admin_routes(bus: CoordinatorBus, switcher: ProfileSwitcher, affinity: Affinity) -> list[Route]:
    async def engines(_: Request) -> Response:
        sessions = affinity.counts()
        out = []
        for name, rec in sorted(bus.engines.items()):
            item = rec.public()
            item["inflight"] = bus.inflight(name)
            item["sessions"] = sessions.get(name, 0)
            item["configuring"] = switcher.configuring.get(name)
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

    return [Route("/admin/engines", engines), Route("/admin/profile", get_profile),
            Route("/admin/profile", post_profile, methods=["POST"])]
