"""Latency: webhook POST → first step running, on a connected agent and on a cold bare-metal spawn.

(a) Connected agent: a real `conveyor server`, a `git` source (HMAC-signed Gitea-style pushes) whose
origin is a real repository, and one real `conveyor agent` process already connected. Each push is
a new commit; the clock starts right before the webhook POST and stops at the `started_at` the
orchestrator recorded for the job's first user step (`kind == "step"`, after the `setup` step that
checks out the repository), read back through the admin API. Pushes are sequential: each run
finishes before the next push, so the agent is idle when the webhook arrives. The time to the job's
`setup` step (dispatch + runner start) is printed too, to show where the time goes.

(b) Cold bare-metal spawn: the same measurement with no agent running; the server's auto-scaler
(a `bare-metal` scaler in scalers.yaml, label set `linux`) starts a fresh ephemeral `conveyor agent`
process for each job, so every push pays the agent's start and registration. Printed as n/a when
the scaler is not in this checkout.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from bench.harness import (
    Report,
    Server,
    arguments,
    clean_environ,
    conveyor_command,
    finish,
    fresh_database,
    make_repo,
    new_commit,
    percentile,
    running_server,
    stop_process,
    wait_until,
    workdir,
)
from bench.harness import selected_dialects as chosen_dialects
from conveyor.ingest.signatures import hmac_hex

SECRET = "bench-latency-secret"
WORKFLOW = """
from conveyor import push, workflow

ci = workflow("ci", on=[push(branches=["main"])])

@ci.job(runs_on=["linux"])
def build(ctx):
    ctx.sh(["sh", "-c", "date +%s.%N >> MARKER"])
