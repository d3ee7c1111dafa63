"""The coordinator's events socket on a real pool: only a subscriber with the events token receives
anything, and no published frame carries a session id (sessions are named by a keyed hash)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

from hydrad.common import tokenfile
from tests.conftest import start_solo_pool
from tests.support.coordinator import Events
from tests.support.engine import Engine
from tests.support.wait import eventually

SESSION = "alice-private-conversation-7f3a"


def test_events_need_the_token_and_never_carry_a_session_id(tmp_path: Path, smollm_path: Path,
                                                             start_engine: Callable[..., Engine]) -> None:
    c, _ = start_solo_pool(tmp_path, start_engine)
    strangers = [Events(c.events_endpoint), Events(c.events_endpoint, tokenfile.new_token())]
    try:
        time.sleep(0.5)  # every subscriber has connected (or been refused) before the pool does anything
        conv = [{"role": "user", "content": "Name a colour."}]
        ids = []
        for turn in range(2):  # the second turn finds the session warm: its routing reason names the session
            r = c.http.post("/v1/chat/completions", json={"model": "smollm2-135m", "messages": conv, "max_tokens": 4,
                                                          "temperature": 0, "session_id": SESSION})
            assert r.status_code == 200, r.text
            assert r.headers["x-session-id"] == SESSION  # the client itself still gets its id back
            ids.append(r.json()["id"])
            conv = conv + [r.json()["choices"][0]["message"], {"role": "user", "content": "Another."}]
            c.events.wait("session.kept", lambda ev, n=turn: len(c.events.of("session.kept")) > n)
        tags = {c.events.session_of(i) for i in ids}
        assert len(tags) == 1, tags  # one session, one tag: the console can follow it
        tag = tags.pop()
        assert tag != SESSION and tag.startswith("s-")
        second = c.events.wait("route", lambda ev: ev["data"]["req"] == ids[1])
        assert second["data"]["step"] == "affinity" and f"session {tag} is warm" in second["data"]["reason"], second
        assert all(ev["data"]["session"] == tag for ev in c.events.of("session.kept"))
        frames = list(c.events.frames)
        assert len(frames) >= 4
        leaked = [f for f in frames if any(SESSION.encode() in part for part in f)]
        assert leaked == []
        eventually(lambda: "events subscriber refused" in c.log(), 10, "the refusal logged", context=c.log)
        assert [s.frames for s in strangers] == [[], []]
    finally:
        for s in strangers:
            s.close()
        c.stop()
