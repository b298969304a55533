"""Matching: decision time per event for 100 / 1,000 / 10,000 candidates; p99 and growth per 10×.

EVENTS ROUTER (the issue's figure): `conveyor.events.router.route(view, index)` — the pure decision
the internal events router takes for every leased event — over a `RegistrationIndex` of N
registrations, built once as the router's index cache does. Two shapes:
- custom events: registration i listens to `topic.n<i mod N/10>` with a `match` on the payload, so
  each event name has 10 subscribers (the index narrows by name; all 10 match and dispatch);
- completions: every registration has a `workflow_complete` trigger naming one workflow and every
  `__workflow_complete` event matches one of them (the index narrows by the completed workflow's
  name; triggers naming workflows by wildcard would all be candidates, as before the index).

PUSH MATCHING: `conveyor.matching.match_workflows(lock, event, digest=...)` — the indexed decision
ingest/pipeline.py takes for every push, its index cached under the lock's content hash — beside
`match_workflows_reference`, the straightforward matcher it replaced (the baseline, measured in the
same run on the same events). Workflow i listens to pushes on `main` touching `svc<i>/**` (plus
`release/*`); each push changes one file of a random service and `README.md`, so exactly one workflow
matches. Targets: p99 <= 5 ms at 1,000 workflows and <= 20 ms at 10,000. The indexed matcher reuses the
decisions of the workflows a push's files cannot concern per event signature (type, branch, number of
changed files), so a third series shows its worst case: every push to a branch never pushed before and
changing 1-3 files, so no such reuse happens. A fourth shows the indexed decision plus `as_dict()`, the
whole trace the pipeline stores per delivery. A real lock stops at 5 MB (about 4,000 such workflows), so
10,000 is beyond what one repository can hold; the lock is validated by the lock model directly for
the large sizes.

Only the decision is timed (time.perf_counter around one call), with Python's cyclic GC on, as in
the server.
"""

from __future__ import annotations

import itertools
import json
import random
import time
from datetime import UTC, datetime
from typing import Any

from bench.harness import Report, arguments, finish, percentile
from conveyor.events.models import WORKFLOW_COMPLETE
from conveyor.events.registrations import Registration, RegistrationIndex, registered_kinds
from conveyor.events.router import EventView, route
from conveyor.lockfile import Lock, WorkflowEntry, parse_lock
from conveyor.lockfile.reader import MAX_LOCK_BYTES
from conveyor.matching import Event, lock_digest, match_workflows, match_workflows_reference, ref_event

SIZES = (100, 1_000, 10_000)
P99_TARGET_MS = 5.0
GROWTH_TARGET = 10.0


def glob(pattern: str) -> dict[str, Any]:
    return {"kind": "glob", "pattern": pattern, "flags": "", "negate": False}


def workflow_entry(index: int) -> dict[str, Any]:
    """One compiled workflow as `conveyor compile` writes it (push on main/release with a path filter)."""
    name = f"svc{index}"
    source = {"file": f".conveyor/workflows/{name}.py", "qualname": "ci", "line": 3}
    return {
        "name": name,
        "description": None,
        "source": source,
        "content_hash": "sha256:" + f"{index:064x}",
        "hashed_files": [source["file"]],
        "triggers": [
            {"type": "push", "branches": [glob("main"), glob("release/*")], "paths": [glob(f"{name}/**")]}
        ],
        "rules": [],
        "concurrency": None,
        "timeout_ms": None,
        "hooks_runs_on": None,
        "hooks": {},
        "jobs": [
            {
                "name": "build",
                "description": None,
                "source": {**source, "qualname": "build", "line": 4},
                "runs_on": {"labels": [{"kind": "exact", "pattern": "linux", "flags": ""}], "exclude": []},
                "needs": [],
                "matrix": None,
                "max_parallel": None,
                "fail_fast": False,
                "timeout_ms": None,
                "grace_period_ms": 10000,
                "env": {},
                "environment": None,
                "concurrency_group": None,
                "checkout": True,
                "rules": [],
                "hooks": {},
                "steps": [
                    {
                        "name": "build",
                        "source": {**source, "qualname": "build", "line": 4},
                        "timeout_ms": None,
                        "continue_on_error": False,
                        "outputs_schema": None,
                        "rules": [],
                        "retry": None,
                    }
                ],
            }
        ],
    }


def lock_of(count: int) -> Lock:
    """A validated lock with `count` workflows (see `raw_lock_of`)."""
    return raw_lock_of(count)[0]


