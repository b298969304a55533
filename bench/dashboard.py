"""Dashboard pages: the runs page's and a run page's time with 100,000 runs against the same with 500.

A real `conveyor server` on a fresh database of each dialect; a session signed in through
`POST /ui/sign-in` as a browser would. Runs are bulk-inserted (10 workflows, 2 % failed) in two
steps: first 500 rows, when the baseline is measured, then up to --runs (100,000; --quick 5,000),
when the same pages are measured again in the same run. Pages timed (wall clock of the GET, p50 of
--samples): the first page of `/ui/runs`, a deep page reached through the "Older" cursor (the 20th;
the 2nd at the baseline), the first page filtered by one workflow (10 %) and by status `failed` (2 %,
each row's failure reason read from its failed job), and the run page of a failed four-job diamond
(a → b, a → c, b and c → d: its job graph, steps and decision trace). The figure is the ratio large /
baseline: keyset pagination on `(created_at, id)` and reads by run id should keep it near 1. The
status-filtered page is the exception by construction: at the baseline it holds the 10 failed runs of 500,
at 100,000 a full page of 50 (each reading its failure reason in the same one query), so its ratio also
counts rendering five times the rows.
"""

from __future__ import annotations

import re
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import insert

from bench.harness import Report, arguments, finish, fresh_database, percentile, running_server, workdir
from bench.harness import selected_dialects as chosen_dialects
from conveyor.db.engine import create_sync_engine
from conveyor.db.tables import DEFAULT_ORG, job_needs, jobs, runs, steps
from conveyor.model.ids import new_id, utc_now

BASELINE_RUNS = 500
RATIO_TARGET = 2.0
DEEP_PAGE = 20  # or the last page of a smaller --runs; the baseline's 100 runs have 2 pages
PAGE_ROWS = 50
OLDER_LINK = re.compile(r'<a href="(/ui/runs\?[^"]*cursor=[^"]+)">Older')


def seed(url: str, start: int, count: int) -> None:
    """`count` finished runs, numbered from `start`, created a second apart going back in time."""
    engine = create_sync_engine(url)
    now = utc_now()
    try:
        with engine.begin() as conn:
            batch: list[dict[str, Any]] = []
            for n in range(start, start + count):
                batch.append(
                    {
                        "id": new_id(),
                        "org_id": DEFAULT_ORG,
                        "number": n,
                        "workflow": f"wf{n % 10}",
                        "repo": "acme/app",
                        "ref": "refs/heads/main",
                        "sha": f"{n:040x}",
                        "routing_key": "local:app",
                        "event": {},
                        "status": "failed" if n % 50 == 0 else "success",
                        "trigger_trace": TRACE,
                        "created_at": now - timedelta(seconds=n),
                        "started_at": now - timedelta(seconds=n),
                        "finished_at": now - timedelta(seconds=n) + timedelta(milliseconds=900),
                    }
                )
                if len(batch) == 5_000:
                    conn.execute(insert(runs), batch)
                    batch = []
            if batch:
                conn.execute(insert(runs), batch)
            failed_jobs = [
                _job(run["id"], "test", "failed", run["finished_at"])
                for run in _failed_runs(conn, start, count)
            ]
            if failed_jobs:
                conn.execute(insert(jobs), failed_jobs)
        if engine.dialect.name == "postgresql":
            # Autovacuum analyses a table that grew this much, but not before the bench measures: without
            # statistics the planner sorts every run for a filtered page (56 ms for 1.7 ms at 100,000 runs).
            with engine.connect() as conn:
                conn.execution_options(isolation_level="AUTOCOMMIT").exec_driver_sql("ANALYZE runs, jobs")
    finally:
        engine.dispose()


TRACE = {
    "event": {"type": "push", "branch": "main", "sha": "0" * 40, "changed_files": ["app.py"]},
    "workflow": {
        "workflow": "wf0",
        "matched": True,
        "matched_trigger": 0,
        "triggers": [
            {
                "index": 0,
                "type": "push",
                "matched": True,
                "checks": [{"filter": "branches", "ok": True, "detail": "'main' matches glob 'main'"}],
            }
        ],
    },
}


def _failed_runs(conn: Any, start: int, count: int) -> list[Any]:
    query = runs.select().where(runs.c.status == "failed", runs.c.number.between(start, start + count - 1))
    return list(conn.execute(query).mappings())


def _job(run_id: str, name: str, status: str, at: Any) -> dict[str, Any]:
    return {
        "id": new_id(),
        "run_id": run_id,
        "org_id": DEFAULT_ORG,
        "name": name,
        "display_name": name,
        "status": status,
        "reason": "exit code 1" if status == "failed" else None,
        "runs_on": {"labels": [], "exclude": []},
        "created_at": at,
        "started_at": at,
        "finished_at": at,
    }