"""
P50_TARGET_MS = 100.0
# The pause after one push's run ended and before the next push, for Conveyor and the Buildbot peer alike:
# each webhook meets an idle system, as pushes seconds apart do (the agent has its next runner ready).
# `--gap-ms 0` measures back-to-back pushes instead.
PUSH_GAP_S = 0.5
COLD_P50_TARGET_MS = 1000.0


class Pusher:
    """Pushes commits to the origin and posts the matching webhook; reads back the step times."""

    def __init__(self, server: Server, origin: Path, source_id: str) -> None:
        self.server = server
        self.origin = origin
        self.source_id = source_id
        self.before = "0" * 40
        self.http = httpx.Client(base_url=server.url, timeout=30)
        self.answered = datetime.now(UTC)  # when the last webhook's 202 arrived

    def push(self, index: int) -> tuple[float, str]:
        """A new commit and its webhook; (wall-clock start, delivery row id)."""
        sha = new_commit(self.origin, f"bench push {index}")
        payload = {
            "ref": "refs/heads/main",
            "before": self.before,
            "after": sha,
            "repository": {"full_name": "bench/app"},
            "commits": [],
        }
        self.before = sha
        body = httpx.Request("POST", "/", json=payload).content
        headers = {
            "Content-Type": "application/json",
            "X-Gitea-Event": "push",
            "X-Gitea-Signature": hmac_hex(SECRET, body),
        }
        started = time.time()
        answer = self.http.post(f"/webhooks/{self.source_id}", content=body, headers=headers)
        self.answered = datetime.fromtimestamp(time.time(), UTC)
        if answer.status_code != 202:
            raise RuntimeError(f"webhook answered {answer.status_code}: {answer.text}")
        return started, str(answer.json()["delivery"])

    def run_of(self, delivery: str, timeout: float) -> str:
        """The run the delivery created."""

        def found() -> str | None:
            row = self.server.api_ok("GET", f"/deliveries/{delivery}")
            if row["status"] not in ("received", "processed"):
                raise RuntimeError(f"delivery {delivery}: {row['status']} {row.get('error')}")
            return row["runs"][0] if row["runs"] else None

        return wait_until(found, timeout=timeout, what="the push's run", poll=0.05)

    def step_times(self, run_id: str, delivery: str, timeout: float) -> dict[str, datetime]:
        """When the 202 arrived, the delivery was processed, the run was created, its job started, its setup
        step started and ended, its first user step started, and the run ended."""

        def finished() -> dict[str, Any] | None:
            run = self.server.api_ok("GET", f"/runs/{run_id}")
            if run["status"] in ("failed", "cancelled"):
                raise RuntimeError(f"run {run_id} {run['status']}: {run.get('reason')}")
            return run if run["status"] == "success" else None

        run = wait_until(finished, timeout=timeout, what=f"run {run_id} to succeed", poll=0.05)
        job = self.server.api_ok("GET", f"/runs/{run_id}/jobs")["items"][0]
        setup = next(s for s in job["steps"] if s["kind"] == "setup")
        first = next(s for s in job["steps"] if s["kind"] == "step")
        processed = self.server.api_ok("GET", f"/deliveries/{delivery}").get("processed_at")
        return {
            "202": self.answered,
            **({"delivery processed": _parse(processed)} if processed else {}),
            "run created": _parse(run["created_at"]),
            "job started": _parse(job["started_at"]),
            "setup step": _parse(setup["started_at"]),
            "setup done": _parse(setup["finished_at"]),
            "first step": _parse(first["started_at"]),
            "run success": _parse(run["finished_at"]),
        }

    def close(self) -> None:
        """Close the HTTP client."""
        self.http.close()


def _parse(value: str) -> datetime:
    parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def agent_process(server: Server, home: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """A real `conveyor agent` connected to `server` (waits until it is registered)."""
    token = server.agent_token(["linux"])
    home.mkdir(parents=True, exist_ok=True)
    log = open(home.parent / f"{home.name}.log", "ab")
    proc = subprocess.Popen(
        conveyor_command("agent", "--url", server.ws_url, "--labels", "linux", "--home", str(home)),
        env=clean_environ({"CONVEYOR_AGENT_TOKEN": token, **(env or {})}),
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )

    def connected() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"agent exited with {proc.returncode}")
        items = server.api_ok("GET", "/agents")["items"]
        return any(a.get("state") in ("connected", "online", "idle") for a in items)

    wait_until(connected, timeout=60, what="the agent to connect", poll=0.1)
    return proc


@dataclass
class Latencies:
    """Milliseconds from the webhook POST, one entry per measured push."""

    to_step: list[float] = field(default_factory=list)
    to_shell: list[float] = field(default_factory=list)
    stages: dict[str, list[float]] = field(default_factory=dict)

    def breakdown(self) -> str:
        """p50 from the POST to each intermediate moment, in order."""
        return ", ".join(f"{name} {percentile(values, 50):.0f}" for name, values in self.stages.items())


def read_marker(path: Path, count: int) -> float | None:
    """The `count`-th timestamp the first shell command wrote (None until it exists)."""
    if not path.exists():
        return None
    lines = path.read_text().split()
    return float(lines[count - 1]) if len(lines) >= count else None


def wait_marker(path: Path, count: int, timeout: float = 30) -> float:
    """Until the first shell command wrote its `count`-th timestamp; that timestamp."""
    return wait_until(lambda: read_marker(path, count), timeout=timeout, what="the marker line")


@contextmanager
def connected_agent(
    server: Server, home: Path, env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """A connected real agent for the duration of the block."""
    proc = agent_process(server, home, env)
    try:
        yield proc
    finally:
        stop_process(proc)


SCALERS_YAML = {
    "version": 1,
    "scalers": [
        {
            "name": "local",
            "type": "bare-metal",
            "max_agents": 2,
            "terminate_grace_s": 5,
            "label_sets": [{"labels": ["linux"]}],
        }
    ],
}


def end_leftovers(root: Path) -> None:
    """Safety net after a cold-spawn server stopped: end processes still running from `root`."""
    import psutil

    for proc in psutil.process_iter(["pid", "cwd", "cmdline"]):
        try:
            cmdline = " ".join(proc.info["cmdline"] or [])
            if str(root) in (proc.info["cwd"] or "") or str(root) in cmdline:
                proc.kill()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue


def measure_conveyor(
    dialect: str,
    base: Path,
    *,
    pushes: int,
    label: str,
    cold: bool = False,
    gap_s: float = PUSH_GAP_S,
    agent_env: dict[str, str] | None = None,
) -> Latencies:
    """Sequential pushes on one server; the first (warm-up) is not counted.

    `cold`: no agent runs; the server's `bare-metal` auto-scaler starts one per job.
    """
    marker = base / f"marker-{dialect}-{label}.txt"
    home = base / f"home-{dialect}-{label}"
    env: dict[str, str] = {}
    if cold:
        config = base / f"scalers-{dialect}-{label}.yaml"
        config.write_text(json.dumps(SCALERS_YAML))  # JSON is YAML
        env = {"CONVEYOR_SCALER_CONFIG": str(config)}
    try:
        with (
            fresh_database(dialect, base) as database_url,
            running_server(home, database_url, env) as server,
        ):
            return _pushes(
                server,
                base,
                marker,
                dialect=dialect,
                label=label,
                pushes=pushes,
                cold=cold,
                gap_s=gap_s,
                agent_env=agent_env,
            )
    finally:
        if cold:
            end_leftovers(home)


def _pushes(
    server: Server,
    base: Path,
    marker: Path,
    *,
    dialect: str,
    label: str,
    pushes: int,
    cold: bool,
    gap_s: float,
    agent_env: dict[str, str] | None,
) -> Latencies:
    """Sequential pushes and their stage timestamps."""
    origin = make_repo(base / f"origin-{dialect}-{label}", {"ci": WORKFLOW.replace("MARKER", str(marker))})
    source_id = server.api_ok(
        "POST",
        "/sources",
        json={
            "kind": "git",
            "name": "bench-app",
            "repo": "bench/app",
            "clone_url": f"file://{origin}",
            "webhook_secret": SECRET,
            "signature_header": "X-Gitea-Signature",
        },
    )["id"]
    pusher = Pusher(server, origin, source_id)
    result = Latencies()
    try:
        with nullcontext() if cold else connected_agent(server, base / f"agent-{dialect}-{label}", agent_env):
            for index in range(pushes + 1):
                started, delivery = pusher.push(index)
                run_id = pusher.run_of(delivery, timeout=60)
                moments = pusher.step_times(run_id, delivery, timeout=120)
                shell_at = wait_marker(marker, index + 1)
                time.sleep(gap_s)  # not synchronisation: the pause between pushes (PUSH_GAP_S)
                if index == 0:
                    continue
                for name, moment in moments.items():
                    result.stages.setdefault(name, []).append((moment.timestamp() - started) * 1000)
                result.to_step.append((moments["first step"].timestamp() - started) * 1000)
                result.to_shell.append((shell_at - started) * 1000)
    finally:
        pusher.close()
    return result


def scaler_missing() -> str | None:
    """Why the cold-spawn figure cannot be measured (None when the bare-metal scaler is there)."""
    try:
        __import__("conveyor.scaler.bare_metal")
        __import__("conveyor.scaler.manager")
    except ImportError:
        return "scaler not available"
    return None


def record(report: Report, name: str, result: Latencies, *, pushes: int, target_ms: float) -> None:
    """p50 (against the target), the stage breakdown, p90, p99 and the shell-command p50."""
    p50, p90, p99 = (percentile(result.to_step, p) for p in (50, 90, 99))
    report.add(
        f"{name}: webhook -> first step running p50",
        p50,
        "ms",
        target=f"<= {target_ms:.0f} ms",
        met=p50 <= target_ms,
        note=f"{pushes} pushes",
    )
    report.add(f"{name}: p50 ms from the POST to each stage", p50, "ms", note=result.breakdown())
    report.add(
        f"{name}: webhook -> run success p50",
        percentile(result.stages["run success"], 50),
        "ms",
        note="the run's finished_at",
    )
    report.add(f"{name}: p90", p90, "ms")
    report.add(f"{name}: p99", p99, "ms")
    report.add(
        f"{name}: webhook -> shell command executing p50",
        percentile(result.to_shell, 50),
        "ms",
        note="timestamp written by the step's own command",
    )


def main() -> None:
    parser = arguments(__doc__ or "")
    parser.add_argument("--pushes", type=int, help="pushes measured per database (default 50, --quick 5)")
    parser.add_argument("--no-cold", action="store_true", help="skip the cold bare-metal spawn figure")
    parser.add_argument(
        "--gap-ms", type=int, default=500, help="pause between a run's end and the next push (default 500)"
    )
    parser.add_argument(
        "--no-mirror",
        action="store_true",
        help="the connected agent checks out without its mirror (a baseline)",
    )
    args = parser.parse_args()
    gap_s = args.gap_ms / 1000
    agent_env = {"CONVEYOR_AGENT_MIRROR_MAX_BYTES": "0"} if args.no_mirror else None
    pushes = args.pushes or (5 if args.quick else 50)
    report = Report("latency")
    missing = None if args.no_cold else scaler_missing()
    with workdir() as base:
        for dialect in chosen_dialects(args):
            print(f"latency on {dialect}: {pushes} pushes, connected agent", flush=True)
            result = measure_conveyor(
                dialect, base, pushes=pushes, label="connected", gap_s=gap_s, agent_env=agent_env
            )
            record(
                report, f"latency {dialect} connected agent", result, pushes=pushes, target_ms=P50_TARGET_MS
            )
            if args.no_cold or missing is not None:
                continue
            print(f"latency on {dialect}: {pushes} pushes, cold bare-metal spawn", flush=True)
            result = measure_conveyor(dialect, base, pushes=pushes, label="cold", cold=True, gap_s=gap_s)
            record(
                report, f"latency {dialect} cold spawn", result, pushes=pushes, target_ms=COLD_P50_TARGET_MS
            )
        if missing is not None:
            report.add(
                "latency cold bare-metal spawn: webhook -> first step p50",
                None,
                "ms",
                target=f"<= {COLD_P50_TARGET_MS:.0f} ms",
                note=f"n/a ({missing})",
            )
    finish(report, args)


if __name__ == "__main__":
    main()