def raw_lock_of(count: int) -> tuple[Lock, bytes]:
    """A validated lock with `count` workflows and the bytes it was read from.

    Locks over 5 MB (about 4,000 such workflows) are refused by `parse_lock`, so the large sizes are
    validated through the same model directly; the smaller ones go through `parse_lock` as ingest does.
    """
    document = {"schema_version": 1, "workflows": [workflow_entry(i) for i in range(count)]}
    raw = json.dumps(document).encode()
    if len(raw) <= MAX_LOCK_BYTES:
        return parse_lock(raw), raw
    return Lock.model_validate(document), raw


def push_to(service: int) -> Event:
    """A push to main changing one file of `service`."""
    return ref_event(
        repo="bench/monorepo",
        ref="refs/heads/main",
        sha="a" * 40,
        before="b" * 40,
        source="git",
        changed_files=[f"svc{service}/src/module.py", "README.md"],
    )


def push_to_new_branch(service: int, serial: int, rng: random.Random) -> Event:
    """A push to a branch never pushed before (`release/<serial>`), changing 1-3 files."""
    files = [f"svc{service}/src/module.py", "README.md", "docs/index.md"][: rng.randint(1, 3)]
    return ref_event(
        repo="bench/monorepo",
        ref=f"refs/heads/release/{serial}",
        sha="a" * 40,
        before="b" * 40,
        source="git",
        changed_files=files,
    )


PUSH_SERIES = ("reference", "indexed", "indexed-new-branch", "indexed+as_dict")


def time_push_matching(count: int, samples: int, rng: random.Random) -> dict[str, list[float]]:
    """Milliseconds per push decision over `count` workflows, per series of `PUSH_SERIES`.

    The series are interleaved event by event so that the machine's load falls on all of them alike.
    """
    lock, raw = raw_lock_of(count)
    digest = lock_digest(raw)
    services = [rng.randrange(count) for _ in range(samples)]
    events = [push_to(service) for service in services]
    fresh = [push_to_new_branch(service, serial, rng) for serial, service in enumerate(services)]
    # Warm-up: the reference's compiled lock and the index are built once per lock, outside the timing.
    match_workflows_reference(lock, events[0])
    match_workflows(lock, events[0], digest=digest)
    timings: dict[str, list[float]] = {name: [] for name in PUSH_SERIES}
    for event, new_branch in zip(events, fresh, strict=True):
        for name in PUSH_SERIES:
            chosen = new_branch if name == "indexed-new-branch" else event
            started = time.perf_counter()
            if name == "reference":
                decision = match_workflows_reference(lock, chosen)
            else:
                decision = match_workflows(lock, chosen, digest=digest)
                if name == "indexed+as_dict":
                    decision.as_dict()
            timings[name].append((time.perf_counter() - started) * 1000)
            if len(decision.matched) != 1:
                raise RuntimeError(f"{name}: expected exactly one match, got {decision.matched}")
    return timings


PUSH_TARGETS_MS = {1_000: 5.0, 10_000: 20.0}


def add_push_series(report: Report, timings_by_size: dict[int, dict[str, list[float]]]) -> None:
    """p99 of each push series per size; the indexed series against its targets, beside the baseline."""
    labels = {
        "reference": "push matcher, reference (baseline, same run)",
        "indexed": "push matcher, indexed",
        "indexed-new-branch": "push matcher, indexed, every push a new branch",
        "indexed+as_dict": "push matcher, indexed + trace as_dict",
    }
    for name in PUSH_SERIES:
        for count, series in timings_by_size.items():
            timings = series[name]
            p99 = percentile(timings, 99)
            target = PUSH_TARGETS_MS.get(count) if name == "indexed" else None
            note = f"p50 {percentile(timings, 50):.3f} ms, {len(timings)} decisions"
            if name != "reference":
                note += f"; baseline p99 {percentile(series['reference'], 99):.1f} ms"
            report.add(
                f"matching ({labels[name]}) p99 at {count:,}",
                p99,
                "ms",
                target=f"<= {target:.0f} ms" if target is not None else "",
                met=(p99 <= target) if target is not None else None,
                note=note,
            )


CUSTOM_TRIGGER: dict[str, Any] = {
    "type": "event",
    "name": "",
    "match": {"env": {"in": ["prod"]}},
    "not": {},
    "from_repos": None,
}
COMPLETION_TRIGGER: dict[str, Any] = {
    "type": "workflow_complete",
    "workflow": [glob("")],
    "status": ["success"],
    "from_repos": [glob("bench/*")],
}
FANOUT = 10


