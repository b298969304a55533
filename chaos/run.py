"""One chaos run, start to verdict: cluster up, load and faults for the duration, heal, quiesce, read the
final database, stop, look for leftovers, check, report."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TextIO

from chaos.checker import History, Violation, check, redispatched_jobs, render
from chaos.cluster import ChaosCluster
from chaos.injector import Injector
from chaos.load import LoadGenerator, Mix
from chaos.postgres import private_server, server_binaries
from chaos.recorder import Recorder
from chaos.schedule import FaultKind, Targets, count_by_kind, plan_faults
from chaos.snapshot import final_state, read_rows, unquiet
from tests.support.postgres import create_database, drop_database, new_database_name


@dataclass
class Options:
    """What a run does (the command line's flags)."""

    duration_s: float = 60.0
    seed: int = 1
    rate: float = 20.0
    mean_gap_s: float = 6.0
    quiesce_s: float = 300.0
    keep: bool = False
    tmpfs: bool = True
    workdir: Path | None = None
    mix: Mix = field(default_factory=Mix)
    # `private`: a PostgreSQL server of the run's own (chaos/postgres.py); `shared`: the one
    # CONVEYOR_TEST_DATABASE_URL names, where the run creates and drops a database.
    # Seeds of the replay list run after the main seed on the same cluster: (seed, seconds).
    replays: tuple[tuple[int, float], ...] = ()
    postgres: str = field(default_factory=lambda: "private" if server_binaries() else "shared")


@dataclass
class Outcome:
    """The verdict and the figures of the summary line."""

    violations: list[Violation]
    faults: dict[str, int]
    webhooks: int
    acknowledged: int
    runs: int
    jobs: int
    events: int
    report: str

    def summary(self) -> str:
        """`412 faults, 18,034 webhooks, 0 violations`."""
        return f"{sum(self.faults.values()):,} faults, {self.webhooks:,} webhooks, {len(self.violations):,} violations"


def run(options: Options, out: TextIO = sys.stdout) -> Outcome:
    """Carry out one run and return its outcome (the report is printed to `out` as it goes)."""

    def say(text: str) -> None:
        print(text, file=out, flush=True)

    root = Path(tempfile.mkdtemp(prefix=f"chaos-{options.seed}-", dir=options.workdir))
    root.chmod(0o755)  # a private server runs as `postgres` and keeps its directory in here
    with contextlib.ExitStack() as stack:
        if options.postgres == "private":
            url = stack.enter_context(private_server(root))
            stack.enter_context(_environment("CONVEYOR_TEST_DATABASE_URL", url))
            say(f"chaos: a private PostgreSQL at {url}")
        outcome = _run(options, root, say)
    if options.keep or outcome.violations:
        say(f"chaos: kept {root}")
    else:
        shutil.rmtree(root, ignore_errors=True)
    return outcome


@contextlib.contextmanager
def _environment(name: str, value: str) -> Iterator[None]:
    previous = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = previous


def _run(options: Options, root: Path, say: Callable[[str], None]) -> Outcome:
    database = new_database_name("chaos_")
    database_url = create_database(database)
    history = History(seed=options.seed, started_at=time.time())
    recorder = Recorder(history, root / "history.jsonl")
    cluster = ChaosCluster(root, database_url, database, use_tmpfs=options.tmpfs)
    say(
        f"chaos: seed {options.seed}, {options.duration_s:.0f} s at {options.rate:g} webhooks/s; work directory {root}"
    )
    try:
        cluster.start()
        if cluster.tmpfs_refusal:
            say(f"chaos: disk-full faults skipped: {cluster.tmpfs_refusal}")
        say(
            "chaos: no clock jumps: the code reads the clock in many places (and PostgreSQL's now()), not through one"
        )
        load = LoadGenerator(cluster, recorder, root, rate=options.rate, seed=options.seed, mix=options.mix)
        load.setup()
        targets = Targets(
            coordinators=sorted(cluster.coordinators),
            workers=sorted(cluster.workers),
            agents=sorted(cluster.agents),
            links=sorted(cluster.proxies),
            disks=[name for name, server in sorted(cluster.workers.items()) if server.home in cluster.tmpfs],
        )
        kinds = [k for k in FaultKind if k is not FaultKind.DISK_FULL or targets.disks]
        schedule = plan_faults(
            options.seed, options.duration_s, targets, mean_gap_s=options.mean_gap_s, kinds=kinds
        )
        # Replayed seeds follow on the same cluster, each its schedule's first `seconds` (chaos/replay.py).
        start = options.duration_s
        for seed, seconds in options.replays:
            phase = plan_faults(
                seed, seconds, targets, mean_gap_s=options.mean_gap_s, kinds=kinds, warmup_s=1.0
            )
            schedule += [replace(f, at=f.at + start) for f in phase]
            start += seconds
        history.schedule = [f.as_record() for f in schedule]
        (root / "schedule.json").write_text(json.dumps(history.schedule, indent=1))
        # The schedule's clock starts now: t = 0 is when load and faults begin.
        offset = recorder.now()
        history.started_at = time.time() - offset
        schedule = [replace(f, at=f.at + offset) for f in schedule]
        history.schedule = [f.as_record() for f in schedule]
        injector = Injector(cluster, schedule, recorder, options.seed)
        load.start()
        injector.start()
        end = time.monotonic() + options.duration_s + sum(seconds for _, seconds in options.replays)
        while (left := end - time.monotonic()) > 0:
            time.sleep(min(left, 30))
            say(
                f"chaos: t={recorder.now() - offset:.0f}s {len(injector.done)} faults, {load.sent:,} webhooks sent"
                + (f", {load.shed:,} shed" if load.shed else "")
            )
        load.stop()
        injector.stop()
        say("chaos: load stopped, healing the cluster")
        cluster.heal()
        cluster.wait_healthy()
        load.retire_cron()
        load.close()
        quiet = _quiesce(cluster, database_url, options.quiesce_s, say)
        workers = _connected_workers(cluster)
        rows = read_rows(database_url)
        cluster.stop()
        state = final_state(rows, workers_connected=workers)
        state.leaked_processes = cluster.leftovers()
        state.spawn_records_left = cluster.spawn_records_left()
        history.ledger = _read_ledger(load.ledger)
        violations = check(history, state)
        if not quiet:
            say("chaos: the cluster did not quiesce in time; the checker judges what is still in motion")
        faults = count_by_kind(injector.done)
        acknowledged = sum(1 for r in history.webhooks() if r.get("answer") in ("accepted", "duplicate"))
        outcome = Outcome(
            violations=violations,
            faults=faults,
            webhooks=load.sent,
            acknowledged=acknowledged,
            runs=len(state.runs),
            jobs=len(state.jobs),
            events=len(state.events),
            report=render(history, violations) if violations else "",
        )
        say("chaos: faults by kind: " + ", ".join(f"{k} {n}" for k, n in faults.items()))
        say(
            f"chaos: checked {acknowledged:,} acknowledged webhooks, {len(state.deliveries):,} deliveries, "
            f"{outcome.runs:,} runs, {outcome.jobs:,} jobs, {outcome.events:,} events, "
            f"{len(history.ledger):,} step executions"
        )
        say(
            f"chaos: {redispatched_jobs(history):,} jobs ran again elsewhere after being taken back before "
            "their start was recorded (allowed: docs/design/execution.md §5)"
        )
        if violations:
            (root / "report.txt").write_text(outcome.report)
            say(outcome.report)
        say(outcome.summary())
        return outcome
    finally:
        recorder.close()
        cluster.close()
        drop_database(database)


def _quiesce(cluster: ChaosCluster, database_url: str, timeout_s: float, say: Any) -> bool:
    """Until nothing is in motion (deliveries, runs, events, queue, spawns, spawned processes) or timeout."""
    deadline = time.monotonic() + timeout_s
    last_report = 0.0
    while time.monotonic() < deadline:
        try:
            moving = unquiet(database_url)
        except Exception as exc:  # the database is shared with other engineers' tests: retry
            moving = {"database": 1, "error": repr(exc)}  # type: ignore[dict-item]
        spawned = len(cluster.spawned_agents())
        if spawned:
            moving["spawned agent processes"] = spawned
        if not moving:
            return True
        if time.monotonic() - last_report > 15:
            say(f"chaos: waiting for quiescence: {moving}")
            last_report = time.monotonic()
        time.sleep(1)
    return False


def _connected_workers(cluster: ChaosCluster) -> set[str]:
    try:
        peers = cluster.admin("GET", "/peers").json()["items"]
    except Exception:
        return set()
    return {p["instance_id"] for p in peers if p["connected"] and p.get("role") == "worker"}


def _read_ledger(path: Path) -> list[dict[str, Any]]:
    entries = []
    for line in path.read_text().splitlines():
        try:
            entries.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line cut by a kill mid-write counts as no execution record
    return entries


def environment_check() -> str | None:
    """Why a run cannot start here (None when it can)."""
    if sys.platform != "linux":
        return "the chaos harness needs Linux (process groups, /proc, tmpfs)"
    if not os.environ.get("CONVEYOR_TEST_DATABASE_URL", "postgresql://"):
        return "set CONVEYOR_TEST_DATABASE_URL"
    return None
