"""A cluster on one machine (docs/design/cluster.md §9): real `conveyor server` processes, free ports, own
homes.

Coordinators share the test's database; workers get `--role worker --coordinator URL,…` and a join
token made through the admin API. Timings are the fast ones of docs/design/cluster.md §9 (heartbeat 200 ms,
lease 1500/300 ms, settings cache 200 ms). `Cluster.close()` ends exactly the processes and proxies it
started.
"""

from __future__ import annotations

import signal
import socket
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx

from tests.support.http import HTTP
from tests.support.processes import ServerProcess, free_port
from tests.support.waiting import wait_until

FAST_CLUSTER = {
    "CONVEYOR_CLUSTER_HEARTBEAT_INTERVAL_MS": "200",
    "CONVEYOR_CLUSTER_PEER_STALE_BEATS": "3",
    "CONVEYOR_CLUSTER_LEASE_TTL_MS": "1500",
    "CONVEYOR_CLUSTER_LEASE_RENEW_MS": "300",
    "CONVEYOR_CLUSTER_SETTINGS_CACHE_TTL_MS": "200",
    "CONVEYOR_READY_CACHE_MS": "0",
}
# For tests about something other than peer liveness: 5 s of silence before a peer counts as stale,
# not the 600 ms above, so a heartbeat starved on a loaded machine does not drop a session the test is
# about to use (and, past the flap grace, send a held job elsewhere while its worker still runs it).
STEADY_PEERS = {"CONVEYOR_CLUSTER_PEER_STALE_BEATS": "25"}
SHARED_SECRET_KEY = "0f" * 32


class Node:
    """One `conveyor server` process of the cluster (coordinator or worker)."""

    def __init__(
        self,
        name: str,
        home: Path,
        *,
        role: str,
        database_url: str | None,
        env: Mapping[str, str],
        args: list[str],
    ) -> None:
        self.name = name
        self.home = home
        self.role = role
        self.database_url = database_url
        self.env = dict(env)
        self.args = list(args)
        self.port = free_port()
        self.process = self._spawn()

    def _spawn(self) -> ServerProcess:
        return ServerProcess(
            self.home, database_url=self.database_url, env=self.env, args=self.args, port=self.port
        )

    @property
    def url(self) -> str:
        """`http://127.0.0.1:<port>`."""
        return self.process.url

    def output(self) -> str:
        """Everything the process printed."""
        return self.process.output()

    def get(self, path: str, token: str | None = None) -> httpx.Response:
        """A GET, with an admin token when given."""
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return HTTP.get(self.url + path, headers=headers, timeout=10)

    def post(self, path: str, token: str, body: Any = None) -> httpx.Response:
        """A POST with an admin token."""
        return HTTP.post(self.url + path, json=body, headers={"Authorization": f"Bearer {token}"}, timeout=10)

    def wait_ready(self, timeout: float = 90) -> None:
        """Until `/ready` is 200 and `/cluster/health` answers (a condition with a deadline)."""
        self.process.wait_ready(timeout)
        wait_until(
            lambda: self.get("/cluster/health").status_code in (200, 503),
            timeout=timeout,
            what=f"{self.name} /cluster/health",
        )

    def health(self, token: str | None = None) -> dict[str, Any]:
        """The `/cluster/health` body."""
        body: dict[str, Any] = self.get("/cluster/health", token).json()
        return body

    def stop(self) -> None:
        """SIGTERM (thawed first), then wait; SIGKILL if it hangs."""
        self.process.signal(signal.SIGCONT)
        self.process.stop()

    def kill9(self) -> None:
        """SIGKILL."""
        self.process.kill()

    def freeze(self) -> None:
        """SIGSTOP: the sockets stay open while heartbeats go stale."""
        self.process.signal(signal.SIGSTOP)

    def thaw(self) -> None:
        """SIGCONT."""
        self.process.signal(signal.SIGCONT)

    def restart(self) -> None:
        """Stop and start again with the same home and port."""
        self.stop()
        self.process = self._spawn()


class LinkProxy:
    """A loopback TCP proxy in front of a node: `cut()` drops every connection and refuses new ones."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._cut = threading.Event()
        self._closed = threading.Event()
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        """The URL to dial instead of the node's."""
        return f"http://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self._cut.is_set():
                client.close()
                continue
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                self._sockets += [client, upstream]
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(source, sink), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            self._forward(source, sink)
        except OSError:
            pass
        finally:
            for end in (source, sink):
                try:
                    end.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def _forward(self, source: socket.socket, sink: socket.socket) -> None:
        """Copy one direction until `source` ends (a subclass may hold or cut bytes here); the pipe then
        shuts both ends down."""
        while data := source.recv(65536):
            sink.sendall(data)

    def _drop_all(self) -> None:
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    def cut(self) -> None:
        """Drop the link: every connection closes, new ones are refused until `restore()`."""
        self._cut.set()
        self._drop_all()

    def restore(self) -> None:
        """Let connections through again."""
        self._cut.clear()

    def close(self) -> None:
        """Stop the proxy."""
        self._closed.set()
        self._listener.close()
        self._drop_all()


