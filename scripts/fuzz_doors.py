#!/usr/bin/env python3
"""Long run of the door property tests: N hostile requests per door, checked against the same
invariant as tests/property (see docs/reliability.md).

    .venv/bin/python scripts/fuzz_doors.py                       # 100,000 cases per door, own engine and pool
    .venv/bin/python scripts/fuzz_doors.py --cases 2000 --doors engine --concurrency 1
    .venv/bin/python scripts/fuzz_doors.py --engine-url http://127.0.0.1:8081 --front-url http://127.0.0.1:9000
    prlimit --as=$((16<<30)) .venv/bin/python scripts/fuzz_doors.py --max-seconds 3600

By default it starts its own engine (hydrad serving SmolLM2-135M) and its own pool
(hydra-coordinator + one engine), each daemon under an address-space limit (--as-limit, never
above the limit the runner itself runs under), and restarts a door whose process died. With
--engine-url/--front-url it uses doors already running instead (127.0.0.1 only) and stops at the
first dead engine, which it cannot restart.

Cases go out in batches of --concurrency at once; when a batch has ended, the invariant is checked:
every engine alive, no slot busy, nothing queued, nothing in flight at the coordinator, a normal
request served. A batch that breaks it is replayed one case at a time to name the culprit.
It stops by itself after --cases per door or --max-seconds, and prints counts by status and every
distinct violation with a body that reproduces it (whole bodies go to --out, if given).
"""

from __future__ import annotations

if __name__ == "__main__":  # run as scripts/NAME: under the checkout's .venv when there is one
    import _venv
    _venv.reexec()

import argparse
import json
import os
import queue
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import httpx  # noqa: E402
from hypothesis import HealthCheck, Phase, given, seed, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from tests.property import doors  # noqa: E402

LOCAL_HOSTS = {"127.0.0.1", "localhost", "::1"}
CHUNK = 1000  # hypothesis runs of this many cases, each with a fresh seed (bounded memory)


@st.composite
def any_case(draw: st.DrawFn) -> doors.Case:
    """The property tests' mix: 40 % chat, 25 % completions, 20 % raw bodies, 15 % huge limits."""
    r = draw(st.integers(0, 19))
    if r < 8:
        return draw(doors.bodies("chat"))
    if r < 13:
        return draw(doors.bodies("completion"))
    if r < 17:
        return draw(doors.raw_bodies())
    return draw(doors.big_limits())


def produce(q: "queue.Queue[doors.Case | None]", n: int, base_seed: int, stop: threading.Event) -> None:
    """Feed ``n`` cases into ``q`` (blocking when it is full), then None."""
    done = 0
    chunk_no = 0
    while done < n and not stop.is_set():
        todo = min(CHUNK, n - done)

        @seed(base_seed + chunk_no)
        @settings(max_examples=todo, database=None, deadline=None, phases=[Phase.generate],
                  suppress_health_check=list(HealthCheck))
        @given(any_case())
        def run(case: doors.Case) -> None:
            while not stop.is_set():
                try:
                    q.put(case, timeout=0.5)
                    return
                except queue.Full:
                    continue

        run()
        done += todo
        chunk_no += 1
    if not stop.is_set():
        q.put(None)


class RemoteDoor:
    """A door that is already running; it is checked, never restarted."""

    def __init__(self, name: str, url: str, engine_urls: list[str], admin: bool) -> None:
        self.name, self.url = name, url.rstrip("/")
        self.admin_url = self.url if admin else None
        self._engines = engine_urls
        self.client = httpx.Client(timeout=doors.CLIENT_TIMEOUT)
        self.restarts = 0

    def engine_urls(self) -> list[str]:
        return self._engines

    def exited(self) -> list[str]:
        return []

    def heal(self) -> None:
        for url in self._engines:
            try:
                ok = self.client.get(url + "/livez", timeout=5).status_code == 200
            except httpx.HTTPError:
                ok = False
            if not ok:
                raise SystemExit(f"{self.name}: engine {url} is down and this run did not start it; stopping")

    def logs(self) -> str:
        return ""

    def stop(self) -> None:
        self.client.close()


def local(url: str) -> str:
    host = urlsplit(url).hostname
    if host not in LOCAL_HOSTS:
        raise SystemExit(f"refusing {url}: this runner only targets 127.0.0.1")
    return url.rstrip("/")


