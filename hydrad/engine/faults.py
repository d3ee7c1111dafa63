"""Fault injection for tests: make one request fail at a chosen stage of the engine's step.

The promise under test is that an exception while admitting, tokenizing, sampling,
detokenizing, matching stop strings or finishing fails that one request and nothing else.
Real requests against the real model cannot reach every one of those failure points on
demand, so the engine thread asks this module at each stage whether to fail.

Inert unless the daemon was started with ``HYDRA_FAULT_INJECT=1``; then a request whose prompt
or messages contain ``<<hydra-fault:STAGE>>`` raises :class:`InjectedFault` at that stage.
Production units never set the variable.

The stage ``loop`` is not a failure but a stall: the main event loop is held for
``HYDRA_FAULT_LOOP_S`` seconds (default 4) when the request is prepared, as a request's work held
it before preparation left the loop; it shows that heartbeats and the watchdog ride their own loop.
"""

from __future__ import annotations

import os
import re
import time

from hydrad.wire.requests import GenRequest

STAGES = ("admit", "tokenize", "sample", "detokenize", "stop", "finish")
STALL = "loop"  # not a failure: see the module doc
ENV = "HYDRA_FAULT_INJECT"
_MARK = re.compile(r"<<hydra-fault:([a-z]+)>>")
NONE: frozenset[str] = frozenset()


class InjectedFault(RuntimeError):
    """The failure a test asked for."""


def armed() -> bool:
    return os.environ.get(ENV, "") not in ("", "0")


def marker(stage: str) -> str:
    """The text that makes a request fail at ``stage`` (tests put it in a prompt)."""
    if stage not in STAGES and stage != STALL:
        raise ValueError(f"unknown stage {stage!r}; known: {', '.join(STAGES)}")
    return f"<<hydra-fault:{stage}>>"


def stages_of(request: GenRequest) -> frozenset[str]:
    """The stages at which this request asks to fail (only looked at when faults are armed)."""
    texts = [request.prompt or ""] + [m.get("content") or "" for m in request.messages or ()]
    return frozenset(m for t in texts for m in _MARK.findall(t) if m in STAGES or m == STALL)


def hold_loop() -> None:
    """Block the calling thread (the main event loop, for stage ``loop``) for ``HYDRA_FAULT_LOOP_S`` seconds."""
    time.sleep(min(120.0, float(os.environ.get("HYDRA_FAULT_LOOP_S", "4"))))