def registrations(count: int, shape: str) -> RegistrationIndex:
    """An index of `count` registrations of one org (see the module docstring for the shapes)."""
    now = datetime.now(UTC)
    found = []
    for i in range(count):
        document = workflow_entry(i)
        if shape == "custom":
            trigger = {**CUSTOM_TRIGGER, "name": f"topic.n{i % max(1, count // FANOUT)}"}
        else:
            trigger = {**COMPLETION_TRIGGER, "workflow": [glob(f"wf{i}")]}
        document["triggers"] = [trigger]
        entry = WorkflowEntry.model_validate(document)
        found.append(
            Registration(
                id=f"reg-{i:06d}",
                org_id="default",
                routing_key="git:bench",
                repo=f"bench/app{i}",
                workflow_name=entry.name,
                entry=entry,
                kinds=registered_kinds(entry),
                commit_sha="c" * 40,
                default_branch="main",
                disabled=False,
                updated_at=now,
            )
        )
    return RegistrationIndex.build(found)


def event_for(count: int, shape: str, rng: random.Random, serial: int) -> EventView:
    """A custom event to a random topic, or a completion of a random workflow."""
    if shape == "custom":
        topic = rng.randrange(max(1, count // FANOUT))
        return EventView(
            id=f"ev-{serial}",
            name=f"topic.n{topic}",
            origin="admin",
            org_id="default",
            payload={"env": "prod"},
        )
    workflow = rng.randrange(count)
    return EventView(
        id=f"ev-{serial}",
        name=WORKFLOW_COMPLETE,
        origin="system",
        org_id="default",
        payload={"status": "success", "workflow_name": f"wf{workflow}", "repo": "bench/lib", "run_id": "r"},
        source_routing_key="git:bench",
        source_repo="bench/lib",
    )


def time_routing(count: int, shape: str, samples: int, rng: random.Random) -> list[float]:
    """Milliseconds per `route` decision over `count` registrations."""
    index = registrations(count, shape)
    views = [event_for(count, shape, rng, n) for n in range(samples)]
    route(views[0], index)  # warm-up
    expected = FANOUT if shape == "custom" else 1
    timings = []
    for view in views:
        started = time.perf_counter()
        decision = route(view, index)
        timings.append((time.perf_counter() - started) * 1000)
        if decision.outcome != "matched" or len(decision.dispatch) != min(expected, count):
            raise RuntimeError(
                f"{shape}: expected {expected} dispatches, got {decision.outcome} {decision.dispatch}"
            )
    return timings


def add_series(report: Report, label: str, timings_by_size: dict[int, list[float]]) -> None:
    """p99 per size (target at the largest) and the worst p99 growth per 10×."""
    p99s = {n: percentile(t, 99) for n, t in timings_by_size.items()}
    p50s = {n: percentile(t, 50) for n, t in timings_by_size.items()}
    for count, timings in timings_by_size.items():
        largest = count == SIZES[-1]
        report.add(
            f"matching ({label}) p99 at {count:,}",
            p99s[count],
            "ms",
            target=f"<= {P99_TARGET_MS:.0f} ms" if largest else "",
            met=(p99s[count] <= P99_TARGET_MS) if largest else None,
            note=f"p50 {p50s[count]:.3f} ms, {len(timings)} decisions",
        )
    growth = max(p99s[b] / p99s[a] for a, b in itertools.pairwise(SIZES))
    report.add(
        f"matching ({label}) p99 growth per 10x",
        growth,
        "x",
        target=f"<= {GROWTH_TARGET:.0f}x",
        met=growth <= GROWTH_TARGET,
        note="worst of 100->1k and 1k->10k; p50 growth "
        + ", ".join(f"{p50s[b] / p50s[a]:.1f}x" for a, b in itertools.pairwise(SIZES)),
    )


def main() -> None:
    parser = arguments(__doc__ or "", dialects=False)
    parser.add_argument("--samples", type=int, help="decisions timed per size (default 200, --quick 20)")
    parser.add_argument("--push-only", action="store_true", help="only the push matcher series")
    args = parser.parse_args()
    samples = args.samples or (20 if args.quick else 200)
    rng = random.Random(11)
    report = Report("matching")
    shapes = (
        ("custom", "events router, custom event, 10 subscribers"),
        ("completion", "events router, workflow_complete, by workflow name"),
    )
    for shape, label in () if args.push_only else shapes:
        series = {}
        for count in SIZES:
            print(f"route decisions ({shape}) over {count:,} registrations: {samples}", flush=True)
            series[count] = time_routing(count, shape, samples, rng)
        add_series(report, label, series)
    push_series = {}
    for count in SIZES:
        print(f"push matching over {count:,} workflows: {samples} decisions per series", flush=True)
        push_series[count] = time_push_matching(count, samples, rng)
    add_push_series(report, push_series)
    finish(report, args)


if __name__ == "__main__":
    main()
