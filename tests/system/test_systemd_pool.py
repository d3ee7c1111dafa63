"""The pool on a real systemd: units, configs, coordinator and engines end to end.

One sandbox per module (see conftest.py). The tests run in file order; each starts by making sure
the pool is up (starting what a failed test left stopped), and once the pool has failed to come up
the later ones fail at once instead of waiting for it again.
"""

from __future__ import annotations

import json
import threading
import time

from tests.system.conftest import COORDINATOR, ENGINES, Sandbox, readme_blocks

A_URL = f"http://127.0.0.1:{ENGINES['a']['http']}"
B_URL = f"http://127.0.0.1:{ENGINES['b']['http']}"


def _answer(status: int, text: str) -> str:
    assert status == 200, f"HTTP {status}: {text[:500]}"
    return json.loads(text)["choices"][0]["message"]["content"]


def test_start_registers_both_engines_applies_the_profile_and_serves(sandbox: Sandbox) -> None:
    sb = sandbox
    sb.systemctl("start", "hydra.target", "hydrad@a", "hydrad@b")
    for unit in ("hydra.target", "hydra-coordinator.service", "hydrad@a.service", "hydrad@b.service"):
        assert sb.systemctl("is-active", unit, check=False).stdout.strip() == "active", sb.diagnostics()
    for unit in ("hydra.target", "hydrad@a.service", "hydrad@b.service"):  # the target pulls in the coordinator
        assert sb.systemctl("is-enabled", unit, check=False).stdout.strip() == "enabled", unit

    sb.wait_for("both engines registered",
                lambda: all(sb.engines().get(n, {}).get("alive") for n in ENGINES), timeout=60)
    listed = sb.hydractl("engines")
    assert all(name in listed.stdout for name in ENGINES), listed.stdout

    try:
        sb.wait_for("the profile applied (hydractl profile: every engine matches)", sb.profile_applied, timeout=90)
        sb.wait_for("both engines serving their models", sb.pool_serving, timeout=30)
    except AssertionError as exc:
        sb.broken = str(exc).splitlines()[0]
        raise
    profile = sb.hydractl("profile").stdout
    assert "matches" in profile and " no" not in profile, profile

    for spec in ENGINES.values():
        assert _answer(*sb.chat(COORDINATOR, model=spec["model"])), "empty answer"

    # STATUS= from sd_notify: the stage and the model, in show and in status.
    for name, spec in ENGINES.items():
        text = sb.show(f"hydrad@{name}", "StatusText")["StatusText"]
        assert text.startswith("ready") and spec["model"] in text, text
        status = sb.systemctl("status", f"hydrad@{name}", check=False).stdout
        assert f'Status: "{text.split()[0]}' in status, status
    coordinator_status = sb.show("hydra-coordinator", "StatusText")["StatusText"]
    assert coordinator_status.startswith("engines 2/2 alive"), coordinator_status

    # The README's "Check that it works", as written, for engine a: every command succeeds and shows
    # what its comment says.
    out = sb.run("bash", "-euo", "pipefail", "-c", "NAME=a\n" + readme_blocks()[1], check=False, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Active: active (running)" in out.stdout, out.stdout
    assert "HTTP/1.1 200 OK" in out.stdout and "x-hydra-engine: a" in out.stdout.lower(), out.stdout
    assert "matches" in out.stdout, out.stdout


def test_engines_run_without_the_absent_gpu_groups_but_with_the_users_own(sandbox: Sandbox) -> None:
    """No SupplementaryGroups= in the unit (a root without a "render" group once failed every start
    with 216/GROUP): the engine gets the hydra user's own groups, those of the README's usermod
    (install step 2): "video", and "render" where the root has one."""
    sb = sandbox
    sb.ensure_pool()
    unit = sb.run("systemctl", "cat", "hydrad@a").stdout
    assert not [line for line in unit.splitlines() if line.startswith("SupplementaryGroups=")], unit
    pid = sb.show("hydrad@a", "MainPID")["MainPID"]
    status = dict(line.split(":", 1) for line in sb.read(f"/proc/{pid}/status").splitlines() if ":" in line)
    groups = status["Groups"].split()
    for name in ("video", "render"):
        entry = sb.run("getent", "group", name, check=False)
        if name == "video" or entry.returncode == 0:   # video is always there; render on some roots
            assert entry.stdout.split(":")[2] in groups, (name, status["Groups"])
    assert status["CapBnd"].strip() == "0000000000000000", "hydrad keeps capabilities"


def test_systemd_analyze_security_scores(sandbox: Sandbox) -> None:
    """The exposure scores of the loaded units, as docs/operations.md states them."""
    sb = sandbox
    sb.ensure_pool()
    out = sb.run("systemd-analyze", "security", "--no-pager").stdout   # one line per loaded unit
    scores = {line.split()[0]: float(line.split()[1]) for line in out.splitlines()
              if line.startswith(("hydrad@a.service ", "hydra-coordinator.service "))}
    print(f"systemd-analyze security: {scores}")
    assert scores["hydra-coordinator.service"] <= 1.2, out
    assert scores["hydrad@a.service"] <= 1.6, out


def test_reload_with_a_changed_yaml_keeps_serving(sandbox: Sandbox) -> None:
    """systemctl reload re-reads the YAML: n_parallel 2 -> 3 (a context rebuild) and back, while a
    client keeps sending requests. (The model is not what changes: under a coordinator the profile's
    configure sets it in the runtime layer, which wins over the YAML's defaults.)"""
    sb = sandbox
    sb.ensure_pool()
    original = sb.read("/etc/hydra/a.yaml")
    assert "n_parallel: 2" in original
    results: list[tuple[int, str]] = []
    stop = threading.Event()

    def load() -> None:
        while not stop.is_set():
            results.append(sb.chat(A_URL, max_tokens=4, timeout=60))

    def slots() -> int:
        status, text = sb.http("GET", f"{A_URL}/v1/models", timeout=10)
        data = json.loads(text)["data"] if status == 200 else []
        return data[0]["meta"]["n_parallel"] if data else 0

    worker = threading.Thread(target=load, daemon=True)
    worker.start()
    try:
        for n_parallel in (3, 2):  # changed, then back
            before = len(results)
            since = sb.run("date", "+%Y-%m-%d %H:%M:%S").stdout.strip()
            sb.write("/etc/hydra/a.yaml", original.replace("n_parallel: 2", f"n_parallel: {n_parallel}"))
            sb.systemctl("reload", "hydrad@a")
            sb.wait_for(f"hydrad@a serving with {n_parallel} slots", lambda: slots() == n_parallel, timeout=60)
            sb.wait_for("the reload finished (ActiveState active, STATUS ready)",
                        lambda: sb.show("hydrad@a", "ActiveState")["ActiveState"] == "active"
                        and sb.show("hydrad@a", "StatusText")["StatusText"].startswith("ready"), timeout=30)
            assert f"/{n_parallel}" in sb.show("hydrad@a", "StatusText")["StatusText"]
            messages = [e["MESSAGE"] for e in sb.journal("-u", "hydrad@a", "--since", since)]
            reloading = [i for i, m in enumerate(messages) if m.startswith("Reloading hydrad@a")]
            reloaded = [i for i, m in enumerate(messages) if m.startswith("Reloaded hydrad@a")]
            assert reloading and reloaded and reloading[0] < reloaded[-1], messages
            assert any("config re-read" in m and "n_parallel" in m for m in messages), messages
            sb.wait_for("requests served after the reload", lambda: len(results) > before + 1, timeout=60)
    finally:
        stop.set()
        worker.join(timeout=90)
        sb.write("/etc/hydra/a.yaml", original)
    failures = [r for r in results if r[0] != 200]
    assert len(results) >= 4, results
    assert failures == [], f"{len(failures)} of {len(results)} requests failed during the reloads: {failures[:3]}"


def test_journal_priority_filter_shows_only_warnings_and_above(sandbox: Sandbox) -> None:
    sb = sandbox
    sb.ensure_pool()
    original = sb.read("/etc/hydra/a.yaml")
    # A start-only setting changed under a reload: hydrad logs a WARNING and keeps running.
    sb.write("/etc/hydra/a.yaml", original.replace("192.168.10.0/24", "192.168.11.0/24"))
    try:
        sb.systemctl("reload", "hydrad@a")
        sb.wait_for("the warning in the journal", lambda: sb.journal("-u", "hydrad@a", "--grep", "start-only"),
                    timeout=30)
    finally:
        sb.write("/etc/hydra/a.yaml", original)
    warnings = sb.journal("-p", "warning", "-u", "hydrad@a")
    everything = sb.journal("-u", "hydrad@a")
    assert warnings, "journalctl -p warning shows nothing"
    assert all(int(e["PRIORITY"]) <= 4 for e in warnings), [(e["PRIORITY"], e["MESSAGE"]) for e in warnings]
    assert any("start-only settings changed" in str(e.get("MESSAGE")) for e in warnings), warnings
    infos = [e for e in everything if int(e["PRIORITY"]) == 6]
    assert any("listening" in str(e.get("MESSAGE")) for e in infos), "info lines are not at priority 6"
    assert len(warnings) < len(everything)
    text = sb.run("journalctl", "--no-pager", "-p", "warning", "-u", "hydrad@a").stdout
    assert "start-only settings changed" in text and "listening" not in text, text


def test_stop_during_a_stream_drains_it_and_exits_0(sandbox: Sandbox) -> None:
    sb = sandbox
    sb.ensure_pool()
    body = {"messages": [{"role": "user", "content": "Count from one to one hundred."}], "max_tokens": 120,
            "ignore_eos": True, "temperature": 0, "stream": True}
    curl = sb.popen("curl", "-sN", "--max-time", "120", "-H", "Content-Type: application/json",
                    "-d", json.dumps(body), f"{A_URL}/v1/chat/completions")
    assert curl.stdout is not None
    first = curl.stdout.readline()
    assert first.startswith("data: "), first + (curl.stderr.read() if curl.stderr else "")
    t0 = time.monotonic()
    sb.systemctl("stop", "hydrad@a")   # returns once the unit is stopped
    stop_seconds = time.monotonic() - t0
    rest, err = curl.communicate(timeout=120)
    events = [line[6:] for line in (first + rest).splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]", f"the stream was cut: last events {events[-3:]} {err}"
    chunks = [json.loads(e) for e in events[:-1]]
    finish = [c["choices"][0].get("finish_reason") for c in chunks if c.get("choices")]
    assert "length" in finish, finish[-3:]
    pieces = sum(1 for c in chunks if c.get("choices") and c["choices"][0].get("delta", {}).get("content"))
    assert pieces >= 100, f"only {pieces} content chunks of 120 tokens"
    shown = sb.show("hydrad@a", "ActiveState", "Result", "ExecMainStatus", "ExecMainCode")
    assert shown["ActiveState"] == "inactive", shown
    assert shown["Result"] == "success" and shown["ExecMainStatus"] == "0", shown
    assert shown["ExecMainCode"] == "1", f"killed instead of exiting: {shown}"  # CLD_EXITED
    print(f"stop with a stream in flight took {stop_seconds:.1f}s")
    sb.ensure_pool()


def test_watchdog_kills_a_hung_engine_and_restart_brings_it_back(sandbox: Sandbox) -> None:
    sb = sandbox
    sb.ensure_pool()
    # A short watchdog for this test only; SIGKILL as its signal so no core dump is written.
    sb.write("/etc/systemd/system/hydrad@b.service.d/test-watchdog.conf",
             "[Service]\nWatchdogSec=4\nWatchdogSignal=SIGKILL\n")
    try:
        sb.systemctl("daemon-reload")
        sb.systemctl("restart", "hydrad@b")
        sb.ensure_pool()
        before = sb.show("hydrad@b", "MainPID", "NRestarts")
        assert sb.engines()["b"]["pid"] == int(before["MainPID"])
        sb.systemctl("kill", "--kill-who=main", "--signal=SIGSTOP", "hydrad@b")
        t0 = time.monotonic()
        sb.wait_for("the watchdog to kill hydrad@b and Restart= to start it again",
                    lambda: int(sb.show("hydrad@b", "NRestarts")["NRestarts"]) > int(before["NRestarts"]),
                    timeout=60)
        restarted_after = time.monotonic() - t0
        stopped = sb.journal("-u", "hydrad@b", "--grep", "Sent signal SIGSTOP")
        watchdog = sb.journal("-u", "hydrad@b", "--grep", "Watchdog timeout")
        assert stopped and watchdog, "no SIGSTOP or no watchdog timeout in the journal"
        killed_after = (int(watchdog[-1]["__REALTIME_TIMESTAMP"]) - int(stopped[-1]["__REALTIME_TIMESTAMP"])) / 1e6
        print(f"watchdog fired {killed_after:.1f}s after SIGSTOP; restarted after {restarted_after:.1f}s")

        def back() -> bool:
            pid = sb.show("hydrad@b", "MainPID")["MainPID"]
            e = sb.engines().get("b", {})
            return pid not in ("0", before["MainPID"]) and e.get("alive") and e.get("pid") == int(pid)

        sb.wait_for("hydrad@b re-registered with its new PID", back, timeout=60)
        sb.wait_for("hydrad@b serving again", sb.pool_serving, timeout=90)
        sb.wait_for("the profile re-applied", sb.profile_applied, timeout=30)
        assert _answer(*sb.chat(COORDINATOR, model=ENGINES["b"]["model"]))
        # WatchdogSec=4 (plus scheduling slack), even right after a load: hydrad sends
        # EXTEND_TIMEOUT_USEC (which systemd 252 also applies to the watchdog) only during a reload job.
        assert killed_after <= 4 + 3, f"the watchdog fired {killed_after:.1f}s after the hang, WatchdogSec=4"
    finally:
        sb.run("rm", "-rf", "/etc/systemd/system/hydrad@b.service.d")
        sb.systemctl("daemon-reload")


def test_coordinator_kill_9_engines_keep_serving_and_re_register(sandbox: Sandbox) -> None:
    sb = sandbox
    sb.ensure_pool()
    before = sb.show("hydra-coordinator", "MainPID", "NRestarts")
    up_since = {n: e.get("up_since") for n, e in sb.engines().items()}
    sb.systemctl("kill", "--signal=SIGKILL", "hydra-coordinator")
    # While the coordinator is down (RestartSec=2) and after: direct requests keep working.
    answered: list[tuple[int, str]] = []
    while len(answered) < 4:
        for url in (A_URL, B_URL):
            answered.append(sb.chat(url, max_tokens=4))
    assert [s for s, _ in answered] == [200] * len(answered), answered
    sb.wait_for("hydra-coordinator restarted by Restart=",
                lambda: int(sb.show("hydra-coordinator", "NRestarts")["NRestarts"]) > int(before["NRestarts"])
                and sb.systemctl("is-active", "hydra-coordinator", check=False).stdout.strip() == "active",
                timeout=60)
    assert sb.show("hydra-coordinator", "MainPID")["MainPID"] != before["MainPID"]
    sb.wait_for("both engines re-registered", sb.pool_serving, timeout=60)
    sb.wait_for("the profile applied again", sb.profile_applied, timeout=30)
    after = sb.engines()
    assert all(after[n].get("up_since") != up_since.get(n) for n in ENGINES), (up_since, after)
    for spec in ENGINES.values():
        assert _answer(*sb.chat(COORDINATOR, model=spec["model"]))


def test_combine_peer_killed_mid_compute_head_comes_back(sandbox: Sandbox) -> None:
    """COMBINE under systemd: engine b (SmolLM2) splits its layers with engine a's CPU over a's merged
    port. a is killed while b decodes through it. llama.cpp's ggml-RPC client aborts b inside the
    compute (upstream behaviour) or b's peer watch fails the request first; either way the client
    never gets a wrong token, and Restart= plus the coordinator bring b back serving, SOLO."""
    sb = sandbox
    sb.ensure_pool()
    auth = "Authorization: Bearer $(cat /etc/hydra/engine.token)"
    body = {"messages": [{"role": "user", "content": "Count from one to one hundred in words."}],
            "max_tokens": 600, "temperature": 0, "ignore_eos": True,
            "cache_prompt": True}  # after the first, each request reuses the prompt's KV: the same batches every time

    def configure(payload: dict) -> dict:
        out = sb.run("sh", "-c", f"curl -sS -X POST -H \"{auth}\" -H 'Content-Type: application/json' "
                     f"--data-binary @- '{B_URL}/control/configure?wait=1'", input=json.dumps(payload), timeout=120)
        return json.loads(out.stdout)

    peer = f"127.0.0.1:{ENGINES['a']['rpc']}"
    done = configure({"rpc_servers": [peer], "tensor_split": [0.5, 0.5]})
    assert done.get("load", {}).get("phase") == "done", done
    health = json.loads(sb.http("GET", f"{B_URL}/health")[1])
    assert health["role"] == "head" and health["peers"] == [peer], health
    # the reference is the split's own answer: half the layers run on the peer's backend, whose kernels
    # may round differently, so over 600 tokens the split's greedy text can part from SOLO's (how far
    # the stream gets before the kill depends on the machine's speed). The first prompt a split computes
    # after its load rounds differently from every later one (llama.cpp's, seen with the stock rpc-server
    # as the peer too), so a one-token request goes first and the reference is the second answer.
    _answer(*sb.http("POST", f"{B_URL}/v1/chat/completions", {**body, "max_tokens": 1}, timeout=120))
    status, text = sb.http("POST", f"{B_URL}/v1/chat/completions", body, timeout=300)
    reference = json.loads(_answer(status, text) and text)["choices"][0]["message"]["content"]
    before = sb.show("hydrad@b", "MainPID", "NRestarts")

    streamed: list[str] = []

    def stream() -> None:
        out = sb.run("curl", "-sN", "--max-time", "300", "-H", "Content-Type: application/json", "--data-binary", "@-",
                     f"{B_URL}/v1/chat/completions", input=json.dumps({**body, "stream": True}), check=False,
                     timeout=330)
        for line in out.stdout.splitlines():
            if line.startswith("data: {"):
                event = json.loads(line[6:])
                streamed.extend(c.get("delta", {}).get("content") or "" for c in event.get("choices", []))
            elif line.startswith("data: ") or line.startswith("event: "):
                streamed.append(f"<{line}>")

    t = threading.Thread(target=stream)
    t.start()
    sb.wait_for("b decoding through its peer", lambda: len(streamed) >= 0 and any(
        s.get("is_processing") for s in json.loads(sb.http("GET", f"{B_URL}/slots")[1])), timeout=60, interval=0.05)
    time.sleep(0.5)
    t0 = time.monotonic()
    sb.systemctl("kill", "--signal=SIGKILL", "hydrad@a")
    t.join(330)
    text = "".join(s for s in streamed if not s.startswith("<"))
    assert reference.startswith(text), (text[:200], reference[:200])  # a prefix of the right answer, never garbage
    assert len(text) < len(reference), "the stream ran to the end although its peer was killed"

    def serving_again() -> bool:
        status, out = sb.chat(B_URL, max_tokens=4, timeout=10)
        return status == 200
    sb.wait_for("b serving again", serving_again, timeout=120, interval=0.5)
    back_after = time.monotonic() - t0
    after = sb.show("hydrad@b", "MainPID", "NRestarts")
    restarted = int(after["NRestarts"]) > int(before["NRestarts"])
    health = json.loads(sb.http("GET", f"{B_URL}/health")[1])
    assert health["role"] == "solo", health
    print(f"peer killed mid-compute: b {'aborted and was restarted' if restarted else 'fell back to SOLO'}; "
          f"serving again {back_after:.1f}s after the kill")
    sb.ensure_pool()
    sb.wait_for("the profile applied again", sb.profile_applied, timeout=60)
    assert _answer(*sb.chat(COORDINATOR, model=ENGINES["b"]["model"]))
