"""The cluster under test: two coordinators on one PostgreSQL database, two database-less workers behind
cuttable links, connected agents and scalers (docs/design/cluster.md §1, §9), and the controls the
faults use (kill -9 and restart, SIGSTOP/SIGCONT, link cuts, terminated database sessions, a full disk).

Every process runs from the harness's own work directory; `close()` ends exactly the processes it
started, and `leftovers()` finds any process a scaler started that outlived the cluster.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import random
import shutil
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
import psycopg

from tests.support.cluster import SHARED_SECRET_KEY, LinkProxy
from tests.support.processes import ServerProcess, clean_environ, conveyor_command, free_port
from tests.support.waiting import wait_until

# Timings: fast enough that a 60-second run sees sweeps, leases and recoveries turn over, slow enough that a
# busy 2-core machine does not drop peers on ordinary scheduling delays (a peer is stale after 10 silent
# 1 s beats, not the tests' 3 × 200 ms), and the cluster's own background work leaves room for the load.
CLUSTER_ENV = {
    "CONVEYOR_CLUSTER_HEARTBEAT_INTERVAL_MS": "1000",
    "CONVEYOR_CLUSTER_PEER_STALE_BEATS": "10",
    "CONVEYOR_CLUSTER_LEASE_TTL_MS": "5000",
    "CONVEYOR_CLUSTER_LEASE_RENEW_MS": "1500",
    "CONVEYOR_CLUSTER_SETTINGS_CACHE_TTL_MS": "1000",
    "CONVEYOR_READY_CACHE_MS": "0",
    "CONVEYOR_SWEEP_INTERVAL_MS": "2000",
    "CONVEYOR_DISPATCH_POLL_MS": "1000",
    "CONVEYOR_DISPATCH_ACK_TIMEOUT_MS": "5000",
    "CONVEYOR_RECOVERY_GRACE_MS": "5000",
    "CONVEYOR_AGENT_DEAD_AFTER_MS": "15000",
    "CONVEYOR_REROUTE_FLAP_GRACE_MS": "5000",
    "CONVEYOR_REROUTE_SPAWN_WINDOW_MS": "30000",
    "CONVEYOR_SCALER_POLL_MS": "1000",
    "CONVEYOR_SCALER_PROVISION_BACKOFF_BASE_MS": "1000",
    "CONVEYOR_SCALER_PROVISION_BACKOFF_MAX_MS": "5000",
    "CONVEYOR_KILL_GRACE_MS": "2000",
    "CONVEYOR_LOG_FORMAT": "json",
}
AGENT_LABELS = ["linux", "static"]
SCALER_LABELS = ["linux", "burst"]
TMPFS_SIZE = "64m"


def scalers_yaml(max_agents: int) -> str:
    """A bare-metal scaler serving `SCALER_LABELS` (JSON is YAML)."""
    scaler = {
        "name": "burst",
        "type": "bare-metal",
        "max_agents": max_agents,
        "terminate_grace_s": 3,
        "label_sets": [{"labels": SCALER_LABELS}],
    }
    return json.dumps({"version": 1, "scalers": [scaler]})


@dataclass
class Server:
    """A coordinator or worker: one `conveyor server` on a fixed port and home, restartable."""

    name: str
    home: Path
    env: dict[str, str]
    args: list[str]
    database_url: str | None
    port: int = field(default_factory=free_port)
    process: ServerProcess | None = None
    frozen: bool = False
    generation: int = 0

    @property
    def url(self) -> str:
        """`http://127.0.0.1:<port>`."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        """The live process id, if any."""
        return self.process.proc.pid if self.process and self.process.proc.poll() is None else None

    def start(self) -> None:
        """Spawn the process (its output goes to `<home>/server-<port>.log`, appended across restarts)."""
        self.generation += 1
        log = self.home / f"server-{self.port}.log"
        if log.exists():  # ServerProcess truncates its log: keep each generation's output
            log.rename(self.home / f"server-{self.port}.{self.generation - 1}.log")
        self.process = ServerProcess(
            self.home, database_url=self.database_url, env=self.env, args=self.args, port=self.port
        )
        self.frozen = False

    def kill(self) -> None:
        """SIGKILL (thawing is moot: a stopped process dies of SIGKILL too)."""
        if self.process:
            self.process.kill()
        self.frozen = False

    def freeze(self) -> None:
        """SIGSTOP."""
        if self.process and self.process.proc.poll() is None:
            self.process.signal(signal.SIGSTOP)
            self.frozen = True

    def thaw(self) -> None:
        """SIGCONT."""
        if self.process and self.process.proc.poll() is None:
            self.process.signal(signal.SIGCONT)
        self.frozen = False

    def alive(self) -> bool:
        """Whether the process runs (frozen counts)."""
        return self.pid is not None

    def ready(self) -> bool:
        """Whether `/ready` answers 200 right now."""
        try:
            return httpx.get(self.url + "/ready", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self) -> None:
        """SIGCONT, then SIGTERM and a wait (SIGKILL if it hangs)."""
        if self.process:
            self.process.signal(signal.SIGCONT)
            self.process.stop(timeout=30)


@dataclass
class Agent:
    """A connected (static-token) agent: `conveyor agent` dialing one coordinator, restartable."""

    name: str
    home: Path
    url: str
    token_file: Path
    capacity: int
    process: subprocess.Popen[bytes] | None = None
    frozen: bool = False

    @property
    def pid(self) -> int | None:
        """The live process id, if any."""
        return self.process.pid if self.process and self.process.poll() is None else None

    def start(self) -> None:
        """Spawn the agent (output appended to `<home>/agent.log`)."""
        self.home.mkdir(parents=True, exist_ok=True)
        log = open(self.home / "agent.log", "ab")
        command = conveyor_command(
            "agent",
            "--url",
            self.url,
            "--token-file",
            str(self.token_file),
            "--labels",
            ",".join(AGENT_LABELS),
            "--capacity",
            str(self.capacity),
            "--home",
            str(self.home),
            "--agent-id",
            self.name,
        )
        env = clean_environ({"CONVEYOR_AGENT_HEARTBEAT_MS": "2000", "CONVEYOR_KILL_GRACE_MS": "2000"})
        self.process = subprocess.Popen(
            command, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=self.home
        )
        log.close()
        self.frozen = False

    def kill(self) -> None:
        """SIGKILL the agent process."""
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=15)
        self.frozen = False

    def freeze(self) -> None:
        """SIGSTOP."""
        if self.pid:
            os.kill(self.pid, signal.SIGSTOP)
            self.frozen = True

    def thaw(self) -> None:
        """SIGCONT."""
        if self.pid:
            os.kill(self.pid, signal.SIGCONT)
        self.frozen = False

    def alive(self) -> bool:
        """Whether the process runs."""
        return self.pid is not None

    def stop(self) -> None:
        """SIGCONT, SIGTERM and a wait (SIGKILL if it hangs)."""
        if self.process and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGCONT)
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=15)


class ChaosCluster:
    """Two coordinators, two workers (each behind a proxy per coordinator link) and two connected agents."""

    def __init__(self, root: Path, database_url: str, database_name: str, *, use_tmpfs: bool) -> None:
        self.root = root
        self.database_url = database_url
        self.database_name = database_name
        self.coordinators: dict[str, Server] = {}
        self.workers: dict[str, Server] = {}
        self.agents: dict[str, Agent] = {}
        self.proxies: dict[tuple[str, str], LinkProxy] = {}
        self.tmpfs: list[Path] = []
        self.owner_token = ""
        self.use_tmpfs = use_tmpfs
        self.tmpfs_refusal: str | None = None

    # Start-up -------------------------------------------------------------------------------------------

    def start(self) -> None:
        """Start every process and wait until the workers are connected to both coordinators."""
        for name, scaler in (("c1", 1), ("c2", 0)):
            self.coordinators[name] = self._coordinator(name, scaler)
        first = self.coordinators["c1"]
        first.start()
        assert first.process is not None
        first.process.wait_ready(timeout=180)
        self.owner_token = first.process.owner_token()
        second = self.coordinators["c2"]
        second.start()
        assert second.process is not None
        second.process.wait_ready(timeout=180)
        for name in ("w1", "w2"):
            self.workers[name] = self._worker(name)
            self.workers[name].start()
        for worker in self.workers.values():
            assert worker.process is not None
            worker.process.wait_ready(timeout=180)
        wait_until(self._workers_connected, timeout=120, what="both workers connected to both coordinators")
        for name, coordinator, capacity in (("a1", "c1", 2), ("a2", "c2", 2)):
            token_file = self.root / f"{name}.token"
            token_file.write_text(
                self.admin("POST", "/agent-tokens", {"labels": AGENT_LABELS}).json()["token"]
            )
            token_file.chmod(0o600)
            url = self.coordinators[coordinator].url.replace("http://", "ws://") + "/ws"
            self.agents[name] = Agent(name, self.root / "agents" / name, url, token_file, capacity)
            self.agents[name].start()
        wait_until(self._agents_online, timeout=120, what="the connected agents online")

    def _coordinator(self, name: str, scaler_agents: int) -> Server:
        home = self.root / name
        home.mkdir(parents=True, exist_ok=True)
        env = {**CLUSTER_ENV, "CONVEYOR_SECRET_KEY": SHARED_SECRET_KEY, "CONVEYOR_INSTANCE_ID": name}
        if scaler_agents:
            (home / "scalers.yaml").write_text(scalers_yaml(scaler_agents))
            env["CONVEYOR_SCALER_CONFIG"] = str(home / "scalers.yaml")
        return Server(name, home, env, [], self.database_url)

    def _worker(self, name: str) -> Server:
        home = self.root / name
        home.mkdir(parents=True, exist_ok=True)
        self._mount_tmpfs(home)
        urls = []
        for coordinator in self.coordinators.values():
            proxy = LinkProxy(coordinator.port)
            self.proxies[(name, coordinator.name)] = proxy
            urls.append(proxy.url)
        config = self.root / f"{name}-scalers.yaml"
        config.write_text(scalers_yaml(2))
        join = self.admin("POST", "/peers/join-tokens", {"role": "worker"}).json()["token"]
        env = {
            **CLUSTER_ENV,
            "CONVEYOR_INSTANCE_ID": name,
            "CONVEYOR_CLUSTER_JOIN_TOKEN": join,
            "CONVEYOR_SCALER_CONFIG": str(config),
        }
        return Server(name, home, env, ["--role", "worker", "--coordinator", ",".join(urls)], None)

    def _mount_tmpfs(self, home: Path) -> None:
        if not self.use_tmpfs:
            self.tmpfs_refusal = "disabled (--no-tmpfs)"
            return
        if os.geteuid() != 0:
            self.tmpfs_refusal = "not running as root: a tmpfs home cannot be mounted"
            return
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={TMPFS_SIZE},mode=0755", "tmpfs", str(home)],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            self.tmpfs_refusal = f"mount -t tmpfs failed: {done.stderr.strip()}"
            return
        self.tmpfs.append(home)

    def _workers_connected(self) -> bool:
        for coordinator in self.coordinators.values():
            peers = self.admin("GET", "/peers", via=coordinator).json()["items"]
            connected = {p["instance_id"] for p in peers if p["connected"]}
            if not set(self.workers) <= connected:
                return False
        return True

    def _agents_online(self) -> bool:
        # One by one: the list is paged, and after a few minutes of load the scaler's one-shot agents fill
        # its first page, so the connected agents are not on it.
        for agent_id in self.agents:
            answer = self.admin("GET", f"/agents/{agent_id}")
            if answer.status_code != 200 or answer.json().get("state") != "online":
                return False
        return True

    # Access ---------------------------------------------------------------------------------------------

    def admin(self, method: str, path: str, body: Any = None, *, via: Server | None = None) -> httpx.Response:
        """An admin API call through `via`, else the first coordinator that answers."""
        candidates = [via] if via else self.live_coordinators()
        last: Exception | None = None
        for server in candidates:
            try:
                return httpx.request(
                    method,
                    f"{server.url}/api/v1/admin{path}",
                    json=body,
                    headers={"Authorization": f"Bearer {self.owner_token}"},
                    timeout=10,
                )
            except httpx.HTTPError as exc:
                last = exc
        raise RuntimeError(f"no coordinator answered {method} {path}: {last}")

    def live_coordinators(self) -> list[Server]:
        """Coordinators running and not frozen, in a random order (a load balancer's choice)."""
        live = [c for c in self.coordinators.values() if c.alive() and not c.frozen]
        random.shuffle(live)
        return live or list(self.coordinators.values())

    def servers(self) -> dict[str, Server]:
        """Coordinators and workers by name."""
        return {**self.coordinators, **self.workers}

    # Faults ---------------------------------------------------------------------------------------------

    def kill(self, name: str) -> None:
        """kill -9 a coordinator, worker or connected agent."""
        self._target(name).kill()

    def restart(self, name: str) -> None:
        """Start a killed process again on the same home (and port)."""
        target = self._target(name)
        if not target.alive():
            target.start()

    def freeze(self, name: str) -> None:
        """SIGSTOP a coordinator, worker or connected agent."""
        self._target(name).freeze()

    def thaw(self, name: str) -> None:
        """SIGCONT it."""
        self._target(name).thaw()

    def _target(self, name: str) -> Server | Agent:
        return self.servers().get(name) or self.agents[name]

    def cut(self, link: str) -> None:
        """Drop the `worker->coordinator` link."""
        worker, coordinator = link.split("->")
        self.proxies[(worker, coordinator)].cut()

    def restore(self, link: str) -> None:
        """Let the link through again."""
        worker, coordinator = link.split("->")
        self.proxies[(worker, coordinator)].restore()

    def terminate_sessions(self, share: float, rng: random.Random) -> int:
        """pg_terminate_backend on `share` of the coordinators' sessions of the run's database."""
        with self._maintenance() as conn:
            pids = [
                int(row[0])
                for row in conn.execute(
                    "SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
                    (self.database_name,),
                ).fetchall()
            ]
            chosen = sorted(rng.sample(pids, max(1, round(len(pids) * share)))) if pids else []
            for pid in chosen:
                conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
        return len(chosen)

    @contextlib.contextmanager
    def _maintenance(self) -> Iterator[psycopg.Connection[Any]]:
        with psycopg.connect(self.database_url, autocommit=True, connect_timeout=5) as conn:
            yield conn

    def fill_disk(self, name: str) -> int:
        """Fill the node's tmpfs home to the last byte; the bytes taken."""
        home = self.servers()[name].home
        filler = home / ".chaos-filler"
        stats = os.statvfs(home)
        descriptor = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            with contextlib.suppress(OSError):  # reserve the free space at once, without writing it
                os.posix_fallocate(descriptor, 0, stats.f_bavail * stats.f_frsize)
            chunk = b"\0" * 4096
            while True:  # what fallocate left (or all of it where it is not supported)
                try:
                    os.write(descriptor, chunk)
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    break
        finally:
            os.close(descriptor)
        return filler.stat().st_size

    def free_disk(self, name: str) -> None:
        """Remove the filler."""
        with contextlib.suppress(FileNotFoundError):
            (self.servers()[name].home / ".chaos-filler").unlink()

    def spawned_agents(self) -> list[psutil.Process]:
        """Live scaler-spawned agent processes (their working directory is a scaler work directory)."""
        found = []
        for proc in self._processes_under(self.root):
            try:
                if (
                    "/scaler/work/" in proc.cwd()
                    and "agent" in " ".join(proc.cmdline())
                    and "runner" not in " ".join(proc.cmdline())
                ):
                    found.append(proc)
            except psutil.Error:
                continue
        return found

    # Healing and the end --------------------------------------------------------------------------------

    def heal(self) -> None:
        """Undo every fault in force: thaw, restore links, free disks, restart what is down."""
        for proxy in self.proxies.values():
            proxy.restore()
        for name in list(self.servers()) + list(self.agents):
            target = self._target(name)
            if target.frozen:
                target.thaw()
            if not target.alive():
                target.start()
        for home in self.tmpfs:
            with contextlib.suppress(FileNotFoundError):
                (home / ".chaos-filler").unlink()

    def wait_healthy(self, timeout: float = 180) -> None:
        """Until every server is ready, the workers connected and the agents online."""
        for server in self.servers().values():
            wait_until(server.ready, timeout=timeout, what=f"{server.name} ready")
        wait_until(self._workers_connected, timeout=timeout, what="workers connected")
        wait_until(self._agents_online, timeout=timeout, what="agents online")

    def stop(self) -> None:
        """Stop everything gracefully: agents, workers, then coordinators."""
        for agent in self.agents.values():
            agent.stop()
        for worker in self.workers.values():
            worker.stop()
        for coordinator in self.coordinators.values():
            coordinator.stop()

    def leftovers(self) -> list[dict[str, Any]]:
        """Processes still running from the run's work directory after the stop."""
        found = []
        for proc in self._processes_under(self.root):
            try:
                found.append({"pid": proc.pid, "cmdline": " ".join(proc.cmdline()), "cwd": proc.cwd()})
            except psutil.Error:
                continue
        return found

    def spawn_records_left(self) -> list[str]:
        """Bare-metal record files still on disk whose process lives (docs/design/scaler.md §6.1)."""
        left = []
        for server in self.servers().values():
            for record in (server.home / "scaler" / "bare-metal").glob("*.json"):
                with contextlib.suppress(OSError, ValueError, KeyError):
                    if psutil.pid_exists(int(json.loads(record.read_text())["pid"])):
                        left.append(str(record))
        return left

    def close(self) -> None:
        """Kill whatever is still running (thawed first), stop the proxies, unmount the tmpfs homes."""
        targets: list[Server | Agent] = [
            *self.agents.values(),
            *self.workers.values(),
            *self.coordinators.values(),
        ]
        for target in targets:
            with contextlib.suppress(Exception):
                target.thaw()
                target.kill()
        for proc in self._processes_under(self.root):
            with contextlib.suppress(psutil.Error):
                proc.kill()
        for proxy in self.proxies.values():
            proxy.close()
        for home in self.tmpfs:
            # The nodes' logs live on the tmpfs: keep a copy beside the run's other files first.
            keep = self.root / f"{home.name}-logs"
            keep.mkdir(exist_ok=True)
            for log in [*home.glob("*.log"), *home.glob("scaler/logs/*.log")]:
                with contextlib.suppress(OSError):
                    shutil.copy2(log, keep / log.name)
            subprocess.run(["umount", "-l", str(home)], capture_output=True)

    @staticmethod
    def _processes_under(root: Path) -> list[psutil.Process]:
        """Live processes working in `root`, except the run's own PostgreSQL server (`root/pg`)."""
        database = root / "pg"
        found = []
        for proc in psutil.process_iter(["pid", "status"]):
            try:
                if proc.pid == os.getpid() or proc.info["status"] == psutil.STATUS_ZOMBIE:
                    continue
                cwd = Path(proc.cwd())
                if cwd.is_relative_to(root) and not cwd.is_relative_to(database):
                    found.append(proc)
            except (psutil.Error, OSError, ValueError):
                continue
        return found
