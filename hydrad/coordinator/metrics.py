"""The coordinator's Prometheus metrics (``GET /metrics``), on a registry of its own.

- ``hydra_coordinator_requests_total{model,engine,status}``: OpenAI requests by the model they
  asked for (the registry alias; empty when none), the engine that answered (empty when none
  did) and the HTTP status they got (499: the client went away first). A stream that fails after
  its first token counts as the 200 its headers said.
- ``hydra_coordinator_ttft_seconds{engine,model}``: arrival to the first event from the engine
  that answered (routing, any wait or load, the engine's queue and prefill).
- ``hydra_coordinator_queue_seconds{engine,model}``: arrival until GENERATE left for the engine
  that answered (routing, waiting for a loading model, an on-demand load).
- ``hydra_coordinator_route_decisions_total{step}``: routing decisions by the step that made
  them (retries count again).
- ``hydra_coordinator_engines_registered``, ``hydra_coordinator_engines_alive``,
  ``hydra_coordinator_inflight_requests``: read from the bus at scrape time.
"""

from __future__ import annotations

from typing import Any, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
disable_created_metrics()  # no *_created series: this process has its own registry and few counters
# from a few ms (a warm engine, a short prompt) to a model load on demand
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


class _PoolCollector(Collector):
    def __init__(self, bus: Any) -> None:
        self.bus = bus

    def collect(self) -> Iterator[Metric]:
        engines = list(self.bus.engines.values())
        yield GaugeMetricFamily("hydra_coordinator_engines_registered", "Engines that registered (alive or not).",
                                value=len(engines))
        yield GaugeMetricFamily("hydra_coordinator_engines_alive", "Engines alive on the bus.",
                                value=sum(1 for e in engines if e.alive))
        yield GaugeMetricFamily("hydra_coordinator_inflight_requests", "Requests in flight on the bus.",
                                value=self.bus.inflight_total())


class CoordinatorMetrics:
    def __init__(self, bus: Any) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter("hydra_coordinator_requests", "OpenAI requests by model, engine and HTTP status.",
                                ["model", "engine", "status"], registry=self.registry)
        self.ttft = Histogram("hydra_coordinator_ttft_seconds", "Arrival to the first event from the engine.",
                              ["engine", "model"], buckets=BUCKETS, registry=self.registry)
        self.queue = Histogram("hydra_coordinator_queue_seconds",
                               "Arrival until the request was sent to its engine (routing, waits, loads).",
                               ["engine", "model"], buckets=BUCKETS, registry=self.registry)
        self.decisions = Counter("hydra_coordinator_route_decisions", "Routing decisions by the step that made them.",
                                 ["step"], registry=self.registry)
        self.registry.register(_PoolCollector(bus))

    def request(self, model: str | None, engine: str | None, status: int) -> None:
        self.requests.labels(model or "", engine or "", str(status)).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