def seed_diamond(url: str) -> str:
    """A failed run whose four jobs form a diamond, each with two steps; its id."""
    engine = create_sync_engine(url)
    now = utc_now()
    run_id = new_id()
    try:
        with engine.begin() as conn:
            conn.execute(
                insert(runs).values(
                    id=run_id,
                    org_id=DEFAULT_ORG,
                    number=0,
                    workflow="diamond",
                    repo="acme/app",
                    ref="refs/heads/main",
                    sha="d" * 40,
                    routing_key="local:app",
                    event={},
                    trigger_trace=TRACE,
                    status="failed",
                    created_at=now - timedelta(days=1),
                    started_at=now - timedelta(days=1),
                    finished_at=now - timedelta(days=1) + timedelta(seconds=42),
                )
            )
            for name, status, needs in (
                ("a", "success", ()),
                ("b", "success", ("a",)),
                ("c", "failed", ("a",)),
                ("d", "skipped", ("b", "c")),
            ):
                job = _job(run_id, name, status, now - timedelta(days=1))
                conn.execute(insert(jobs), [job])
                for need in needs:
                    conn.execute(
                        insert(job_needs),
                        [{"job_id": job["id"], "upstream_name": need, "run_on": ["success"]}],
                    )
                conn.execute(
                    insert(steps),
                    [
                        {
                            "job_id": job["id"],
                            "step_index": 0,
                            "name": "setup",
                            "kind": "setup",
                            "status": "success",
                        },
                        {
                            "job_id": job["id"],
                            "step_index": 1,
                            "name": name,
                            "kind": "step",
                            "status": status,
                        },
                    ],
                )
    finally:
        engine.dispose()
    return run_id


def timed_get(client: httpx.Client, path: str, samples: int) -> tuple[float, str]:
    """p50 in ms of `samples` GETs of `path`, and the last body."""
    times: list[float] = []
    body = ""
    for _ in range(samples):
        began = time.perf_counter()
        answer = client.get(path)
        times.append((time.perf_counter() - began) * 1000)
        if answer.status_code != 200:
            raise RuntimeError(f"GET {path}: {answer.status_code} {answer.text[:300]}")
        body = answer.text
    return percentile(times, 50), body


def deep_page(client: httpx.Client, pages: int) -> str:
    """The path of the `pages`-th page, following the Older links."""
    path = "/ui/runs"
    for _ in range(pages - 1):
        found = OLDER_LINK.search(client.get(path).text)
        if not found:
            raise RuntimeError(f"no Older link after {path}")
        path = found.group(1).replace("&amp;", "&")
    return path


def measure(client: httpx.Client, samples: int, depth: int, diamond: str) -> dict[str, float]:
    """The pages' p50 (the deep page is the `depth`-th; `diamond` is the run page's run)."""
    first, _ = timed_get(client, "/ui/runs", samples)
    deep, _ = timed_get(client, deep_page(client, depth), samples)
    by_workflow, _ = timed_get(client, "/ui/runs?workflow=wf3", samples)
    by_status, body = timed_get(client, "/ui/runs?status=failed", samples)
    if "test: exit code 1" not in body:
        raise RuntimeError("the failed runs' page shows no failure reason")
    run_page, body = timed_get(client, f"/ui/runs/{diamond}", samples)
    if body.count('class="gedge"') != 4:
        raise RuntimeError("the run page does not draw the diamond's four arrows")
    return {
        "runs page, first page": first,
        "runs page, deep page": deep,
        "runs page, filtered by workflow": by_workflow,
        "runs page, filtered by status (2 % failed)": by_status,
        "run page, a four-job diamond": run_page,
    }


def main() -> None:
    parser = arguments(__doc__ or "")
    parser.add_argument("--runs", type=int, default=None, help="runs in the large database (default 100,000)")
    parser.add_argument("--samples", type=int, default=None, help="GETs per page (default 30; --quick 5)")
    args = parser.parse_args()
    total = args.runs or (5_000 if args.quick else 100_000)
    samples = args.samples or (5 if args.quick else 30)
    report = Report("dashboard")
    print(
        f"== dashboard: runs and run page, {BASELINE_RUNS} vs {total:,} runs, p50 of {samples} GETs",
        flush=True,
    )
    with workdir("conveyor-bench-dashboard-") as base:
        for dialect in chosen_dialects(args):
            with fresh_database(dialect, base, migrate=True) as url:
                seed(url, 1, BASELINE_RUNS)
                diamond = seed_diamond(url)
                home: Path = base / f"home-{dialect}"
                with (
                    running_server(home, url) as server,
                    httpx.Client(base_url=server.url, timeout=60) as client,
                ):
                    signed = client.post("/ui/sign-in", data={"token": server.token, "next": "/ui/runs"})
                    if signed.status_code != 303:
                        raise RuntimeError(f"sign-in: {signed.status_code} {signed.text[:300]}")
                    timed_get(client, "/ui/runs", 3)  # warm the server's first-request paths
                    small = measure(client, samples, 2, diamond)
                    seed(url, BASELINE_RUNS + 1, total - BASELINE_RUNS)
                    timed_get(client, "/ui/runs", 3)
                    large = measure(client, samples, max(2, min(DEEP_PAGE, total // PAGE_ROWS)), diamond)
                for page, baseline in small.items():
                    label = f"dashboard {dialect}: {page}"
                    report.add(f"{label} p50 at {BASELINE_RUNS} runs", baseline, "ms")
                    report.add(f"{label} p50 at {total:,} runs", large[page], "ms")
                    ratio = large[page] / baseline
                    report.add(
                        f"{label}: {total:,} / {BASELINE_RUNS}",
                        ratio,
                        "x",
                        target=f"<= {RATIO_TARGET:g}",
                        met=ratio <= RATIO_TARGET,
                    )
    finish(report, args)


if __name__ == "__main__":
    main()
