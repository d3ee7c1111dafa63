"""The console's text: sizes, ages, durations, load and switch progress, one-line event
descriptions, all rendered from :mod:`tui.model` (plain strings; the widgets style them)."""

from __future__ import annotations

import time
from typing import Any

from tui.model import EngineRow, PoolModel, fraction


def fmt_bytes(n: int | None) -> str:
    if n is None:
        return "-"
    gib = n / (1 << 30)
    return f"{gib:.1f}G" if gib >= 1 else f"{n / (1 << 20):.0f}M"


def fmt_vram(row: EngineRow) -> str:
    used, total = row.vram_used, row.vram_total
    if not total:
        return "-"
    return f"{fmt_bytes(used)}/{fmt_bytes(total)}"


def fmt_gpu(row: EngineRow) -> str:
    gpu = row.gpu
    name = str(gpu.get("description") or gpu.get("name") or "?")
    for prefix in ("NVIDIA GeForce ", "NVIDIA ", "AMD Radeon ", "Intel(R) "):
        if name.startswith(prefix):
            name = name[len(prefix):]
            break
    arch = str(gpu.get("arch") or "")
    if arch and arch.lower() != name.lower():
        name = f"{name} {arch}"
    return name


def fmt_age(age: float | None) -> str:
    if age is None:
        return "-"
    if age < 10:
        return f"{age:.1f}s"
    if age < 120:
        return f"{age:.0f}s"
    if age < 7200:
        return f"{age / 60:.0f}m"
    if age < 172800:
        return f"{age / 3600:.0f}h"
    return f"{age / 86400:.0f}d"


def fmt_secs(v: float | None) -> str:
    """Elapsed/remaining time: 4.2s, 38s, 3m05s, 1h02m."""
    if v is None:
        return "?"
    if v < 10:
        return f"{v:.1f}s"
    if v < 60:
        return f"{v:.0f}s"
    if v < 3600:
        return f"{int(v // 60)}m{int(v % 60):02d}s"
    return f"{int(v // 3600)}h{int(v % 3600 // 60):02d}m"


def fmt_load(state: PoolModel, row: EngineRow) -> str:
    """``42% · 3.1s · ETA 4.0s`` for a load under way (the parts known so far); ``fetching 37%, 120 MB/s, ETA
    12 s · 3.1s · ...`` while the engine fetches the model's file first."""
    parts = []
    if row.fetch:  # the model's file comes first: its transfer says more than the load's 0%
        parts.append(row.fetch)
    elif row.progress is not None:
        parts.append(f"{row.progress * 100:.0f}%")
    elapsed = state.load_elapsed(row)
    if elapsed is not None:
        parts.append(fmt_secs(elapsed))
    eta = state.load_eta(row)
    parts.append(f"ETA {fmt_secs(eta)}" if eta is not None else "ETA ?")
    return " · ".join(parts)


def fmt_switch(state: PoolModel) -> str | None:
    """``switch → swapped: 1/2 engines done · 12s`` while a switch runs, else None."""
    p = state.profile
    if p.state != "switching":
        return None
    done, total = p.progress()
    elapsed = state.switch_elapsed()
    failed = [e for e, r in p.switch_done.items() if not r.get("ok")]
    text = f"switch → {p.switching_to or p.active}: {done}/{total} engine{'s' if total != 1 else ''} done"
    if failed:
        text += f" ({len(failed)} FAILED)"
    if elapsed is not None:
        text += f" · {fmt_secs(elapsed)}"
    return text


def fmt_tps(v: float | None) -> str:
    return "-" if not v else (f"{v:.0f}" if v >= 100 else f"{v:.1f}")


def fmt_clock(ts: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(ts))


