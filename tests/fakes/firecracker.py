"""A FAKE `firecracker` for the firecracker backend's tests: it speaks the API protocol, it runs no VM.

Started like the real binary (`firecracker --api-sock PATH --id VM_ID`), it serves the Firecracker HTTP API on
the unix socket (HTTP/1.1, keep-alive): `PUT /machine-config`, `/boot-source`, `/drives/<id>`,
`/network-interfaces/<id>`, `/mmds/config`, `/mmds`, `/actions` answer 204 (pre-boot-only resources answer 400
after `InstanceStart`, as the real one does), `GET /` answers the instance info. Every request is appended as one
JSON line `{"method", "path", "body"}` to the `--fake-calls` file. After `InstanceStart` it prints a few "serial
console" lines and stays alive like a VM until killed, or until `SendCtrlAltDel` (then it exits 0).

Fake-only flags (before the real ones; `install_fake_firecracker` writes a launcher that passes them):
`--fake-calls FILE`, `--fake-socket-delay-ms N` (open the socket late), `--fake-never-listen`,
`--fake-fail-put PATH` (answer 400 with a fault_message), `--fake-exit-early CODE`,
`--fake-ignore-ctrl-alt-del` (the guest ignores it, so only SIGKILL ends the VM).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import stat
import sys
from pathlib import Path
from typing import Any

PRE_BOOT_ONLY = ("/machine-config", "/boot-source", "/drives/", "/network-interfaces/", "/mmds/config")


def install_fake_firecracker(
    bin_dir: Path,
    calls: Path,
    *,
    socket_delay_ms: int = 0,
    never_listen: bool = False,
    fail_put: str | None = None,
    exit_early: int | None = None,
    ignore_ctrl_alt_del: bool = False,
) -> Path:
    """Write an executable `firecracker` launcher into `bin_dir` that runs this fake with the given behaviour."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    flags = ["--fake-calls", str(calls), "--fake-socket-delay-ms", str(socket_delay_ms)]
    if never_listen:
        flags.append("--fake-never-listen")
    if fail_put:
        flags += ["--fake-fail-put", fail_put]
    if exit_early is not None:
        flags += ["--fake-exit-early", str(exit_early)]
    if ignore_ctrl_alt_del:
        flags.append("--fake-ignore-ctrl-alt-del")
    launcher = bin_dir / "firecracker"
    quoted = " ".join(f"'{flag}'" for flag in flags)
    launcher.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{Path(__file__).resolve()}" {quoted} "$@"\n')
    launcher.chmod(launcher.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return launcher


def read_calls(calls: Path) -> list[dict[str, Any]]:
    """The recorded API requests, oldest first."""
    if not calls.exists():
        return []
    return [json.loads(line) for line in calls.read_text().splitlines() if line.strip()]


class FakeVmm:
    def __init__(self, options: argparse.Namespace) -> None:
        self.options = options
        self.started = False
        self.done = asyncio.Event()

    def record(self, method: str, path: str, body: Any) -> None:
        if self.options.fake_calls:
            with open(self.options.fake_calls, "a") as calls:
                calls.write(json.dumps({"method": method, "path": path, "body": body}) + "\n")

    def answer(self, method: str, path: str, body: Any) -> tuple[int, Any]:
        if method == "GET" and path == "/":
            state = "Running" if self.started else "Not started"
            return 200, {
                "id": self.options.id,
                "state": state,
                "vmm_version": "fake",
                "app_name": "Firecracker",
            }
        if method not in ("PUT", "PATCH"):
            return 400, {"fault_message": f"fake firecracker: unsupported {method} {path}"}
        if path == self.options.fake_fail_put:
            return 400, {"fault_message": f"fake failure of {path}"}
        if self.started and path.startswith(PRE_BOOT_ONLY):
            return 400, {
                "fault_message": "The requested operation is not supported after starting the microVM."
            }
        if path == "/actions":
            action = (body or {}).get("action_type")
            if action == "InstanceStart":
                if self.started:
                    return 400, {"fault_message": "The microVM is already running."}
                self.started = True
                print(f"[fake guest {self.options.id}] Linux version 6.1 (fake)", flush=True)
                print(f"[fake guest {self.options.id}] conveyor agent starting", flush=True)
            elif action == "SendCtrlAltDel":
                if not self.started:
                    return 400, {"fault_message": "The microVM is not running."}
                if not self.options.fake_ignore_ctrl_alt_del:
                    print(f"[fake guest {self.options.id}] reboot: Restarting system", flush=True)
                    asyncio.get_running_loop().call_later(0.05, self.done.set)
            else:
                return 400, {"fault_message": f"unknown action {action}"}
        return 204, None

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {
                    k.strip().lower(): v.strip()
                    for k, v in (ln.split(":", 1) for ln in lines[1:] if ":" in ln)
                }
                raw = await reader.readexactly(int(headers.get("content-length", "0")))
                body = json.loads(raw) if raw else None
                self.record(method, path, body)
                status, answer = self.answer(method, path, body)
                payload = json.dumps(answer).encode() if answer is not None else b""
                reason = {200: "OK", 204: "No Content", 400: "Bad Request"}[status]
                response = f"HTTP/1.1 {status} {reason}\r\nServer: Firecracker API\r\n"
                if payload:
                    response += f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n"
                writer.write(response.encode() + b"\r\n" + payload)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


async def main(options: argparse.Namespace) -> int:
    print(f"fake firecracker {options.id}: api socket {options.api_sock}", flush=True)
    if options.fake_exit_early is not None:
        print(f"fake firecracker {options.id}: exiting early with {options.fake_exit_early}", flush=True)
        return int(options.fake_exit_early)
    vmm = FakeVmm(options)
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, vmm.done.set)
    if options.fake_never_listen:
        await vmm.done.wait()
        return 0
    await asyncio.sleep(options.fake_socket_delay_ms / 1000)
    server = await asyncio.start_unix_server(vmm.serve, path=options.api_sock)
    async with server:
        await vmm.done.wait()
    return 0


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="firecracker (fake)")
    parser.add_argument("--api-sock", required=True)
    parser.add_argument("--id", required=True)
    parser.add_argument("--fake-calls")
    parser.add_argument("--fake-socket-delay-ms", type=int, default=0)
    parser.add_argument("--fake-never-listen", action="store_true")
    parser.add_argument("--fake-fail-put")
    parser.add_argument("--fake-exit-early", type=int)
    parser.add_argument("--fake-ignore-ctrl-alt-del", action="store_true")
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse(sys.argv[1:]))))
