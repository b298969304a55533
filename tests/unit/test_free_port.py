"""Test servers' ports: each pytest worker has a range of its own, outside the kernel's ephemeral range."""

from __future__ import annotations

import importlib
import socket

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
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", first + 1))
        taken.listen()
        following = [free_port() for _ in range(20)]
    handed = [first, *following]
    assert len(set(handed)) == len(handed)
    assert first + 1 not in handed


def test_the_port_base_moves_every_workers_range(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONVEYOR_TEST_PORT_BASE", "5000")
    moved = importlib.reload(processes)
    try:
        assert moved.worker_port_range("gw0") == range(5000, 6500)
        assert moved.worker_port_range("gw1") == range(6500, 8000)
    finally:
        monkeypatch.delenv("CONVEYOR_TEST_PORT_BASE")
        importlib.reload(processes)
