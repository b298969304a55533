"""A small FAKE cloud for the `event` scaler's provisioning workflow (examples/event_scaler_provisioning.py).

`POST /machines {name, labels, agent_command}` "boots a machine": it starts the agent command as its
own process (a new session, a child of this test process, so it lives outside the provisioning job's
process group that the runner ends with the job), with a home of its own. `DELETE /machines/{name}`
stops it. Requests need `Authorization: Bearer <token>`. It runs on a real socket (uvicorn in a
thread) so a real agent's step can call it.
"""

from __future__ import annotations

import signal
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import Body, FastAPI, Request
from fastapi.responses import JSONResponse, Response

from tests.support.processes import clean_environ, conveyor_command, free_port
from tests.support.waiting import wait_until


@dataclass
class Machine:
    """One machine the fake cloud booted."""

    name: str
    labels: list[str]
    command: list[str]
    proc: subprocess.Popen[bytes]
    log_path: Path
    deleted: bool = False

    def output(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


@dataclass
class FakeCloud:
    """The fake cloud API; machines' homes and logs go under `root`."""

    root: Path
    token: str = "cloud-token"
    machines: dict[str, Machine] = field(default_factory=dict)
    requests: list[tuple[str, str]] = field(default_factory=list)
    port: int = field(default_factory=free_port)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def app(self) -> FastAPI:
        app = FastAPI()

        def refused(request: Request) -> Response | None:
            self.requests.append((request.method, request.url.path))
            if request.headers.get("authorization") != f"Bearer {self.token}":
                return JSONResponse({"message": "unauthorized"}, status_code=401)
            return None

        @app.post("/machines")
        def create(request: Request, body: dict[str, Any] = Body(...)) -> Response:
            if (refusal := refused(request)) is not None:
                return refusal
            name, command = body.get("name"), body.get("agent_command")
            if (
                not isinstance(name, str)
                or not isinstance(command, list)
                or command[:2] != ["conveyor", "agent"]
            ):
                return JSONResponse({"message": "name and agent_command [conveyor, agent, …] required"}, 422)
            if name in self.machines:
                return JSONResponse({"message": "a machine with that name exists"}, 409)
            home = self.root / name
            home.mkdir(parents=True)
            log_path = self.root / f"{name}.log"
            with open(log_path, "wb") as log:
                proc = subprocess.Popen(
                    conveyor_command(*command[1:], "--home", str(home)),
                    env=clean_environ(),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    cwd=home,
                    start_new_session=True,
                )
            self.machines[name] = Machine(name, list(body.get("labels") or []), command, proc, log_path)
            return JSONResponse({"id": name, "status": "booting"}, status_code=201)

        @app.delete("/machines/{name}")
        def delete(name: str, request: Request) -> Response:
            if (refusal := refused(request)) is not None:
                return refusal
            machine = self.machines.get(name)
            if machine is None:
                return JSONResponse({"message": "no such machine"}, status_code=404)
            machine.deleted = True
            self._stop(machine)
            return Response(status_code=204)

        return app

    @staticmethod
    def _stop(machine: Machine) -> None:
        if machine.proc.poll() is None:
            machine.proc.send_signal(signal.SIGTERM)
            try:
                machine.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                machine.proc.kill()
                machine.proc.wait()

    def __enter__(self) -> FakeCloud:
        self.root.mkdir(parents=True, exist_ok=True)
        config = uvicorn.Config(
            self.app(), host="127.0.0.1", port=self.port, log_level="warning", lifespan="off"
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True)
        self._thread.start()
        wait_until(lambda: self._server.started, timeout=10, what="the fake cloud to start")
        return self

    def __exit__(self, *_: object) -> None:
        for machine in self.machines.values():
            self._stop(machine)
        self._server.should_exit = True
        self._thread.join(timeout=10)