class Report:
    def __init__(self, door: str, out: Path | None, per_kind: int) -> None:
        self.door = door
        self.statuses: Counter[str] = Counter()
        self.codes: Counter[str] = Counter()
        self.kinds: Counter[str] = Counter()
        self.examples: dict[tuple[str, str], list[str]] = {}
        self.out = out
        self.per_kind = per_kind
        self.cases = 0
        self.batches = 0
        self.lock = threading.Lock()

    def count(self, out: doors.Outcome) -> None:
        with self.lock:
            self.cases += 1
            self.statuses[str(out.status) if out.status is not None else out.kind] += 1
            if out.code is not None:
                self.codes[f"{out.status} {out.code}"] += 1

    def violation(self, problem: doors.Violation, case: doors.Case | None, batch: list[doors.Case]) -> None:
        kind = type(problem).__name__
        sig = _signature(str(problem))
        with self.lock:
            self.kinds[kind] += 1
            seen = self.examples.setdefault((kind, sig), [])
            if len(seen) >= self.per_kind:
                return
            where = ""
            shown = case or (batch[0] if len(batch) == 1 else None)
            if self.out is not None:
                path = self.out / f"{self.door}-{kind}-{sum(self.kinds.values())}.json"
                body: Any = ({"path": shown.path, "headers": shown.headers, "body": shown.body.decode("latin-1")}
                             if shown else [{"path": c.path, "headers": c.headers, "body": c.body.decode("latin-1")}
                                            for c in batch])
                path.write_text(json.dumps(body, ensure_ascii=True))
                where = f" (saved as {path})"
            text = (shown.describe() if shown else "one of a concurrent batch, not reproduced alone: "
                    + " | ".join(c.describe(200) for c in batch))
            seen.append(f"{problem}\n      reproduce: {text}{where}")
            print(f"[{self.door}] {kind}: {str(problem)[:300]}\n      reproduce: {text[:800]}{where}", flush=True)

    def print(self, seconds: float, restarts: int) -> None:
        print(f"\n== {self.door} door: {self.cases} cases in {seconds:.0f} s, {self.batches} batches, "
              f"{restarts} restarts")
        print("   status: " + ", ".join(f"{k}={v}" for k, v in sorted(self.statuses.items())))
        print("   errors: " + ", ".join(f"{k}={v}" for k, v in self.codes.most_common()))
        if not self.kinds:
            print("   no invariant violation")
            return
        print("   violations: " + ", ".join(f"{k}={v}" for k, v in sorted(self.kinds.items())))
        for (kind, _), items in sorted(self.examples.items()):
            for item in items:
                print(f"   - {kind}: {item}")


def _signature(message: str) -> str:
    """Violations that differ only in numbers or quoted values count as one."""
    import re
    s = re.sub(r"'[^']*'|\"[^\"]*\"", "Q", message)
    return re.sub(r"\d+(\.\d+)?", "N", s)[:160]


def run_door(door: Any, args: argparse.Namespace, report: Report, deadline: float) -> None:
    stop = threading.Event()
    q: queue.Queue[doors.Case | None] = queue.Queue(maxsize=4 * args.concurrency)
    producer = threading.Thread(target=produce, args=(q, args.cases, args.seed, stop), daemon=True)
    producer.start()
    clients = [httpx.Client(timeout=doors.CLIENT_TIMEOUT) for _ in range(args.concurrency)]
    finished = False
    unchecked: list[doors.Case] = []  # cases sent since the invariant was last checked
    try:
        with ThreadPoolExecutor(args.concurrency) as pool:
            while not finished and time.monotonic() < deadline:
                batch: list[doors.Case] = []
                while len(batch) < args.concurrency:
                    item = q.get()
                    if item is None:
                        finished = True
                        break
                    batch.append(item)
                if not batch:
                    break
                door.heal()
                outs = list(pool.map(lambda ic: doors.exchange(clients[ic[0]], door.url, ic[1], args.timeout),
                                     enumerate(batch)))
                report.batches += 1
                for case, out in zip(batch, outs):
                    report.count(out)
                    for p in out.problems:
                        report.violation(p, case, batch)
                unchecked += batch
                if not finished and report.batches % args.check_every and time.monotonic() < deadline:
                    continue
                after = doors.settle(door.client, door.engine_urls(), door.admin_url, door.exited)
                if not any(isinstance(p, doors.EngineDown) for p in after):
                    after += doors.follow_up(door.client, door.url)
                suspects, unchecked = unchecked, []
                if after:
                    culprits = replay(door, suspects, args) if len(suspects) > 1 else {0: after}
                    if not culprits:
                        for p in after:
                            report.violation(p, None, suspects)
                    for i, problems in culprits.items():
                        for p in problems:
                            report.violation(p, suspects[i], [suspects[i]])
                if report.cases and report.cases % 1000 < args.concurrency:
                    print(f"[{door.name}] {report.cases} cases, violations {dict(report.kinds)}", flush=True)
    finally:
        stop.set()
        producer.join(60)  # it finishes its chunk without queueing: no hypothesis run outlives its door
        for c in clients:
            c.close()