def describe_event(topic: str, data: dict[str, Any]) -> str:
    """One line for the event log."""
    e = data.get("engine")
    if topic == "engine.up":
        gpu = fmt_gpu(EngineRow(str(e), gpu=data.get("gpu") if isinstance(data.get("gpu"), dict) else {}))
        return f"{e} up: {data.get('stage')} {data.get('model') or '(no model)'} on {gpu}"
    if topic == "engine.down":
        return f"{e} DOWN: {data.get('reason')}"
    if topic == "engine.stage":
        if data.get("previous") == data.get("stage"):  # the model changed within the stage (a reload's swap)
            return f"{e} now serves {data.get('model') or '(no model)'} ({data.get('stage')})"
        model = data.get("loading_model") or data.get("model") or "-"
        return f"{e} {data.get('previous')} → {data.get('stage')} ({model})"
    if topic == "engine.progress":
        p = fraction(data.get("progress"))
        pct = "?" if p is None else f"{p * 100:.0f}%"
        if isinstance(data.get("fetch"), str):
            pct = data["fetch"]
        return f"{e} {data.get('stage')} {data.get('loading_model') or ''} {pct}".replace("  ", " ")
    if topic == "engine.load":
        return f"{e} loading {data.get('model')} ({data.get('why')})"
    if topic == "profile.start":
        engines = ", ".join(data.get("engines") or []) or "none"
        extra = f"; absent: {', '.join(data['absent'])}" if data.get("absent") else ""
        return f"profile {data.get('previous')} → {data.get('profile')}: reloading {engines}{extra}"
    if topic == "profile.progress":
        p = fraction(data.get("progress"))
        shown = data["fetch"] if isinstance(data.get("fetch"), str) else "?" if p is None else f"{p * 100:.0f}%"
        return f"profile {data.get('profile')}: {e} {data.get('stage')} {shown}"
    if topic == "profile.engine":
        phase = data.get("phase")
        if phase == "configuring":
            return f"{e} configuring → {data.get('model')} ({data.get('why')})"
        secs = data.get("seconds")
        tail = f" in {secs:.1f} s" if isinstance(secs, (int, float)) else ""
        err = f": {data.get('error')}" if data.get("error") else ""
        return f"{e} {phase} {data.get('model') or ''}{tail}{err}"
    if topic == "profile.done":
        ok = "done" if data.get("ok") else "FAILED (" + ", ".join(data.get("failed") or []) + ")"
        secs = data.get("seconds")
        tail = f" in {secs:.1f} s" if isinstance(secs, (int, float)) else ""
        return f"profile {data.get('profile')} {ok}{tail}"
    if topic == "route":
        return describe_route_data(data)
    if topic in ("session.moved", "session.restored"):
        how = "moved to" if topic == "session.moved" else "restored from the store on"
        dst = data.get("dst") or e
        secs = data.get("seconds")
        tail = f" in {secs * 1000:.0f} ms" if isinstance(secs, (int, float)) else ""
        return f"session {data.get('session')} {how} {dst} (slot {data.get('slot')}, {data.get('tokens')} tokens){tail}"
    if topic == "split":
        pre, dec = data.get("prefill"), data.get("decode")
        if not data.get("ok"):
            return f"{data.get('req')} split {pre} → {dec} abandoned ({data.get('error')}); {dec} prefills"
        pf, tf = data.get("measured_prefill_s"), data.get("measured_transfer_s")
        took = (f": prefill {pf * 1000:.0f} ms, transfer {tf * 1000:.0f} ms"
                if isinstance(pf, (int, float)) and isinstance(tf, (int, float)) else "")
        return (f"{data.get('req')} split: {pre} prefilled {data.get('tokens')} tokens, {dec} decodes{took} "
                f"(planned {data.get('total_s')} s against {data.get('single_s')} s on {data.get('single')})")
    if topic == "session.kept":
        return f"session {data.get('session')} kept ({data.get('tokens')} tokens from {e})"
    return f"{topic} {data}"


def describe_route_data(data: dict[str, Any]) -> str:
    engine = data.get("engine") or "none"
    return f"{data.get('req')} → {engine} [{data.get('step')}] {data.get('reason') or ''}".rstrip()
