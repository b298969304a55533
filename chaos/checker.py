"""The invariants of a chaos run, checked over the recorded history and the final database (pure).

Every function here takes plain values (`History`, `FinalState`) and returns violations, so each
invariant is tested on hand-made histories (`tests/unit/chaos/test_chaos_checker.py`) without a cluster.
What the invariants mean in the product is in docs/design/execution.md §1, §4, §5, §8.4, §9,
docs/design/events.md §2.3 and docs/design/scaler.md §6.1, §7.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

RUN_TERMINAL = frozenset({"success", "failed", "cancelled"})
JOB_TERMINAL = frozenset({"success", "failed", "cancelled", "skipped", "timed_out"})
DELIVERY_OUTCOMES = frozenset({"processed", "ignored", "lock_missing", "lock_invalid"})
BLOCKED_ON = frozenset({"needs", "max_parallel", "concurrency"})


@dataclass(frozen=True)
class Violation:
    """One broken invariant: which, about what, why, and when (seconds after the start) if known."""

    invariant: str
    subject: str
    detail: str
    at: float | None = None

    def line(self) -> str:
        """`[invariant] subject: detail`."""
        return f"[{self.invariant}] {self.subject}: {self.detail}"


@dataclass
class History:
    """What the harness did and saw, in order: webhooks and their answers, faults, cancels.

    `records` are dicts with `t` (seconds after the start) and `type` (`webhook`, `fault`, `cancel`,
    `note`); `ledger` holds one entry per executed step attempt, written by the step itself
    (`{job, step, ws, max}`: job id, step name, the workspace it ran in (its path and an id of that
    directory's lifetime: an agent that gets a job back runs it in a fresh directory at the same path), its
    allowed attempts).
    """

    seed: int
    started_at: float  # epoch seconds of t = 0
    records: list[dict[str, Any]] = field(default_factory=list)
    ledger: list[dict[str, Any]] = field(default_factory=list)
    schedule: list[dict[str, Any]] = field(default_factory=list)

    def webhooks(self) -> list[dict[str, Any]]:
        """The webhook records."""
        return [r for r in self.records if r["type"] == "webhook"]


@dataclass
class FinalState:
    """The database and the host after the run, as plain rows (times as epoch seconds or None)."""

    sources: dict[str, str] = field(default_factory=dict)  # name -> id
    deliveries: list[dict[str, Any]] = field(default_factory=list)
    runs: list[dict[str, Any]] = field(default_factory=list)
    jobs: list[dict[str, Any]] = field(default_factory=list)
    steps: list[dict[str, Any]] = field(default_factory=list)
    finishes: list[dict[str, Any]] = field(default_factory=list)  # run_timeline `job.finished` rows
    queue: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    logs: list[dict[str, Any]] = field(default_factory=list)  # job_logs without their data
    spawns: list[dict[str, Any]] = field(default_factory=list)  # open scaler_spawns rows
    agents_online: set[str] = field(default_factory=set)
    workers_connected: set[str] = field(default_factory=set)
    leaked_processes: list[dict[str, Any]] = field(default_factory=list)  # left after the stop
    spawn_records_left: list[str] = field(default_factory=list)  # bare-metal record files left


Check = Callable[[History, FinalState], list[Violation]]


def check_webhooks(history: History, state: FinalState) -> list[Violation]:
    """Every acknowledged webhook became exactly one delivery, processed to its outcome, with the runs
    its event should start (docs/design/execution.md §1, §2)."""
    found: list[Violation] = []
    rows = {(d["source_id"], d["delivery_id"]): d for d in state.deliveries}
    runs_by_delivery: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for run in state.runs:
        if run.get("delivery_id"):
            runs_by_delivery[run["delivery_id"]].append(run)
    seen: set[tuple[str, str]] = set()
    for hook in history.webhooks():
        if hook.get("answer") not in ("accepted", "duplicate"):
            continue  # never acknowledged: the sender owns the retry, nothing is owed
        source_id = state.sources.get(hook["source"], hook["source"])
        key = (source_id, hook["delivery_id"])
        subject = f"webhook {hook['source']}/{hook['delivery_id']}"
        row = rows.get(key)
        if row is None:
            found.append(
                Violation("acked-webhook-stored", subject, "acknowledged but no delivery row", hook["t"])
            )
            continue
        if hook.get("delivery") and hook["delivery"] != row["id"]:
            found.append(
                Violation(
                    "acked-webhook-stored",
                    subject,
                    f"acknowledged as delivery {hook['delivery']} but stored as {row['id']}",
                    hook["t"],
                )
            )
        if key in seen:
            continue  # a resend: the first acknowledgement's checks cover the row
        seen.add(key)
        if row["status"] not in DELIVERY_OUTCOMES:
            found.append(
                Violation(
                    "delivery-processed",
                    subject,
                    f"delivery {row['id']} ended {row['status']!r} (attempts {row.get('attempts')}, "
                    f"error {row.get('error')!r})",
                    hook["t"],
                )
            )
            continue
        expected = hook.get("expect")
        if expected is None:
            continue
        workflows = Counter(r["workflow"] for r in runs_by_delivery.get(row["id"], []))
        if any(n > 1 for n in workflows.values()):
            found.append(
                Violation("one-run-per-workflow", subject, f"runs per workflow {dict(workflows)}", hook["t"])
            )
        if set(workflows) != set(expected):
            found.append(
                Violation(
                    "delivery-runs",
                    subject,
                    f"expected runs of {sorted(expected)}, found {sorted(workflows)}",
                    hook["t"],
                )
            )
    return found


def check_runs_ended(history: History, state: FinalState) -> list[Violation]:
    """Every run ended, or is legitimately still going: each of its unfinished jobs is held for a
    reason or runs on a live agent (docs/design/execution.md §4, §8.4)."""
    jobs_by_run: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for job in state.jobs:
        jobs_by_run[job["run_id"]].append(job)
    found: list[Violation] = []
    for run in state.runs:
        if run["status"] in RUN_TERMINAL:
            unfinished = [j for j in jobs_by_run[run["id"]] if j["status"] not in JOB_TERMINAL]
            if unfinished:
                found.append(
                    Violation(
                        "run-ended",
                        f"run {run['id']}",
                        f"run {run['status']} with unfinished jobs "
                        + ", ".join(f"{j['name']}={j['status']}" for j in unfinished),
                        _t(history, run.get("created_at")),
                    )
                )
            continue
        stuck = [
            f"{j['name']}={j['status']}: {why}"
            for j in jobs_by_run[run["id"]]
            if (why := _not_legitimate(j, state)) is not None
        ]
        if stuck or not jobs_by_run[run["id"]]:
            found.append(
                Violation(
                    "run-ended",
                    f"run {run['id']} ({run['workflow']})",
                    f"still {run['status']}: " + ("; ".join(stuck) or "no jobs"),
                    _t(history, run.get("created_at")),
                )
            )
    return found


def _not_legitimate(job: dict[str, Any], state: FinalState) -> str | None:
    """Why an unfinished job is not legitimately unfinished (None when it is, or is terminal)."""
    status = job["status"]
    if status in JOB_TERMINAL:
        return None
    if status == "pending":
        return (
            None if job.get("blocked_on") in BLOCKED_ON else f"pending, blocked_on {job.get('blocked_on')!r}"
        )
    queued = {q["job_id"]: q for q in state.queue}
    if status == "queued":
        return None if job["id"] in queued else "queued without a queue row"
    if status in ("dispatched", "running", "cancelling"):
        if job.get("rerouted_to"):
            return None if job["rerouted_to"] in state.workers_connected else "its worker is not connected"
        return None if job.get("agent_id") in state.agents_online else f"agent {job.get('agent_id')} is gone"
    return f"{status} at the end of the run"  # recovering: its agent is lost, the grace must have ended it


def check_held_jobs(history: History, state: FinalState) -> list[Violation]:
    """Every held (pending) job is held for a recorded reason that still applies (docs/design/execution.md
    §2 "Needs parking", §8.1)."""
    jobs = {j["id"]: j for j in state.jobs}
    by_run_name: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for job in state.jobs:
        by_run_name[(job["run_id"], job["name"])].append(job)
    found: list[Violation] = []
    for job in jobs.values():
        if job["status"] != "pending":
            continue
        subject = f"job {job['id']} ({job['name']})"
        if job.get("blocked_on") not in BLOCKED_ON:
            found.append(
                Violation("held-for-a-reason", subject, f"pending with blocked_on {job.get('blocked_on')!r}")
            )
            continue
        if job["blocked_on"] == "needs":
            upstreams = job.get("needs") or []
            if upstreams and all(
                all(u["status"] in JOB_TERMINAL for u in by_run_name[(job["run_id"], name)])
                and by_run_name[(job["run_id"], name)]
                for name in upstreams
            ):
                found.append(
                    Violation(
                        "held-for-a-reason",
                        subject,
                        f"held on needs {upstreams}, which have all ended",
                        _t(history, job.get("created_at")),
                    )
                )
    return found


def check_no_double_success(history: History, state: FinalState) -> list[Violation]:
    """No job ended twice (two `job.finished` timeline entries) or reached `success` twice, no step ran in
    one workspace more often than its attempts allow, and no step of a job ran after the job's success was
    recorded (the issue's invariant). A job taken back before its `job.started` was recorded may run again
    elsewhere, by design (docs/design/execution.md §5): `redispatched_jobs` counts those for the summary."""
    found: list[Violation] = []
    finishes: dict[str, list[str]] = defaultdict(list)
    succeeded_at: dict[str, float] = {}
    for row in state.finishes:
        finishes[row["job_id"]].append(row["status"])
        at = row.get("at")
        if row["status"] == "success" and at is not None:
            succeeded_at[row["job_id"]] = min(at, succeeded_at.get(row["job_id"], at))
    for job_id, statuses in finishes.items():
        if statuses.count("success") > 1:
            found.append(
                Violation(
                    "single-success", f"job {job_id}", f"reached success {statuses.count('success')} times"
                )
            )
        elif len(statuses) > 1:
            found.append(Violation("single-end", f"job {job_id}", f"ended {len(statuses)} times: {statuses}"))
    in_workspace: dict[tuple[str, str, str], list[dict[str, Any]]] = defaultdict(list)
    for entry in history.ledger:
        in_workspace[(entry["job"], entry["step"], entry["ws"])].append(entry)
        success = succeeded_at.get(entry["job"])
        if success is not None and entry["at"] > success:
            found.append(
                Violation(
                    "steps-ran-once",
                    f"job {entry['job']} step {entry['step']}",
                    f"ran in {entry['ws']} after the job's success was recorded "
                    f"(t={_t(history, success):.2f})",
                    _t(history, entry["at"]),
                )
            )
    for (job_id, step, _ws), entries in in_workspace.items():
        allowed = int(entries[0].get("max", 1))
        if len(entries) > allowed:
            found.append(
                Violation(
                    "steps-ran-once",
                    f"job {job_id} step {step}",
                    f"ran {len(entries)} times in one workspace (at most {allowed} attempts)",
                    _t(history, entries[-1].get("at")),
                )
            )
    return found


def redispatched_jobs(history: History) -> int:
    """Jobs whose steps ran in more than one workspace: each was taken back before its start was recorded
    (an agent lost, or an ack or a start that did not arrive in time) and ran again elsewhere."""
    workspaces: dict[str, set[str]] = defaultdict(set)
    for entry in history.ledger:
        workspaces[entry["job"]].add(entry["ws"])
    return sum(1 for spaces in workspaces.values() if len(spaces) > 1)


def check_spawns(history: History, state: FinalState) -> list[Violation]:
    """Every spawn record is closed and nothing a scaler started is left running (docs/design/scaler.md §6.1,
    §7)."""
    found = [
        Violation(
            "spawns-closed",
            f"spawn {s['agent_id']}",
            f"record still {s.get('state')!r} on {s.get('node_id')}",
        )
        for s in state.spawns
    ]
    found += [
        Violation("spawns-closed", f"record file {path}", "bare-metal record file left")
        for path in state.spawn_records_left
    ]
    found += [
        Violation(
            "no-leaked-process",
            f"pid {p['pid']}",
            f"still running after the cluster stopped: {p.get('cmdline', '')[:160]} (cwd {p.get('cwd')})",
        )
        for p in state.leaked_processes
    ]
    return found


def check_counters(history: History, state: FinalState) -> list[Violation]:
    """`run_count` matches the runs of each delivery, and the dispatch queue holds exactly the jobs that wait
    for or run on an agent (docs/design/execution.md §3, §5)."""
    found: list[Violation] = []
    runs_per_delivery = Counter(r["delivery_id"] for r in state.runs if r.get("delivery_id"))
    for delivery in state.deliveries:
        if delivery["status"] in DELIVERY_OUTCOMES and delivery["run_count"] != runs_per_delivery.get(
            delivery["id"], 0
        ):
            found.append(
                Violation(
                    "run-count",
                    f"delivery {delivery['id']}",
                    f"run_count {delivery['run_count']} but {runs_per_delivery.get(delivery['id'], 0)} runs",
                )
            )
    jobs = {j["id"]: j for j in state.jobs}
    queued_ids = set()
    for row in state.queue:
        queued_ids.add(row["job_id"])
        job = jobs.get(row["job_id"])
        if job is None or job["status"] in JOB_TERMINAL or job["status"] == "pending":
            found.append(
                Violation(
                    "queue-depth",
                    f"queue row {row['job_id']}",
                    f"row {row['state']!r} for a job that is {job['status'] if job else 'missing'}",
                )
            )
    for job in jobs.values():
        if job["status"] in ("queued", "dispatched") and job["id"] not in queued_ids:
            found.append(Violation("queue-depth", f"job {job['id']}", f"{job['status']} without a queue row"))
    return found


def check_events(history: History, state: FinalState) -> list[Violation]:
    """Every internal event is processed or dead-lettered with a reason (docs/design/events.md §2.3)."""
    found: list[Violation] = []
    for event in state.events:
        if event.get("processed_at") is not None:
            continue
        if event.get("dlq_at") is not None and event.get("dlq_reason"):
            continue
        found.append(
            Violation(
                "event-processed",
                f"event {event['id']} ({event['name']})",
                f"neither processed nor dead-lettered (attempts {event.get('attempts')}, "
                f"last error {event.get('last_error')!r})",
                _t(history, event.get("created_at")),
            )
        )
    return found


def check_logs(history: History, state: FinalState) -> list[Violation]:
    """The log every finished job shows is complete: per step, `seq` from 0 without gaps and byte offsets
    that continue each other; per job, `job_offset` continuous (docs/design/execution.md §9). A job shows
    the log of the attempt whose result counts (`log_attempt`), else its latest attempt's; the other
    attempts' chunks are kept but not shown, so they are not checked."""
    counted = {
        j["id"]: (j["log_attempt"], j.get("log_hop") or 0) if j.get("log_attempt") is not None else None
        for j in state.jobs
        if j["status"] in JOB_TERMINAL
    }
    latest: dict[str, tuple[int, int]] = {}
    for chunk in state.logs:
        if chunk["job_id"] in counted:
            latest[chunk["job_id"]] = max(latest.get(chunk["job_id"], (1, 0)), _attempt_of(chunk))
    per_step: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    per_job: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for chunk in state.logs:
        job_id = chunk["job_id"]
        if job_id in counted and _attempt_of(chunk) == (counted[job_id] or latest[job_id]):
            per_step[(job_id, chunk["step_index"])].append(chunk)
            per_job[job_id].append(chunk)
    found: list[Violation] = []
    for (job_id, step_index), chunks in per_step.items():
        chunks.sort(key=lambda c: c["seq"])
        seqs = [c["seq"] for c in chunks]
        if seqs != list(range(len(seqs))):
            found.append(Violation("log-complete", f"job {job_id} step {step_index}", f"seq {_ranges(seqs)}"))
            continue
        offset = 0
        for chunk in chunks:
            if chunk["byte_offset"] != offset:
                found.append(
                    Violation(
                        "log-complete",
                        f"job {job_id} step {step_index}",
                        f"chunk seq {chunk['seq']} at byte {chunk['byte_offset']}, expected {offset}",
                    )
                )
                break
            offset += chunk["bytes"]
    for job_id, chunks in per_job.items():
        chunks.sort(key=lambda c: c["job_offset"])
        offset = 0
        for chunk in chunks:
            if chunk["job_offset"] != offset:
                found.append(
                    Violation(
                        "log-complete",
                        f"job {job_id}",
                        f"job offset {chunk['job_offset']} where {offset} was expected (step {chunk['step_index']} "
                        f"seq {chunk['seq']})",
                    )
                )
                break
            offset += chunk["bytes"] + len((chunk.get("job_prefix") or "").encode())
    return found


CHECKS: tuple[Check, ...] = (
    check_webhooks,
    check_runs_ended,
    check_held_jobs,
    check_no_double_success,
    check_spawns,
    check_counters,
    check_events,
    check_logs,
)


def check(history: History, state: FinalState, checks: Iterable[Check] = CHECKS) -> list[Violation]:
    """Every violation of every invariant."""
    return [violation for one in checks for violation in one(history, state)]


def render(
    history: History, violations: Sequence[Violation], *, window_s: float = 10.0, limit: int = 25
) -> str:
    """The report of a failed run: the seed, the fault schedule, and per violation the history around it
    (records within `window_s` of its time, at most `limit`), so the run can be replayed and read."""
    lines = [
        f"seed {history.seed}: {len(violations)} violation(s); replay with `python -m chaos --seed {history.seed}`"
    ]
    lines.append("fault schedule:")
    lines += [f"  {_describe_fault(f)}" for f in history.schedule] or ["  (none)"]
    for violation in violations:
        lines.append(f"VIOLATION {violation.line()}")
        if violation.at is None:
            continue
        around = [r for r in history.records if abs(r["t"] - violation.at) <= window_s]
        for record in around[:limit]:
            lines.append(f"    t={record['t']:8.2f} {_describe_record(record)}")
        if len(around) > limit:
            lines.append(f"    … {len(around) - limit} more records in that window")
    return "\n".join(lines)


def _describe_fault(fault: dict[str, Any]) -> str:
    return f"t={fault['at']:.1f}s {fault['kind']} {fault['target']} ({fault['duration']:.1f}s)"


def _describe_record(record: dict[str, Any]) -> str:
    rest = {k: v for k, v in record.items() if k not in ("t", "type")}
    return f"{record['type']} {rest}"


def _t(history: History, epoch: float | None) -> float | None:
    return None if epoch is None else epoch - history.started_at


def _attempt_of(chunk: dict[str, Any]) -> tuple[int, int]:
    """A chunk's (dispatch attempt, offer hop); (1, 0) in a snapshot from before migration 0022."""
    return int(chunk.get("attempt", 1)), int(chunk.get("hop", 0))


def _ranges(values: Sequence[int]) -> str:
    shown = ", ".join(str(v) for v in values[:20])
    return f"[{shown}{', …' if len(values) > 20 else ''}]"