class Cluster:
    """The nodes and proxies of one test."""

    def __init__(self, root: Path, database_url: str | None) -> None:
        self.root = root
        self.database_url = database_url
        self.nodes: list[Node] = []
        self.proxies: dict[tuple[str, str], LinkProxy] = {}
        self.owner_token: str | None = None

    def coordinator(self, name: str, *, database_url: str | None = None, **env: str) -> Node:
        """Start a coordinator on the cluster's database (its own SQLite file when there is none)."""
        environ = {
            **FAST_CLUSTER,
            "CONVEYOR_SECRET_KEY": SHARED_SECRET_KEY,
            "CONVEYOR_INSTANCE_ID": name,
            **env,
        }
        node = Node(
            name,
            self.root / name,
            role="coordinator",
            database_url=database_url or self.database_url,
            env=environ,
            args=[],
        )
        self.nodes.append(node)
        node.wait_ready()
        if self.owner_token is None:
            self.owner_token = node.process.owner_token()
        return node

    def join_token(self, via: Node, *, role: str = "worker", expires_in_ms: int | None = None) -> str:
        """A join token made through the admin API."""
        body: dict[str, Any] = {"role": role}
        if expires_in_ms is not None:
            body["expires_in_ms"] = expires_in_ms

        def made() -> httpx.Response | None:
            answer = via.post("/api/v1/admin/peers/join-tokens", self.token, body)
            # 503 `unavailable` changed nothing and says "try again" (a coordinator starting on a loaded
            # machine lost a pooled connection under it): what any client of the API does.
            return None if answer.status_code == 503 else answer

        answer = wait_until(made, timeout=30, what="a join token (the coordinator answered 503)")
        assert answer is not None
        assert answer.status_code == 201, answer.text
        return str(answer.json()["token"])

    @property
    def token(self) -> str:
        """The owner admin token of the cluster's database."""
        assert self.owner_token, "start a coordinator first"
        return self.owner_token

    def worker(
        self,
        name: str,
        coordinators: list[Node],
        *,
        join_token: str | None,
        via_proxy: bool = False,
        wait: bool = True,
        **env: str,
    ) -> Node:
        """Start a worker joined to `coordinators` (through a cuttable proxy per link if asked)."""
        urls = []
        for coordinator in coordinators:
            if via_proxy:
                proxy = LinkProxy(coordinator.port)
                self.proxies[(name, coordinator.name)] = proxy
                urls.append(proxy.url)
            else:
                urls.append(coordinator.url)
        environ = {**FAST_CLUSTER, "CONVEYOR_INSTANCE_ID": name, **env}
        if join_token:
            environ["CONVEYOR_CLUSTER_JOIN_TOKEN"] = join_token
        node = Node(
            name,
            self.root / name,
            role="worker",
            database_url=None,
            env=environ,
            args=["--role", "worker", "--coordinator", ",".join(urls)],
        )
        self.nodes.append(node)
        if wait:
            node.wait_ready()
        else:
            # A refused worker never gets ready, but it boots and listens: what follows (a refusal in its
            # log) is then timed from its start, not from the interpreter's imports on a loaded box.
            node.process.wait_listening()
        return node

    def cut_link(self, worker: Node, coordinator: Node) -> None:
        """Drop the link between a worker started `via_proxy` and one coordinator."""
        self.proxies[(worker.name, coordinator.name)].cut()

    def restore_link(self, worker: Node, coordinator: Node) -> None:
        """Let that link through again."""
        self.proxies[(worker.name, coordinator.name)].restore()

    def logs(self) -> str:
        """Every node's output, for a failing test's report."""
        return "\n".join(f"===== {n.name} ({n.role})\n{n.output()}" for n in self.nodes)

    def close(self) -> None:
        """Stop every node this cluster started (thawed first) and every proxy."""
        for node in reversed(self.nodes):
            try:
                node.stop()
            except Exception:
                node.kill9()
        for proxy in self.proxies.values():
            proxy.close()


def peers_by_id(node: Node, token: str) -> dict[str, dict[str, Any]]:
    """`GET /api/v1/admin/peers` of a coordinator, by instance id."""
    answer = node.get("/api/v1/admin/peers", token)
    assert answer.status_code == 200, answer.text
    return {item["instance_id"]: item for item in answer.json()["items"]}
