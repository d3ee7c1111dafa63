"""sd_notify client: exact datagrams on a real socket, env parsing, failure handling."""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from hydrad.common.sdnotify import Notifier


@pytest.fixture
def receiver(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[socket.socket]:
    path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(2.0)
    monkeypatch.setenv("NOTIFY_SOCKET", str(path))
    monkeypatch.delenv("WATCHDOG_USEC", raising=False)
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    yield sock
    sock.close()


def recv(sock: socket.socket) -> bytes:
    return sock.recv(4096)


def assert_nothing_pending(sock: socket.socket) -> None:
    sock.setblocking(False)
    with pytest.raises(BlockingIOError):
        sock.recv(4096)


def test_ready(receiver: socket.socket) -> None:
    notifier = Notifier.from_env()
    assert notifier.enabled
    notifier.ready()
    assert recv(receiver) == b"READY=1\n"
    assert_nothing_pending(receiver)


def test_status_is_utf8_and_single_line(receiver: socket.socket) -> None:
    notifier = Notifier.from_env()
    notifier.status("loading — 42%")
    assert recv(receiver) == "STATUS=loading — 42%\n".encode()
    notifier.status("line one\nline two")
    assert recv(receiver) == b"STATUS=line one line two\n"


def test_stopping_and_watchdog(receiver: socket.socket) -> None:
    notifier = Notifier.from_env()
    notifier.stopping()
    notifier.watchdog()
    assert recv(receiver) == b"STOPPING=1\n"
    assert recv(receiver) == b"WATCHDOG=1\n"


def test_reloading_sends_monotonic_usec_in_same_datagram(receiver: socket.socket) -> None:
    notifier = Notifier.from_env()
    before = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    notifier.reloading()
    after = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    lines = recv(receiver).decode().splitlines()
    assert lines[0] == "RELOADING=1"
    assert len(lines) == 2
    key, _, value = lines[1].partition("=")
    assert key == "MONOTONIC_USEC"
    assert value.isdigit()
    assert before <= int(value) <= after


def test_extend_timeout(receiver: socket.socket) -> None:
    notifier = Notifier.from_env()
    notifier.extend_timeout(90)
    assert recv(receiver) == b"EXTEND_TIMEOUT_USEC=90000000\n"
    notifier.extend_timeout(1.5)
    assert recv(receiver) == b"EXTEND_TIMEOUT_USEC=1500000\n"


def test_send_fields_and_raw(receiver: socket.socket) -> None:
    notifier = Notifier.from_env()
    notifier.send(READY=1, STATUS="up", MAINPID=123)
    assert recv(receiver) == b"READY=1\nSTATUS=up\nMAINPID=123\n"
    notifier.send_raw("ERRNO=5\n")
    assert recv(receiver) == b"ERRNO=5\n"


def test_abstract_namespace(monkeypatch: pytest.MonkeyPatch) -> None:
    name = f"hydra-test-{uuid.uuid4().hex}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind("\0" + name)
    sock.settimeout(2.0)
    try:
        monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
        Notifier.from_env().ready()
        assert recv(sock) == b"READY=1\n"
    finally:
        sock.close()


def test_disabled_without_notify_socket(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    monkeypatch.setenv("WATCHDOG_USEC", "10000000")
    notifier = Notifier.from_env()
    assert not notifier.enabled
    assert notifier.watchdog_interval() is None
    notifier.ready()
    notifier.reloading()
    notifier.watchdog()


def test_unsupported_address_disables(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="hydrad.common.sdnotify"):
        notifier = Notifier.from_env({"NOTIFY_SOCKET": "relative/path"})
    assert not notifier.enabled
    assert "NOTIFY_SOCKET" in caplog.text


def test_watchdog_interval_is_half_the_period() -> None:
    env = {"NOTIFY_SOCKET": "/run/x", "WATCHDOG_USEC": "30000000"}
    assert Notifier.from_env(env).watchdog_interval() == 15.0
    env["WATCHDOG_USEC"] = "500000"
    assert Notifier.from_env(env).watchdog_interval() == 0.25


def test_watchdog_for_this_pid() -> None:
    env = {"NOTIFY_SOCKET": "/run/x", "WATCHDOG_USEC": "4000000", "WATCHDOG_PID": str(os.getpid())}
    assert Notifier.from_env(env).watchdog_interval() == 2.0


def test_watchdog_pid_mismatch_disables_watchdog() -> None:
    env = {"NOTIFY_SOCKET": "/run/x", "WATCHDOG_USEC": "4000000", "WATCHDOG_PID": str(os.getpid() + 1)}
    notifier = Notifier.from_env(env)
    assert notifier.enabled
    assert notifier.watchdog_interval() is None


@pytest.mark.parametrize("usec", ["", "0", "-5", "soon"])
def test_bad_watchdog_usec_disables_watchdog(usec: str) -> None:
    env = {"NOTIFY_SOCKET": "/run/x", "WATCHDOG_USEC": usec}
    assert Notifier.from_env(env).watchdog_interval() is None


def test_unreachable_socket_warns_once_and_never_raises(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "missing.sock"))
    notifier = Notifier.from_env()
    with caplog.at_level(logging.WARNING, logger="hydrad.common.sdnotify"):
        notifier.ready()
        notifier.status("still here")
        notifier.watchdog()
    warnings = [r for r in caplog.records if r.name == "hydrad.common.sdnotify"]
    assert len(warnings) == 1
    assert warnings[0].levelno == logging.WARNING
    assert "missing.sock" in warnings[0].getMessage()


def test_receiver_gone_after_connect_reconnects(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "notify.sock"
    monkeypatch.setenv("NOTIFY_SOCKET", str(path))
    first = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    first.bind(str(path))
    notifier = Notifier.from_env()
    notifier.ready()
    assert first.recv(4096) == b"READY=1\n"
    first.close()
    path.unlink()

    notifier.watchdog()  # peer gone: logged, not raised

    second = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    second.bind(str(path))
    second.settimeout(2.0)
    try:
        notifier.status("back")
        assert second.recv(4096) == b"STATUS=back\n"
    finally:
        second.close()