def replay(door: Any, batch: list[doors.Case], args: argparse.Namespace) -> dict[int, list[doors.Violation]]:
    """Send each case of the batches that broke the invariant alone, checking after each."""
    found: dict[int, list[doors.Violation]] = {}
    for i, case in enumerate(batch):
        door.heal()
        doors.exchange(door.client, door.url, case, args.timeout)
        problems = doors.settle(door.client, door.engine_urls(), door.admin_url, door.exited)
        if not any(isinstance(p, doors.EngineDown) for p in problems):
            problems += doors.follow_up(door.client, door.url)
        if problems:
            found[i] = problems
    return found


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", type=int, default=100_000, help="cases per door (default 100,000)")
    ap.add_argument("--doors", default="engine,front", help="engine, front or both (default)")
    ap.add_argument("--concurrency", type=int, default=2,
                    help="requests in flight at once (default 2: the test engines have two slots)")
    ap.add_argument("--check-every", type=int, default=1,
                    help="check the invariant after every N batches (default 1); a failed check replays those "
                         "N batches' cases one at a time. Larger N makes a long run several times faster")
    ap.add_argument("--max-seconds", type=float, default=None, help="stop after this long, per door")
    ap.add_argument("--timeout", type=float, default=doors.CLIENT_TIMEOUT, help="client timeout per request (s)")
    ap.add_argument("--seed", type=int, default=int(time.time()), help="hypothesis seed (default: the time)")
    ap.add_argument("--engine-url", help="an engine already running (127.0.0.1) instead of starting one")
    ap.add_argument("--front-url", help="a coordinator already running (127.0.0.1) instead of starting a pool")
    ap.add_argument("--front-engine-url", action="append", default=[],
                    help="with --front-url: the pool's engine(s) to check after each batch (127.0.0.1)")
    ap.add_argument("--as-limit", type=int, default=None,
                    help="address-space limit of each daemon started here, bytes (default 8 GiB)")
    ap.add_argument("--out", type=Path, help="directory for the whole body of each reported violation")
    ap.add_argument("--examples-per-kind", type=int, default=3, help="bodies printed per distinct violation")
    args = ap.parse_args()
    if args.concurrency < 1 or args.cases < 1:
        ap.error("--cases and --concurrency must be at least 1")
    if args.as_limit is not None:
        os.environ["HYDRA_PROPERTY_AS_LIMIT"] = str(args.as_limit)
    os.environ.setdefault("HYDRA_MODELS_DIR", str(REPO / "models"))
    from tests.property import pool  # after HYDRA_PROPERTY_AS_LIMIT is set

    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="fuzz-doors-"))
    counter = iter(range(1_000_000))

    def mktemp(name: str) -> Path:
        p = tmp / f"{name}{next(counter)}"
        p.mkdir()
        return p

    wanted = [d.strip() for d in args.doors.split(",") if d.strip()]
    print(f"fuzz_doors: seed {args.seed}, {args.cases} cases per door, concurrency {args.concurrency}, "
          f"daemon address-space limit {pool.AS_LIMIT} bytes, work dir {tmp}", flush=True)
    failed = False
    for name in wanted:
        if name == "engine":
            door: Any = (RemoteDoor("engine", local(args.engine_url), [local(args.engine_url)], admin=False)
                         if args.engine_url else pool.EngineDoor(mktemp))
        elif name == "front":
            door = (RemoteDoor("front", local(args.front_url), [local(u) for u in args.front_engine_url], admin=True)
                    if args.front_url else pool.FrontDoor(mktemp))
        else:
            raise SystemExit(f"unknown door {name!r} (engine or front)")
        report = Report(name, args.out, args.examples_per_kind)
        t0 = time.monotonic()
        deadline = t0 + args.max_seconds if args.max_seconds else float("inf")
        try:
            run_door(door, args, report, deadline)
        except KeyboardInterrupt:
            print("interrupted", flush=True)
            report.print(time.monotonic() - t0, door.restarts)
            door.stop()
            return 130
        report.print(time.monotonic() - t0, door.restarts)
        failed = failed or bool(report.kinds)
        door.stop()
    print(f"logs of the daemons started here: {tmp}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
