"""The front door: every generating endpoint of the pool over one path — OpenAI's
``/v1/chat/completions`` and ``/v1/completions``, Anthropic's ``/v1/messages``, llama-server's
``/completion`` and ``/infill`` — plus ``/v1/models``, ``/health`` and ``/metrics``.

A request is parsed exactly as an engine parses it (``hydrad.wire``, on a preparation worker, not
the event loop), routed over a snapshot of the engines (``routing.route``: session affinity,
prefix-aware), and sent as GENERATE over the bus; its events come back (``answers``) and its
dialect's renderer (``hydrad.wire.render``) makes the answer, as on the engine's own door.
Failure rules, so a client never hangs and never sees a bare 500:

- a request is retried on another engine (once) only when the *engine* failed, never when the
  request did: the engine was lost, unreachable or silent **before the first token**; it
  answered ``engine_failed`` (its engine thread died, it is stopping); or it answered 503 with
  a code that means "not now" (:data:`hydrad.coordinator.answers.RETRY_CODES`). A 4xx, or a 500 with ``engine_failed``
  false, is the request's own fault and would be the same anywhere: retrying it would only
  hurt a second engine (a request that crashes an engine would take the pool down one by one);
- a second failure (or no other candidate) is a 503 that says what happened;
- **after the first token**: a stream ends with its dialect's error event; a
  non-streaming request is retried only on ``engine_failed``, otherwise it gets a 502/504;
- every wait has a bound (``first_token_timeout_s``, ``token_timeout_s``);
- no candidate at all: 503 with routing's reason (which names every engine and why not);
- the client going away (streaming or not, before or after the first token) cancels the
  request on its engine at once: nobody would read what it generates.

Every decision is logged and published (topic ``route``) with its scores.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from pathlib import Path
from typing import Any, Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from hydrad.wire import messages as M
from hydrad.coordinator.affinity import Affinity
from hydrad.coordinator.burst import Arrival, BurstGate
from hydrad.coordinator.bus import CoordinatorBus
from hydrad.coordinator.records import EngineRecord, EngineUnreachable, RequestUnsendable
from hydrad.coordinator.metrics import CONTENT_TYPE, CoordinatorMetrics
from hydrad.coordinator.native import EMBEDDING_PATHS, PATHS as NATIVE_PATHS, NativeDoor
from hydrad.common.eventstream import EventStream
from hydrad.common.prepare import Preparer, client_key
from hydrad.common.serving import CancelOnLeave
from hydrad.wire import answering
from hydrad.coordinator.answers import STREAM_HEADERS, BusEvents, Lost, Started, Turn, retry_reason
from hydrad.coordinator.mobility import LEAVING_STAGES, SessionMobility
from hydrad.coordinator.sessions import SessionKeeper
from hydrad.coordinator.kvmove import Placements, TransferMeter
from hydrad.coordinator.pdsplit import SplitPlan, TransferRates, plan_split, split_excluded
from hydrad.coordinator.routing import (
    Decision, EngineView, ModelSpec, RouteRequest, RoutingPolicy, route,
)
from hydrad.coordinator.switcher import LoadFailed, ProfileSwitcher
from hydrad.coordinator.requestkinds import (
    Answer, Outcome, estimates as estimated, messages_answer, native_answer, openai_answer, responses_answer,
    session_id_of,
)
from hydrad.coordinator.splitrun import SplitRunner, generate_message
from hydrad.coordinator.poolview import PoolView
from hydrad.wire.requests import GenRequest, next_request_id
from hydrad.wire.stages import INCOMING_STAGES
from hydrad.wire import anthropic, events, infill, native_completion, openai, responses
from hydrad.wire.render import ChatAnswer, CompletionAnswer, MessagesAnswer
from hydrad.wire.openai import ApiError
from hydrad.common.logs import log_event
from hydrad.common.registry import Registry
from hydrad.common.tenants import cache_namespace, scoped, store_owner, store_quota_of, tenant_of
from hydrad.common.tokenfile import read_token

log = logging.getLogger("hydra.coordinator")

class FrontDoor:
    def __init__(self, settings: Any, bus: CoordinatorBus, switcher: ProfileSwitcher, registry: Registry,
                 affinity: Affinity | None = None, sessions: SessionKeeper | None = None) -> None:
        self.settings = settings
        self.bus = bus
        self.switcher = switcher
        self.registry = registry
        self.policy = RoutingPolicy(affinity_margin_s=settings.affinity_margin_s)
        # one record of where sessions' KV lives, shared with the keeper (affinity.py says what it holds)
        self.affinity = affinity or (sessions.places if sessions is not None else Affinity())
        if sessions is not None and sessions.places is not self.affinity:
            raise ValueError("the session keeper and the front door must share one Affinity (places=)")
        self.sessions = sessions  # keeps sessions' KV in the Store (None: sessions.keep is off)
        self.meter = TransferMeter()  # engine-to-engine KV transfers, for the split's plans
        self.placements = sessions.placements if sessions is not None else Placements()
        token_file = settings.sessions.engine_token_file
        self.engine_token = read_token(token_file) if token_file else None
        self.specs = {alias: ModelSpec.from_entry(alias, e) for alias, e in registry.entries.items()}
        self.mobility = SessionMobility(bus, sessions, self.affinity, self.meter, self.specs)
        self.splits = SplitRunner(settings, bus, self.meter, self.placements, self.engine_token)
        self.pool = PoolView(settings, bus, switcher, self.affinity)
        self.admitting = True
        self.burst = BurstGate()  # a burst of requests leaves for the engines together (burst.py says why)
        self.prep = Preparer(openai.too_many_pending, name="coordinator-prep")  # parsing off the event loop
        self._models: dict[str, str | None] = {}
        self._stages: dict[str, tuple[bool, str]] = {}
        self._processes: dict[str, str] = {}
        self._changed = asyncio.Event()
        self.metrics = CoordinatorMetrics(bus)
        # llama-server's native endpoints, forwarded over HTTP (native.py says why /completion is too)
        self.native = NativeDoor(bus.engines, self.served, self._pick, settings, self.prep)
        bus.listeners.append(self._on_engine)

    # ----- pool view -------------------------------------------------------------------

    def _on_engine(self, kind: str, rec: EngineRecord) -> None:
        """An engine's KV is gone when it died, restarted or changed model: forget what it held."""
        model = rec.status.model
        process = rec.info.instance.split(".")[0]
        restarted = kind == "up" and self._processes.get(rec.name) != process  # a reconnect keeps its KV
        self._processes[rec.name] = process
        if kind == "down" or restarted or (kind == "status" and self._models.get(rec.name) != model):
            n = self.affinity.forget_engine(rec.name)
            if n:
                log_event(log, logging.INFO, "sessions forgotten", engine=rec.name, sessions=n, why=kind)
        self._models[rec.name] = model
        leaving = rec.status.stage in LEAVING_STAGES and self._stages.get(rec.name, (True, ""))[1] not in LEAVING_STAGES
        if self.sessions is not None and kind == "status" and rec.alive and leaving:
            asyncio.get_running_loop().create_task(self.mobility.evacuate(rec.name, rec.status.stage))
        state = (rec.alive, rec.status.stage)
        if kind != "status" or self._stages.get(rec.name) != state:
            self._stages[rec.name] = state
            changed, self._changed = self._changed, asyncio.Event()
            changed.set()  # wakes requests waiting for a model that is loading

    def views(self, session: str | None = None, prefix: str | None = None, model: str | None = None) -> list[EngineView]:
        """What routing sees (:meth:`hydrad.coordinator.poolview.PoolView.views`)."""
        return self.pool.views(session, prefix, model)

    def served(self) -> dict[str, list[str]]:
        """Model → engines serving it now (alive, in a serving stage)."""
        return self.pool.served()

    def _model(self, name: str | None) -> str | None:
        """A request's ``model`` as the pool names it (:meth:`_pick`)."""
        return self._pick(name)[0]

    def _pick(self, name: str | None) -> tuple[str | None, bool]:
        """The model a request's ``model`` names (a registry key or alias, a file's name or stem, or a
        model an engine serves), and whether ``default_model`` stands in for it. No name: the one
        model served, else ``default_model``, else a 400 naming those served (none served: None, and
        routing says why). An unknown name: ``default_model``, else a 404 naming the known ones."""
        default = self.settings.default_model
        if not name:
            served = self.served()
            if len(served) <= 1:
                return next(iter(served), None), False
            if default is not None:
                return self.registry.key_of(default) or default, True
            raise ApiError(400, f"this pool serves several models ({', '.join(sorted(served))}); name one in "
                           "'model'", "invalid_field", "model")
        key = self.registry.key_of(name)
        if key is not None:
            return key, False
        served = self.served()
        if name in served:
            return name, False
        if default is not None:
            return self.registry.key_of(default) or default, True
        known = ", ".join(sorted(set(self.registry.entries) | set(served))) or "none"
        raise ApiError(404, f"model '{name}' is not known to this pool (known: {known})", "model_not_found", "model")

    # ----- routing ---------------------------------------------------------------------

    def _route(self, rr: RouteRequest, exclude: set[str], rid: str, attempt: int) -> Decision:
        return route(rr, self.views(rr.session_id, rr.prefix_hash, rr.model), self.specs, exclude=frozenset(exclude),
                     policy=self.policy)

    def _announce_soon(self, rr: RouteRequest, decision: Decision, rid: str, attempt: int) -> None:
        """Log and publish a decision a pass of the loop later: called once GENERATE is on its way,
        since the announcement costs about a quarter of the coordinator's per-request time."""
        asyncio.get_running_loop().call_soon(self._announce, rr, decision, rid, attempt)

    def _announce(self, rr: RouteRequest, decision: Decision, rid: str, attempt: int) -> None:
        self.metrics.decisions.labels(decision.step).inc()
        scores = ",".join(f"{c.engine}={c.cost_s:.3f}" for c in decision.candidates) or "-"
        log_event(log, logging.INFO, "route", req=rid, attempt=attempt, engine=decision.engine or "-",
                  model=decision.model or "-", step=decision.step, scores=scores, session=rr.session_id or "-",
                  reason=decision.reason)
        self.bus.publish("route", req=rid, attempt=attempt, session=rr.session_id, **decision.public())

    def _loading(self, model: str | None, exclude: set[str]) -> list[str]:
        """Engines (not excluded) on their way to serving ``model``: loading it, or being configured for
        it (a registering engine is configured before its first heartbeat says it loads)."""
        return [r.name for r in self.bus.engines.values()
                if model is not None and r.alive and r.name not in exclude
                and model in (r.status.loading_model, self.switcher.heading(r.name))]

    async def _await_model(self, rr: RouteRequest, exclude: set[str], rid: str, attempt: int,
                           decision: Decision) -> Decision:
        """No engine serves the model right now but one is loading it (a profile switch, a restart):
        wait for the pool to change, bounded by ``first_token_timeout_s``, instead of failing."""
        loading = self._loading(rr.model, exclude)
        log_event(log, logging.INFO, "waiting for a loading model", req=rid, model=rr.model, engines=",".join(loading))
        deadline = time.monotonic() + self.settings.first_token_timeout_s
        while loading and (remaining := deadline - time.monotonic()) > 0:
            changed = self._changed
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(changed.wait(), min(remaining, 1.0))
            candidate = route(rr, self.views(rr.session_id, rr.prefix_hash, rr.model), self.specs,
                              exclude=frozenset(exclude), policy=self.policy)
            if candidate.engine is not None:
                return self._route(rr, exclude, rid, attempt)
            decision = candidate
            loading = self._loading(rr.model, exclude)
        return decision

    async def _ensure(self, engine: str, model: str | None) -> None:
        """Routing may pick an engine that has the model on disk but serves another: load it first."""
        rec = self.bus.engines.get(engine)
        if model is None or rec is None:
            return
        st = rec.status
        if st.model == model or (st.stage in INCOMING_STAGES and st.loading_model == model):
            return
        await self.switcher.ensure_model(engine, model)

    # ----- handlers --------------------------------------------------------------------

    async def serve(self, request: Request, parse: Callable[[bytes], tuple[Any, GenRequest]],
                    answer: Callable[[Any, GenRequest], Answer]) -> Response:
        """Every generating endpoint of the front door: the body parsed by ``parse`` on a preparation
        worker, then routed, sent, retried and answered by ``answer(req, greq)``'s renderer, with the
        request's outcome counted in the metrics."""
        if not self.admitting:
            raise ApiError(503, "the coordinator is shutting down", "shutting_down", headers={"Retry-After": "5"})
        outcome = Outcome(time.monotonic())
        try:
            with self.burst.arrival() as arrival:
                req, greq = await self.prep.parse(request, await request.body(),
                                                  lambda raw: outcome.measured(parse(raw)))
                greq.slot = None  # a slot number means nothing across engines
                greq.client = client_key(request)  # the engines' queues take clients in turn
                greq.cache_ns = cache_namespace(tenant_of(request.state), greq.cache_salt)
                greq.store_quota = store_quota_of(request.state)
                outcome.session = session_id_of(req, request)
                # one tenant's session id, or conversation, never leads to another's KV
                session = scoped(greq.cache_ns, outcome.session) if outcome.session else None
                outcome.model, outcome.defaulted = self._pick(req.model)
                response = await self._watched(request, greq, session, outcome, arrival, answer(req, greq))
        except ApiError as exc:
            self.metrics.request(outcome.model, outcome.engine, exc.status)
            raise
        except Exception:
            self.metrics.request(outcome.model, outcome.engine, 500)
            raise
        self.metrics.request(outcome.model, outcome.engine, response.status_code)
        return response

    async def _watched(self, request: Request, greq: GenRequest, session: str | None, outcome: Outcome,
                       arrival: Arrival, answer: "Answer") -> Response:
        # From here on the request waits on engines: watch the client meanwhile, and cancel the
        # request on its engine the moment the client goes (a non-streaming request has no
        # send that would fail; without this it would generate to max_tokens for nobody).
        async with CancelOnLeave(request.receive):
            if answer.choices > 1:
                return await self._generate_choices(greq, outcome, arrival, answer, answer.choices)
            return await self._generate(greq, session, outcome, arrival, answer)
        log_event(log, logging.INFO, "client went away; request cancelled", req=answer.rid)
        return Response(status_code=499)  # nobody reads it; uvicorn drops it

    async def _generate(self, greq: GenRequest, session: str | None, outcome: Outcome, arrival: Arrival,
                        answer: "Answer") -> Response:
        rid = answer.rid
        rr = self.route_request(greq, outcome.model, session, outcome.estimates)
        exclude: set[str] = set()
        failures: list[str] = []
        for attempt in (1, 2):
            st = await self._attempt(rr, greq, session, outcome, arrival, rid, exclude, failures, attempt)
            if st is None:
                continue
            r = answer.renderer(st.served or "", self._fingerprint(st.engine))

            def record(reply: str, done: events.Done, turn: Turn = st.turn) -> None:
                self._record(turn, reply, done)

            source = BusEvents(self.bus, st.stream, self.settings.token_timeout_s, st.engine, rid, not answer.streamed)
            if answer.streamed:
                return EventStream(answering.stream(source, r, source.event(st.first), record),
                                   headers={**st.headers, **STREAM_HEADERS})
            try:
                body, done = await answering.whole(source, r, source.event(st.first), record)
            except Lost as exc:  # engine_failed part-way: the engine's fault, and nothing was sent
                failures.append(str(exc))
                exclude.add(st.engine)
                log_event(log, logging.WARNING, "request failed part-way; retrying elsewhere" if attempt == 1
                          else "request failed again", req=rid, engine=st.engine, error=str(exc))
                continue
            return JSONResponse(body, headers={**st.headers, "X-Hydra-Generation": done.fingerprint})
        raise ApiError(503, "the request failed twice: " + "; then ".join(failures), "engine_failed",
                       headers={"Retry-After": "1"})

    async def _generate_choices(self, greq: GenRequest, outcome: Outcome, arrival: Arrival, answer: "Answer",
                                n: int) -> Response:
        """OpenAI's ``n``: each choice a request of its own (routed, and retried before its first token,
        as any), answered as one with each choice's index. Choices keep no session: several answers
        to one turn are not one conversation."""
        rid = answer.rid

        async def start(g: GenRequest) -> Started:
            rr = self.route_request(g, outcome.model, None, outcome.estimates)
            exclude: set[str] = set()
            failures: list[str] = []
            for attempt in (1, 2):
                st = await self._attempt(rr, g, None, outcome, arrival, rid, exclude, failures, attempt)
                if st is not None:
                    return st
            raise ApiError(503, "the request failed twice: " + "; then ".join(failures), "engine_failed",
                           headers={"Retry-After": "1"})

        subs = [greq, *(dataclasses.replace(greq, id=next_request_id()) for _ in range(n - 1))]
        tasks = [asyncio.ensure_future(start(g)) for g in subs]
        try:
            await asyncio.wait(tasks)
        except asyncio.CancelledError:  # the client left while the choices started: none goes on
            for t in tasks:
                t.cancel()
                if t.done() and not t.cancelled() and t.exception() is None:
                    self.bus.cancel(t.result().stream)
            raise
        started = [t.result() for t in tasks if not t.cancelled() and t.exception() is None]
        failed = next((t.exception() for t in tasks if not t.cancelled() and t.exception() is not None), None)
        if failed is not None:
            for st in started:
                self.bus.cancel(st.stream)
            raise failed
        sources = [BusEvents(self.bus, st.stream, self.settings.token_timeout_s, st.engine, rid, False)
                   for st in started]
        firsts = [src.event(st.first) for src, st in zip(sources, started)]
        rs = [answer.renderer(st.served or "", self._fingerprint(st.engine), i) for i, st in enumerate(started)]
        headers = started[0].headers
        if answer.streamed:
            return EventStream(answering.stream_choices(list(sources), rs, firsts), headers={**headers, **STREAM_HEADERS})
        body, last = await answering.whole_choices(list(sources), rs, firsts)
        return JSONResponse(body, headers={**headers, "X-Hydra-Generation": last.fingerprint})

    async def _attempt(self, rr: RouteRequest, greq: GenRequest, session: str | None, outcome: Outcome,
                       arrival: Arrival, rid: str, exclude: set[str], failures: list[str],
                       attempt: int) -> "Started | None":
        """One try of a request: routed, sent, and its first event awaited; None when it is to be tried
        again elsewhere (``exclude`` and ``failures`` say where it failed and why), ApiError when no
        engine can take it or the request itself is at fault."""
        decision = self._route(rr, exclude, rid, attempt)
        if decision.engine is None and self._loading(decision.model, exclude):
            decision = await self._await_model(rr, exclude, rid, attempt, decision)
        if decision.engine is None:
            self._announce_soon(rr, decision, rid, attempt)
            why = decision.reason if not failures else f"{'; '.join(failures)}; no other engine: {decision.reason}"
            raise ApiError(503, why, "no_engine", headers={"Retry-After": "1"})
        engine, served = decision.engine, decision.model
        try:
            msg = generate_message(self.bus.new_id("gen"), greq, served)
            await self._ensure(engine, served)
            msg.slot = await self.mobility.restore(session, engine)
            split = None
            if msg.slot is None and attempt == 1 and self.settings.pd_split and greq.cache_prompt is not False:
                split, _ = self._plan(rr, decision)
                if split is not None:
                    msg.slot = await self.splits.run(split, greq, rid)
                    split = split if msg.slot is not None else None
            frames = self.bus.encode_generate(msg)
            await arrival.ready()
            stream = self.bus.generate(engine, msg, frames)
            t_sent = time.monotonic()
        except RequestUnsendable as exc:  # the request's fault: the same on every engine
            if exc.too_large:
                raise ApiError(413, f"the request is too large to send to an engine ({exc})",
                               "request_too_large") from None
            raise ApiError(400, f"the request cannot be sent to an engine: {exc}", "invalid_request") from None
        except (LoadFailed, EngineUnreachable) as exc:
            failures.append(str(exc))
            exclude.add(engine)
            return None
        finally:  # after GENERATE is on its way (or failed to go)
            self._announce_soon(rr, decision, rid, attempt)
        try:
            first = await stream.next(self.settings.first_token_timeout_s)
        except BaseException:
            self.bus.cancel(stream)
            raise
        retry = retry_reason(engine, first, self.settings.first_token_timeout_s)
        if retry is not None:
            self.bus.cancel(stream)
            failures.append(retry)
            exclude.add(engine)
            log_event(log, logging.WARNING, "request failed before its first token; retrying elsewhere" if attempt == 1
                      else "request failed again", req=rid, engine=engine, error=retry)
            return None
        assert first is not None
        outcome.engine = engine
        labels = (engine, served or "")
        self.metrics.queue.labels(*labels).observe(t_sent - outcome.t0)
        self.metrics.ttft.labels(*labels).observe(time.monotonic() - outcome.t0)
        if isinstance(first, M.Error):  # the request's own fault: the same answer anywhere
            raise answering.refused(first.event())
        headers = {"X-Hydra-Engine": engine, "X-Hydra-Route": decision.step}
        if split is not None:
            headers.update({"X-Hydra-Route": "split", "X-Hydra-Prefill-Engine": split.prefill})
        if outcome.session:
            headers["X-Session-Id"] = outcome.session
        if outcome.defaulted:  # the client named no model, or one the pool does not know
            headers["X-Hydra-Default-Model"] = served or ""
        turn = Turn(engine=engine, session=session, messages=greq.messages, ns=greq.cache_ns, quota=greq.store_quota)
        return Started(engine, served, stream, first, headers, turn)

    # ----- the prefill/decode split -------------------------------------------------------------

    def _plan(self, rr: RouteRequest, decision: Decision) -> tuple[SplitPlan | None, str]:
        why_not = split_excluded(rr, decision)
        if why_not is None and sum(1 for r in self.bus.engines.values() if r.alive) < 2:
            why_not = "one engine in the pool: no other to prefill on"
        if why_not is not None:
            return None, why_not
        return plan_split(rr, decision, self.views(rr.session_id, rr.prefix_hash, rr.model), self.specs,
                          TransferRates.of(self.meter), policy=self.policy)

    def route_request(self, greq: GenRequest, model: str | None, session: str | None,
                      estimates: tuple[int, str | None] | None = None) -> RouteRequest:
        """What routing is told about a parsed request (also what ``POST /admin/route`` explains);
        ``estimates``: its prompt tokens and conversation prefix, when measured where it was parsed."""
        entry = self.registry.entries.get(model) if model else None
        stored = self.sessions.kept_tokens(session, model) if self.sessions is not None and session else 0
        tokens, prefix = estimates if estimates is not None else estimated(greq)
        if prefix and greq.cache_ns:
            prefix = f"{greq.cache_ns}/{prefix}"
        return RouteRequest(model=model, prompt_tokens=tokens, max_tokens=greq.max_tokens or 256,
                            session_id=session, prefix_hash=prefix,
                            n_ctx=int((entry.defaults.get("n_ctx") if entry else None) or 8192),
                            stored_tokens=stored)

    def explain(self, kind: str, raw: bytes, request: Request) -> dict[str, Any]:
        """Where this request would go now and why, without sending it anywhere: the same parsing,
        estimate and routing as :meth:`serve`, but nothing is loaded, logged at INFO or published."""
        req, greq = openai.parse(kind, raw)  # type: ignore[arg-type]
        session = session_id_of(req, request)
        rr = self.route_request(greq, self._model(req.model), session)
        decision = route(rr, self.views(rr.session_id, rr.prefix_hash, rr.model), self.specs, policy=self.policy)
        out = decision.public()
        out["request"] = {"kind": kind, "model": req.model, "prompt_tokens": rr.prompt_tokens,
                          "max_tokens": rr.max_tokens, "session_id": rr.session_id, "prefix_hash": rr.prefix_hash,
                          "n_ctx": rr.n_ctx, "stored_tokens": rr.stored_tokens}
        out["loading"] = self._loading(decision.model, set())  # a request with no engine would wait for these
        plan, why = self._plan(rr, decision) if self.settings.pd_split else (None, "pd_split is off")
        out["split"] = {"plan": plan.public() if plan is not None else None, "reason": why,
                        "transfers": self.meter.public()}
        return out

    def _fingerprint(self, engine: str) -> str:
        rec = self.bus.engines.get(engine)
        return (rec.status.generation or "") if rec else ""

    def _record(self, turn: Turn, reply: str, done: events.Done) -> None:
        self.affinity.record(turn.engine, turn.session, turn.messages, reply, turn.ns)
        if self.sessions is not None:
            self.sessions.after_turn(turn.session, turn.engine, done, store_owner(turn.ns), turn.quota)
            self.mobility.after_turn(turn.session, turn.engine)

    async def move_session(self, session: str, engine: str) -> dict[str, Any]:
        return await self.mobility.move_session(session, engine)

    async def models(self, _: Request) -> Response:
        data = []
        for model, engines in sorted(self.served().items()):
            entry = self.registry.entries.get(model)
            meta: dict[str, Any] = {"engines": sorted(engines)}
            aliases = {model}
            if entry is not None:
                meta.update(arch=entry.arch, quant=entry.quant, size=entry.size_bytes, description=entry.description)
                file = Path(entry.path)
                aliases |= {file.name, file.stem, *entry.aliases}  # what _model accepts, but never a directory
            data.append({"id": model, "object": "model", "created": 0, "owned_by": "hydra",
                         "aliases": sorted(aliases), "meta": meta})
        return JSONResponse({"object": "list", "data": data})

    async def health(self, _: Request) -> Response:
        engines = list(self.bus.engines.values())
        served = self.served()
        body = {"status": "ok" if served and self.admitting else ("stopping" if not self.admitting else "unavailable"),
                "engines": {"total": len(engines), "alive": sum(1 for e in engines if e.alive),
                            "serving": sum(len(v) for v in served.values())},
                "models": sorted(served), "profile": self.switcher.active, "switching": self.switcher.switching,
                "inflight": self.bus.inflight_total()}
        if self.bus.request_stream is not None:
            body["request_stream"] = self.bus.request_stream.public()
        return JSONResponse(body, status_code=200 if body["status"] == "ok" else 503)

    async def prom(self, _: Request) -> Response:
        return Response(self.metrics.render(), media_type=CONTENT_TYPE)

    async def chat(self, request: Request) -> Response:
        return await self.serve(request, lambda raw: openai.parse("chat", raw), openai_answer(ChatAnswer))

    async def completions(self, request: Request) -> Response:
        return await self.serve(request, lambda raw: openai.parse("completion", raw),
                                openai_answer(CompletionAnswer))

    async def responses(self, request: Request) -> Response:
        """OpenAI's Responses API: the chat completion it stands for, routed, kept and retried as one,
        answered in the Responses shapes."""
        return await self.serve(request, responses.parse, responses_answer)

    async def messages(self, request: Request) -> Response:
        """Anthropic's Messages API: parsed into the request its chat completion makes, then routed,
        kept as a session and retried exactly as that chat completion, and answered by the Anthropic
        renderer, errors included."""
        try:
            return await self.serve(request, anthropic.parse, messages_answer)
        except ApiError as exc:
            return JSONResponse(MessagesAnswer.refusal(exc), status_code=exc.status, headers=exc.headers)
        except Exception as exc:
            log_event(log, logging.ERROR, "request failed", path=request.url.path, error=repr(exc), exc_info=True)
            return JSONResponse(MessagesAnswer.refusal(ApiError(500, "internal error (see the coordinator log)")),
                                status_code=500)

    async def native_completion(self, request: Request) -> Response:
        """llama-server's ``/completion`` and ``/infill``, over the same route as chat (session affinity,
        prefix-aware routing, retry before the first token); an /infill prompt is built by the engine
        that takes it, with its model's FIM tokens."""
        parse = infill.parse if request.url.path == "/infill" else native_completion.parse
        return await self.serve(request, parse, native_answer)

    async def embeddings(self, request: Request) -> Response:
        if not self.admitting:
            raise ApiError(503, "the coordinator is shutting down", "shutting_down", headers={"Retry-After": "5"})
        return await self.native.embeddings(request)

    def routes(self) -> list[Route]:
        return [
            Route("/health", self.health), Route("/v1/health", self.health), Route("/metrics", self.prom), Route("/v1/models", self.models), Route("/models", self.models),
            Route("/v1/chat/completions", self.chat, methods=["POST"]),
            Route("/chat/completions", self.chat, methods=["POST"]),
            Route("/v1/completions", self.completions, methods=["POST"]),
            # llama-server's /completions (no /v1) is its native completion, as /completion
            Route("/completions", self.native_completion, methods=["POST"]),
            Route("/completion", self.native_completion, methods=["POST"]),
            Route("/infill", self.native_completion, methods=["POST"]),
            Route("/v1/messages", self.messages, methods=["POST"]),
            Route("/v1/responses", self.responses, methods=["POST"]),
            Route("/responses", self.responses, methods=["POST"]),
            *(Route(path, self.native.forward, methods=["POST"]) for path in NATIVE_PATHS),
            *(Route(path, self.embeddings, methods=["POST"]) for path in EMBEDDING_PATHS),
        ]


def exception_handlers() -> dict[Any, Any]:
    """OpenAI error JSON for everything, including routes that do not exist and handler bugs."""

    async def on_api_error(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, ApiError)
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)

    async def on_crash(request: Request, exc: Exception) -> Response:
        log_event(log, logging.ERROR, "request failed", path=request.url.path, error=repr(exc), exc_info=True)
        e = ApiError(500, "internal error (see the coordinator log)", "internal_error")
        return JSONResponse(e.body(), status_code=500)

    async def not_found(request: Request, exc: Exception) -> Response:
        code = getattr(exc, "status_code", 404)
        e = ApiError(code, f"{request.method} {request.url.path}: {getattr(exc, 'detail', 'not found')}",
                     "not_found" if code == 404 else "method_not_allowed")
        return JSONResponse(e.body(), status_code=code)

    return {ApiError: on_api_error, Exception: on_crash, 404: not_found, 405: not_found}
