"""Test servers' ports: each pytest worker has a range of its own, outside the kernel's ephemeral range."""

from __future__ import annotations

import importlib
import os
import socket
import subprocess
import sys

import pytest

from tests.support import processes
from tests.support.processes import free_port, worker_port_range


def test_workers_ranges_are_disjoint_and_below_the_ephemeral_range() -> None:
    ranges = [set(worker_port_range(f"gw{i}")) for i in range(8)]
    assert all(a.isdisjoint(b) for i, a in enumerate(ranges) for b in ranges[i + 1 :])
    assert max(max(r) for r in ranges) < 32768
    assert worker_port_range("master") == worker_port_range("gw0")


def test_a_process_hands_out_distinct_ports_and_skips_one_in_use() -> None:
    first = free_port()
    taken, in_use = _listen_on_the_first_free_port_after(first)
    with taken:
        following = [free_port() for _ in range(20)]
    handed = [first, *following]
    assert len(set(handed)) == len(handed)
    assert in_use not in handed


def _listen_on_the_first_free_port_after(port: int) -> tuple[socket.socket, int]:
    # Another checkout's test run may be using the next port: take the first one that binds.
    for candidate in range(port + 1, port + 100):
        sock = socket.socket()
        try:
            sock.bind(("127.0.0.1", candidate))
        except OSError:
            sock.close()
            continue
        sock.listen()
        return sock, candidate
    raise AssertionError("no free port near the one handed out")


def test_the_port_base_moves_every_workers_range(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONVEYOR_TEST_PORT_BASE", "5000")
    moved = importlib.reload(processes)
    try:
        assert moved.worker_port_range("gw0") == range(5000, 6500)
        assert moved.worker_port_range("gw1") == range(6500, 8000)
    finally:
        monkeypatch.delenv("CONVEYOR_TEST_PORT_BASE")
        importlib.reload(processes)


def test_a_port_claimed_by_another_live_process_is_refused_and_a_dead_ones_claim_is_taken_over() -> None:
    claims = processes.PORT_CLAIMS
    claims.mkdir(exist_ok=True)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    # Ports no test server is ever handed (below 1024), so no real claim is disturbed.
    held_by_init, held_by_the_dead, held_by_us = 1, 2, 3
    (claims / str(held_by_init)).write_text("1")
    (claims / str(held_by_the_dead)).write_text(str(dead.pid))
    (claims / str(held_by_us)).write_text(str(os.getpid()))
    try:
        assert not processes._claim(held_by_init)
        assert processes._claim(held_by_the_dead)
        assert (claims / str(held_by_the_dead)).read_text() == str(os.getpid())
        assert processes._claim(held_by_us)
    finally:
        for port in (held_by_init, held_by_the_dead, held_by_us):
            (claims / str(port)).unlink(missing_ok=True)


def test_a_port_chromium_refuses_is_never_handed_out(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONVEYOR_TEST_PORT_BASE", "6000")
    moved = importlib.reload(processes)
    try:
        monkeypatch.setattr(moved, "_handed_out", iter(range(10)))
        assert moved.free_port() != 6000  # X11's port: chromium answers ERR_UNSAFE_PORT
    finally:
        monkeypatch.delenv("CONVEYOR_TEST_PORT_BASE")
        importlib.reload(processes)
