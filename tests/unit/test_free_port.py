"""Test servers' ports: each pytest worker has a range of its own, outside the kernel's ephemeral range."""

from __future__ import annotations

import socket

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
