"""Memory: the orchestrator's RSS idle, and with N idle agent connections (1,000; --quick 50).

The server is a real `conveyor server` process; its RSS is read from /proc/<pid>/status (VmRSS).
The agents are minimal WebSocket clients in this process speaking the real handshake (auth.request
with their own agent token → auth.success → agent.register → register.ack) and then sending a
heartbeat at the interval the server asked for, as an idle `conveyor agent` does — without running
1,000 agent processes. Each has its own token (a token binds to one agent id).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
import websockets
from sqlalchemy import func, select

from bench.harness import (
    Report,
    Server,
    arguments,
    finish,
    fresh_database,
    running_server,
    wait_until,
    workdir,
)
from bench.harness import selected_dialects as chosen_dialects
from conveyor.db.engine import create_sync_engine
from conveyor.db.tables import agents
from conveyor.model import protocol as p

IDLE_TARGET_MB = 150.0
PER_1000_TARGET_MB = 100.0


async def make_tokens(server: Server, count: int) -> list[str]:
    """`count` agent tokens through the admin API (8 requests at a time)."""
    tokens: list[str] = []
    gate = asyncio.Semaphore(8)
    async with httpx.AsyncClient(
        base_url=f"{server.url}/api/v1/admin", headers=server.headers(), timeout=60
    ) as http:

        async def one() -> None:
            async with gate:
                answer = await http.post("/agent-tokens", json={"labels": ["linux"], "mandatory_labels": []})
                answer.raise_for_status()
                tokens.append(answer.json()["token"])

        await asyncio.gather(*(one() for _ in range(count)))
    return tokens


class IdleAgent:
    """One registered connection that only heartbeats."""

    def __init__(self, ws_url: str, token: str, index: int) -> None:
        self.ws_url, self.token, self.agent_id = ws_url, token, f"bench-idle-{index:05d}"
        self.socket: Any = None
        self.tasks: list[asyncio.Task[None]] = []

    async def connect(self) -> None:
        self.socket = await websockets.connect(self.ws_url, max_size=None, open_timeout=60)
        await self.socket.send(p.AuthRequest(token=self.token, version="bench").model_dump_json())
        auth = p.parse_orchestrator_message(await self.socket.recv())
        if not isinstance(auth, p.AuthSuccess):
            raise RuntimeError(f"auth refused: {auth}")
        await self.socket.send(p.AgentRegister(agent_id=self.agent_id, labels=["linux"]).model_dump_json())
        ack = p.parse_orchestrator_message(await self.socket.recv())
        if not isinstance(ack, p.RegisterAck):
            raise RuntimeError(f"register refused: {ack}")
        self.tasks = [
            asyncio.create_task(self._heartbeat(auth.heartbeat_ms / 1000)),
            asyncio.create_task(self._drain()),
        ]

    async def _heartbeat(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            await self.socket.send(p.Heartbeat(ts=time.time(), free_slots=1).model_dump_json())

    async def _drain(self) -> None:
        async for _ in self.socket:
            pass

    async def close(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        if self.socket is not None:
            await self.socket.close()


def online_count(database_url: str) -> int:
    """Agents the orchestrator has recorded online."""
    engine = create_sync_engine(database_url)
    try:
        with engine.connect() as conn:
            return int(
                conn.execute(
                    select(func.count()).select_from(agents).where(agents.c.state == "online")
                ).scalar_one()
            )
    finally:
        engine.dispose()


def settled_rss(server: Server, seconds: float) -> float:
    """The server's RSS after `seconds` of quiet (the highest of a few samples over the last second)."""
    time.sleep(max(0.0, seconds - 1))
    samples = []
    for _ in range(5):
        samples.append(server.rss_mb())
        time.sleep(0.2)
    return max(samples)


async def hold_agents(server: Server, database_url: str, count: int, settle_s: float) -> tuple[float, float]:
    """Connect `count` idle agents, wait until all are online, measure RSS; (rss MB, connect seconds)."""
    tokens = await make_tokens(server, count)
    connections = [IdleAgent(server.ws_url, token, i) for i, token in enumerate(tokens)]
    started = time.monotonic()
    try:
        for batch in range(0, count, 50):
            await asyncio.gather(*(a.connect() for a in connections[batch : batch + 50]))
        connect_s = time.monotonic() - started
        await asyncio.to_thread(
            wait_until,
            lambda: online_count(database_url) >= count,
            timeout=120,
            what=f"{count} agents online",
        )
        rss = await asyncio.to_thread(settled_rss, server, settle_s)
        if online_count(database_url) < count:
            raise RuntimeError("agents dropped while measuring")
        return rss, connect_s
    finally:
        await asyncio.gather(*(a.close() for a in connections), return_exceptions=True)


def measure(dialect: str, base: Path, *, count: int, settle_s: float, report: Report) -> None:
    with (
        fresh_database(dialect, base) as database_url,
        running_server(base / f"home-{dialect}", database_url) as server,
    ):
        idle = settled_rss(server, settle_s)
        report.add(
            f"memory {dialect}: orchestrator RSS idle",
            idle,
            "MB",
            target=f"<= {IDLE_TARGET_MB:.0f} MB",
            met=idle <= IDLE_TARGET_MB,
        )
        loaded, connect_s = asyncio.run(hold_agents(server, database_url, count, settle_s))
        added = loaded - idle
        per_1000 = added * 1000 / count
        report.add(
            f"memory {dialect}: RSS with {count:,} idle agents",
            loaded,
            "MB",
            note=f"connected in {connect_s:.1f} s",
        )
        report.add(
            f"memory {dialect}: added per 1,000 idle agents",
            per_1000,
            "MB",
            target=f"<= {PER_1000_TARGET_MB:.0f} MB",
            met=(per_1000 <= PER_1000_TARGET_MB) if count >= 1000 else None,
            note=f"{added:.1f} MB for {count:,}"
            + ("" if count >= 1000 else " (scaled from fewer than 1,000: not judged)"),
        )


def main() -> None:
    parser = arguments(__doc__ or "")
    parser.add_argument("--agents", type=int, help="idle agent connections (default 1000, --quick 50)")
    args = parser.parse_args()
    count = args.agents or (50 if args.quick else 1000)
    settle_s = 2.0 if args.quick else 5.0
    report = Report("memory")
    with workdir() as base:
        for dialect in chosen_dialects(args):
            print(f"memory on {dialect}: idle, then {count} idle agents", flush=True)
            measure(dialect, base, count=count, settle_s=settle_s, report=report)
    finish(report, args)


if __name__ == "__main__":
    main()
